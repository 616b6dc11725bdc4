"""The benchmark's command line, shared by `specjax bench` and experiments/bench.py: the options
(`add_arguments`), the suites they select (`suites_from_args`), and `run_from_args` / `main`,
which run them and write the markdown, plots and json.

Targets are the names of the suites passed in (experiments/bench.py passes
experiments/bench_suites.py's; `specjax bench` loads that file from the repository checkout
when it exists) or model checkpoints, which then need --methods and --datasets/--prompts."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from specjax.bench.hf_peer import set_torch_threads
from specjax.bench.methods import checkpoint_label, parse_method
from specjax.bench.prompts import Dataset
from specjax.bench.report import header_settings, write_json, write_markdown, write_plots
from specjax.bench.suites import Suite, load_suites, run_suites
from specjax.benchmark import device_header
from specjax.datasets import SPEC_BENCH_FILES, resolve_path

DESCRIPTION = (
    "Spec-Bench-style benchmark harness: methods x datasets x temperatures, side by side with "
    "specjax autoregressive decoding and the Hugging Face transformers peer."
)
# Prompts and new tokens per dataset for a model checkpoint named as a target (suites set their
# own).
DEFAULT_N_PROMPTS = 8
DEFAULT_MAX_NEW_TOKENS = 64


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_arguments(
    parser: argparse.ArgumentParser,
    default_out: str | Path,
    suites: Mapping[str, Suite] | None = None,
) -> None:
    """The benchmark's options. suites: the named targets, for the help text (None: the
    repository's experiments/bench_suites.py, read when the command runs)."""
    known = ", ".join(suites) if suites is not None else "the suites of experiments/bench_suites.py"
    parser.add_argument(
        "--targets",
        default=None,
        help=f"comma-separated targets (default: all of {known}); a model checkpoint instead "
        "of a suite name needs --methods and --datasets or --prompts",
    )
    parser.add_argument(
        "--datasets",
        default=None,
        help="comma-separated datasets: tinystories for story targets; "
        f"{', '.join(SPEC_BENCH_FILES)} or a .jsonl path for chat targets (default: each "
        "target's own)",
    )
    parser.add_argument(
        "--prompts",
        nargs="+",
        default=(),
        metavar="FILE",
        help="Spec-Bench jsonl files (question_id, category, turns) to run on the chat targets",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        metavar="SPEC",
        help="methods for every selected target instead of its defaults: ar | hf | hf-pld[:K] | "
        "hf-assisted:CKPT | DRAFTER[@N,DEPTH,TOPK[@RULE]] with DRAFTER self:K or a checkpoint",
    )
    parser.add_argument("--n-prompts", type=int, default=None, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--temperatures", default="0,1", help="comma-separated (default 0,1)")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (>= 1)")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers peer")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--out",
        default=str(default_out),
        help="results markdown; plots and json are written next to it (default: %(default)s)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2 prompts x 8 tokens, 1 repetition, written to <out>_quick.*",
    )
    parser.add_argument(
        "--device-info", action="store_true", help="print the results header and exit"
    )


def _checkpoint_suite(
    name: str,
    suites: Mapping[str, Suite],
    requested: Sequence[str],
    methods: tuple | None,
    n: int | None,
    new: int | None,
) -> Suite:
    """A suite for a target that names a model checkpoint rather than a suite."""
    try:
        resolve_path(name, "models")
    except FileNotFoundError:
        raise ValueError(
            f"unknown target(s) {[name]}: choose from {list(suites)} or name a model checkpoint"
        ) from None
    if methods is None or not requested:
        raise ValueError(
            f"target {name!r} is a model checkpoint, not one of the suites {list(suites)}: "
            "name its --methods and --datasets (or --prompts)"
        )
    datasets = tuple(
        Dataset.named(d, n or DEFAULT_N_PROMPTS, new or DEFAULT_MAX_NEW_TOKENS) for d in requested
    )
    return Suite(
        name=checkpoint_label(name),
        model=name,
        kind=datasets[0].kind,
        datasets=datasets,
        methods=methods,
    )


