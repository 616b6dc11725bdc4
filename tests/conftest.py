"""Shared test fixtures: the shared models/data folder ($SPECJAX_SHARED, default ../shared)."""

import os
import sys
from pathlib import Path

import pytest

from specjax.paths import shared_dir as _shared_dir

# The repository's kernels/ directory is installed as specjax.kernels (pyproject's package-dir).
# `python -m pytest` run from the repository puts its root first on sys.path, and there
# kernels/ would shadow the `kernels` package that transformers (>= 5.25, a dependency of it)
# imports: the reference tests then fail with "cannot import name 'CUDAProperties' from
# 'kernels'". specjax is installed, so nothing needs the root on the path.
_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != _ROOT]

# The default run is dominated by compiling thousands of small programs, not by running them:
# XLA's CPU backend at optimization level 0 compiles them ~1.5x faster (test_step.py +
# test_verify.py: 87 s against 135 s on a 2-core AMD EPYC), at the cost of slower execution in
# the few sampling-heavy tests. JAX reads XLA_FLAGS when it creates its CPU client (at the
# first computation, not at import); a level given in XLA_FLAGS by the caller wins.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()

# The command line turns on JAX's persistent compilation cache (specjax.compile_cache); tests
# that call it in process would leave it on for the rest of their worker. tests/
# test_compile_cache.py turns it on where it is tested.
os.environ.setdefault("SPECJAX_COMPILATION_CACHE", "0")


# Test files whose few tests run longest (sampling 60,000 rows each): first in the collection,
# so that under pytest-xdist (pyproject.toml) they start at once and the other worker takes the
# many short files meanwhile, instead of both finishing on them after everything else.
LONGEST_FILES = ("test_lossless_e2e.py", "test_feature_drafter.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in LONGEST_FILES)  # stable: order kept


def _compile_optimized(monkeypatch, module, name: str, static_argnames) -> None:
    """Replace the jitted loop module.name, for one test, by the same function compiled at XLA's
    optimization level 3 (the rest of the run compiles at 0, above)."""
    import jax

    optimized = jax.jit(
        getattr(module, name).__wrapped__,
        static_argnames=static_argnames,
        compiler_options={"xla_backend_optimization_level": 3},
    )
    monkeypatch.setattr(module, name, optimized)


@pytest.fixture
def optimized_loop(monkeypatch):
    """The speculative loop compiled at optimization level 3 in this test: the sampling tests
    execute one loop over tens of thousands of rows, which runs ~2x faster so
    (test_feature_drafter's mdc distribution test alone, at 120,000 rows: 127 s at level 0, 61 s
    at level 3 on a 2-core AMD EPYC)."""
    from specjax import speculative

    _compile_optimized(
        monkeypatch, speculative, "_speculative", speculative.SPECULATIVE_STATIC_ARGS
    )


@pytest.fixture
def optimized_hispec_loop(monkeypatch):
    """HiSpec's loop (specjax.hispec._hispec) compiled at optimization level 3 in this test, for
    the same reason as optimized_loop (its sampling test: 117 s at level 0, 30 s at level 3)."""
    from specjax import hispec

    _compile_optimized(monkeypatch, hispec, "_hispec", hispec.HISPEC_STATIC_ARGS)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    path = _shared_dir()
    if not path.exists():
        pytest.skip(f"shared folder {path} not found (set SPECJAX_SHARED)")
    return path


def require(path: Path) -> Path:
    """Skip the calling test when a shared file is missing."""
    if not Path(path).exists():
        pytest.skip(f"{path} missing")
    return Path(path)


@pytest.fixture(scope="session", autouse=True)
def private_cost_cache(tmp_path_factory):
    """Measured costs and calibrated profiles (SpecConfig.auto()) go to a folder of this test
    session: tests never read or fill the user's cache."""
    old = os.environ.get("SPECJAX_CACHE")
    os.environ["SPECJAX_CACHE"] = str(tmp_path_factory.mktemp("specjax-cache"))
    yield
    if old is None:
        os.environ.pop("SPECJAX_CACHE", None)
    else:
        os.environ["SPECJAX_CACHE"] = old


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """Drop JAX's compiled programs after each test module. Why: the default run compiles
    thousands of programs in one process, and each keeps memory mappings alive; near the end
    of the run XLA's CPU compiler crashed (segmentation fault) while compiling, which is what
    running out of mappings (vm.max_map_count, 65530 here) looks like."""
    yield
    import jax

    jax.clear_caches()
