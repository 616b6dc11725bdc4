"""Shared test fixtures: the shared models/data folder ($SPECJAX_SHARED, default ../shared)."""

from pathlib import Path

import pytest

from specjax.paths import shared_dir as _shared_dir


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
    import os

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
