"""Suites: a target checkpoint with its default datasets and methods (`Suite`), `run_suites`
that loads and benchmarks each in turn, and `load_suites`, which reads the repository's default
suites from experiments/bench_suites.py (the checkpoint lists are not part of the library)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from specjax.bench.harness import Row, bench
from specjax.bench.methods import Method
from specjax.bench.prompts import Dataset
from specjax.bench.runner import Target
from specjax.datasets import resolve_path
from specjax.memory_maps import drop_compiled_programs


@dataclasses.dataclass(frozen=True, kw_only=True)
class Suite:
    """A target with its default datasets and methods. kind: the datasets it takes ("chat":
    Spec-Bench questions through the chat template; "story": TinyStories prefixes). stop_at_eos:
    rows stop at the tokenizer's EOS (else every row generates max_new_tokens)."""

    name: str
    model: str
    kind: str
    datasets: tuple[Dataset, ...]
    methods: tuple[Method, ...]
    stop_at_eos: bool = True

    def load(self) -> tuple[Target, object]:
        import specjax

        loaded = specjax.load(resolve_path(self.model, "models"))
        eos = loaded.tokenizer.eos_id if (self.stop_at_eos and loaded.tokenizer) else None
        return Target(self.name, loaded.model, loaded.tokenizer, eos), loaded


def run_suites(
    suites: Sequence[Suite],
    *,
    temperatures: Sequence[float] = (0.0, 1.0),
    reps: int = 3,
    hf: bool = True,
    log: Callable[[str], None] = print,
    costs: dict | None = None,
) -> tuple[list[Row], list[str]]:
    """Run each suite; returns (rows, one description line per target and prompt set). When
    `costs` is a dict it receives each target's measured t_verify(N) (specjax.autotune, batch 1:
    the cost curve SpecConfig.auto() chose from; read from the cache when measured before)."""
    rows, described = [], []
    for suite in suites:
        t0 = time.perf_counter()
        target, _ = suite.load()
        prompt_sets = [d.load(target.tokenizer) for d in suite.datasets]
        stop = f"stops at EOS (id {target.eos_id})" if target.eos_id is not None else "no EOS stop"
        for ps in prompt_sets:
            described.append(
                f"{suite.name} / {ps.name}: {ps.description}, {ps.max_new_tokens} new tokens, "
                f"{stop}"
            )
        log(f"[bench] {suite.name}: loaded in {time.perf_counter() - t0:.1f}s")
        rows += bench(
            target, prompt_sets, suite.methods, temperatures=temperatures, reps=reps, hf=hf,
            log=log, calibration_kind=suite.kind,
        )  # fmt: skip
        if costs is not None:
            from specjax.autotune import verify_costs
            from specjax.choice import call_context, cost_context, verify_grid
            from specjax.config import AutoSpecConfig
            from specjax.decode import PROMPT_BUCKET

            # The context of a typical call of the first set (what the default call measured
            # its costs at, see call_context), from its median prompt.
            first = prompt_sets[0]
            lengths = sorted(len(p.ids) for p in first.prompts)
            width = -(-lengths[len(lengths) // 2] // PROMPT_BUCKET) * PROMPT_BUCKET
            typical = call_context(target.model, width, first.max_new_tokens)
            context = cost_context(target.model, AutoSpecConfig(), typical)
            grid = verify_grid(1, AutoSpecConfig().max_nodes)  # the default call's node counts
            costs[f"{suite.name} (context {context})"] = verify_costs(
                target.model, context=context, nodes=grid, skip_stairs=True
            )
        # Many compiled programs per suite: the next suite shares none of them, and they hold
        # memory and the process's memory mappings (specjax.memory_maps).
        drop_compiled_programs()
    return rows, described


def suites_file() -> Path:
    """experiments/bench_suites.py of the repository checkout (it may be absent)."""
    from specjax.paths import repo_dir

    return repo_dir() / "experiments" / "bench_suites.py"


def load_suites(path: str | Path | None = None) -> dict[str, Suite]:
    """The `SUITES` dict (target name -> Suite) of a suites file, by default the repository's
    experiments/bench_suites.py; empty when that file does not exist (an installed package)."""
    path = Path(path) if path is not None else suites_file()
    if not path.is_file():
        return {}
    spec = importlib.util.spec_from_file_location("_specjax_bench_suites", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # registered first, as an import would (dataclasses need it)
    spec.loader.exec_module(module)
    suites = getattr(module, "SUITES", None)
    if not isinstance(suites, dict):
        raise ValueError(f"{path}: expected a SUITES dict of target name -> Suite")
    return dict(suites)