def suites_from_args(args, suites: Mapping[str, Suite]) -> list[Suite]:
    """The given suites, narrowed and overridden by the command-line options (targets that are
    model checkpoints get a suite of their own from --methods and --datasets/--prompts)."""
    names = _csv(args.targets) if args.targets else list(suites)
    quick_n, quick_new = (2, 8) if args.quick else (None, None)
    requested = _csv(args.datasets) if args.datasets else []
    requested += [str(p) for p in args.prompts]
    methods = tuple(parse_method(s) for s in args.methods) if args.methods else None
    n = args.n_prompts or quick_n or None
    new = args.max_new_tokens or quick_new or None
    selected = []
    for name in names:
        if name not in suites:
            selected.append(_checkpoint_suite(name, suites, requested, methods, n, new))
            continue
        suite = suites[name]
        d0 = suite.datasets[0]
        datasets = [
            Dataset.named(d, n or d0.n_prompts, new or d0.max_new_tokens) for d in requested
        ]
        datasets = [d for d in datasets if d.kind == suite.kind]
        if not datasets:  # none of this target's kind named: keep its defaults
            datasets = [
                dataclasses.replace(
                    d, n_prompts=n or d.n_prompts, max_new_tokens=new or d.max_new_tokens
                )
                for d in suite.datasets
            ]
        selected.append(
            dataclasses.replace(suite, datasets=tuple(datasets), methods=methods or suite.methods)
        )
    return selected


def main(
    argv: Sequence[str] | None = None,
    *,
    default_out: str | Path,
    prog: str,
    suites: Mapping[str, Suite] | None = None,
) -> int:
    """Parse argv and run. suites: target name -> Suite (None: the repository's
    experiments/bench_suites.py when present)."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser, default_out, suites)
    args = parser.parse_args(argv)
    return run_from_args(
        args,
        command=f"{prog} " + " ".join(sys.argv[1:] if argv is None else argv),
        suites=suites,
    )


def run_from_args(args, *, command: str, suites: Mapping[str, Suite] | None = None) -> int:
    """Run the benchmark the options describe and write the markdown, plots and json.
    suites: as for `main` (None: `load_suites()`, the repository's default suites if any)."""
    if args.torch_threads:
        set_torch_threads(args.torch_threads)
    if suites is None:
        suites = load_suites()
    selected = suites_from_args(args, suites)
    if not selected and not args.device_info:
        raise ValueError(
            "no suites to run (experiments/bench_suites.py not found): name model checkpoints "
            "with --targets, with --methods and --datasets or --prompts"
        )
    temperatures = [float(t) for t in _csv(args.temperatures)]
    reps = 1 if args.quick else args.reps
    hf = not args.no_hf
    settings = header_settings(
        selected, temperatures=temperatures, reps=reps, hf=hf, command=command
    )
    if args.device_info:
        print(device_header(**settings))
        return 0
    out = Path(args.out)
    if args.quick:
        out = out.with_name(f"{out.stem}_quick{out.suffix}")
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    costs: dict = {}
    rows, described = run_suites(selected, temperatures=temperatures, reps=reps, hf=hf, costs=costs)
    settings = {**settings, "prompts": "; ".join(described)}
    settings["wall time"] = f"{(time.perf_counter() - t0) / 60:.1f} min for the whole run"
    header = device_header(**settings)
    write_markdown(rows, header, out, costs=costs)
    plots = write_plots(rows, out.with_suffix(""), costs=costs)
    write_json(rows, {"header": header, **settings}, out.with_suffix(".json"))
    print(out.read_text())
    print(f"[bench] wrote {out}, {out.with_suffix('.json')}" + "".join(f", {p}" for p in plots))
    return 0
