"""Drafter comparison: self-drafting, the EAGLE-style drafter and the hidden-state (mdc) drafter at
several tree budgets, tau and wall-clock speedup over autoregressive decoding in the same process,
plus the draft-reuse ablation of the hidden-state drafter. Writes experiments/results/drafters.md,
drafters.json and drafters_tau_budget.png (tau vs tree budget).

    python experiments/drafters.py              # the full run (CPU, see the header for the time)
    python experiments/drafters.py --quick      # 2 prompts x 16 tokens, 1 repetition
    python experiments/drafters.py --only smollm2 --smollm2-mdc runs/X/smollm2-mdc --out F.md
                                                # a candidate mdc against the shipped eagle

Needs the shipped drafters in checkpoints/ (python experiments/train_drafters.py makes them).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

import jax

from specjax.bench import (
    AR,
    SPEC,
    Dataset,
    Method,
    Suite,
    bench,
    header_settings,
    write_json,
    write_markdown,
)
from specjax.benchmark import device_header
from specjax.config import TreeConfig
from specjax.paths import (
    LLAMA2XS,
    SMOLLM2,
    SMOLLM2_EAGLE,
    SMOLLM2_MDC,
    STORIES260K,
    STORIES260K_EAGLE,
    STORIES260K_MDC,
    repo_dir,
)

RESULTS = Path(__file__).resolve().parent / "results"
# Tree budgets (draft nodes, depth, top-k) every feature drafter is measured at.
BUDGETS = ((15, 5, 4), (31, 6, 8))
REUSE_BUDGET = TreeConfig.dynamic(31, 6, 8)


# The drafters are compared as drafters: their pre-verifiers (which prune the tree; pacer.py
# measures them) stay off, so every row drafts and verifies the whole budget.
NO_PV = ":nopv"


def feature_methods(mdc: str, eagle: str) -> list[Method]:
    methods = []
    for path in (eagle, mdc):
        for n, d, k in BUDGETS:
            methods.append(
                Method(kind=SPEC, drafter=path + NO_PV, tree=TreeConfig.dynamic(n, d, k))
            )
    # The reuse ablation of the hidden-state drafter at the budget the acceptance bar uses
    # (the other fresh-slot settings are measured in the reuse table only).
    methods.append(Method(kind=SPEC, drafter=f"{mdc}:noreuse{NO_PV}", tree=REUSE_BUDGET))
    return methods


def drafter_name(method_label: str) -> str:
    """A row's drafter without the switch every feature row carries: for the label
    "smollm2-mdc:nopv tree 31/d6/top8", "smollm2-mdc"."""
    return method_label.split()[0].removesuffix(NO_PV)


def smollm2_suite(mdc: str = SMOLLM2_MDC, eagle: str = SMOLLM2_EAGLE):
    """SmolLM2's suite and its plan (temperature -> datasets), with the two feature drafters
    given (the shipped ones by default; a trained candidate's folder to compare it before it
    ships)."""
    return (
        Suite(
            name="SmolLM2-135M-Instruct",
            model=SMOLLM2,
            kind="chat",
            datasets=(Dataset.named("mt_bench", 6, 96), Dataset.named("qa", 6, 96)),
            methods=(
                Method(kind=AR),
                Method(kind=SPEC, drafter="self:8", tree=TreeConfig(branching=(3, 1))),
                *feature_methods(mdc, eagle),
            ),
        ),
        # temperature 1 on MT-bench only (the time budget of one CPU run)
        {0.0: ("mt_bench", "qa"), 1.0: ("mt_bench",)},
    )


STORIES_SUITE = (
    Suite(
        name="stories260K",
        model=STORIES260K,
        kind="story",
        stop_at_eos=False,
        datasets=(Dataset.named("tinystories", 16, 128),),
        methods=(
            Method(kind=AR),
            Method(kind=SPEC, drafter=LLAMA2XS, tree=TreeConfig.chain(4)),
            Method(kind=SPEC, drafter=LLAMA2XS, tree=TreeConfig(branching=(4, 1, 1, 1))),
            *feature_methods(STORIES260K_MDC, STORIES260K_EAGLE),
        ),
    ),
    {0.0: ("tinystories",), 1.0: ("tinystories",)},
)


def reuse_stats(suite: Suite, target, prompts, temperature: float) -> dict:
    """tau and reuse counters of the hidden-state drafter with reuse off and with 0..3 freshly
    recomputed leading chain slots, all rows of the prompt set in one batch."""
    from specjax.drafters.feature import DEFAULT_FRESH_SLOTS
    from specjax.drafters.spec import make_drafter
    from specjax.train.pipeline import measure_tau

    mdc = next(
        m.drafter.removesuffix(NO_PV)
        for m in suite.methods
        if m.drafter and m.drafter.removesuffix(NO_PV).endswith("-mdc")
    )
    from specjax.bench import resolve_drafter

    out = {}
    settings = [
        (
            f"reuse, {n} fresh" + (" (default)" if n == DEFAULT_FRESH_SLOTS else ""),
            f"{mdc}:fresh{n}{NO_PV}",
        )
        for n in range(4)
    ]
    for label, spec in [*settings, ("no reuse", f"{mdc}:noreuse{NO_PV}")]:
        drafter = make_drafter(resolve_drafter(spec), target)
        out[label] = measure_tau(
            target.model,
            drafter,
            [list(p.ids) for p in prompts.prompts],
            tree=REUSE_BUDGET,
            max_new_tokens=prompts.max_new_tokens,
            temperature=temperature,
            eos_id=target.eos_id,
            batch=len(prompts.prompts),
        )
    return out


def reuse_lines(name: str, dataset: str, temperature: float, stats: dict) -> list[str]:
    lines = []
    for label, s in stats.items():
        served = s["reused"] / max(s["drafted"], 1)
        calls = s["chain_calls"] / max(s["target_calls"], 1)
        lines.append(
            f"| {name} | {dataset} | {temperature:g} | {label} | {s['tau']:.2f} | "
            f"{served:.1%} | {calls:.2f} |"
        )
    return lines


REUSE_HEADING = "## Draft reuse"


def reuse_table(lines: list[str]) -> list[str]:
    return [
        "",
        f"{REUSE_HEADING} (hidden-state drafter, tree 31/d6/top8, all prompts in one batch)",
        "",
        "served from reuse: draft nodes whose distribution came from a reused hidden state / all "
        "draft nodes. chain calls/step: drafter layer calls for the hidden-state chain per target "
        "call (6 without reuse). `n fresh`: the first n chain slots are recomputed every step "
        "(slot 0 takes the target's verified hidden state), the deeper valid ones reused. "
        "Measured by `python experiments/drafters.py --reuse-only`.",
        "",
        "| target | dataset | T | reuse | tau | served from reuse | chain calls/step |",
        "|---|---|---|---|---|---|---|",
        *lines,
    ]


def budget(draft_nodes) -> int:
    """The tree budget of a row's draft-nodes cell: "31", or "31 -> 14.7" when a pre-verifier
    verified fewer nodes on average."""
    return int(str(draft_nodes).split()[0])


def plot_tau_vs_budget(rows, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups = {}
    for r in rows:
        groups.setdefault((r.target, r.dataset, r.temperature), []).append(r)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.8), squeeze=False)
    for ax, ((target, dataset, temp), group) in zip(axes[0], groups.items(), strict=True):
        for kind in ("eagle", "mdc"):
            pts = sorted(
                (budget(r.draft_nodes), r.tau)
                for r in group
                if r.kind == SPEC and drafter_name(r.method).endswith(f"-{kind}")
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=f"{kind} drafter")
        for r in group:
            if r.kind == SPEC and not drafter_name(r.method).endswith(("-eagle", "-mdc")):
                if ":" not in drafter_name(r.method):
                    ax.scatter([budget(r.draft_nodes)], [r.tau], marker="x", label=r.method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("draft nodes per target call")
        ax.set_title(f"{target} / {dataset} / T={temp:g}", fontsize=8)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("tau (tokens per target call)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def check_candidates(given: dict[str, str]) -> dict[str, str]:
    """{shipped drafter folder: the folder given in its place} for each given one that is not
    the shipped drafter, refused before anything is compiled where it is no trained drafter
    or its folder has another name than the shipped one (rows, the plot and the reuse table
    find a drafter by its folder's name)."""
    candidates = {}
    for shipped, path in given.items():
        if Path(path).resolve() == (repo_dir() / shipped).resolve():
            continue
        if not (Path(path) / "drafter.json").is_file():
            raise SystemExit(f"error: {path} holds no trained drafter (no drafter.json)")
        if Path(path).name != Path(shipped).name:
            raise SystemExit(
                f"error: {path} must be a folder named {Path(shipped).name}, as train_drafters "
                "writes it (rows are named by the folder)"
            )
        candidates[shipped] = path
    return candidates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=1, help="interleaved repetitions")
    parser.add_argument("--out", default=str(RESULTS / "drafters.md"))
    parser.add_argument(
        "--reuse-only",
        action="store_true",
        help="only re-measure the draft-reuse table and replace it in an existing --out file",
    )
    parser.add_argument(
        "--smollm2-mdc",
        default=SMOLLM2_MDC,
        help="SmolLM2's hidden-state drafter (default: the shipped one; a candidate's folder "
        "compares it before it ships)",
    )
    parser.add_argument(
        "--smollm2-eagle", default=SMOLLM2_EAGLE, help="SmolLM2's EAGLE-style drafter"
    )
    parser.add_argument(
        "--only",
        choices=("smollm2", "stories260K"),
        help="run one target's suite (default: both)",
    )
    args = parser.parse_args(argv)
    candidates = check_candidates(
        {SMOLLM2_MDC: args.smollm2_mdc, SMOLLM2_EAGLE: args.smollm2_eagle}
        if args.only != "stories260K"
        else {}
    )
    plans = {
        "smollm2": smollm2_suite(args.smollm2_mdc, args.smollm2_eagle),
        "stories260K": STORIES_SUITE,
    }
    chosen = [plan for name, plan in plans.items() if args.only in (None, name)]
    out = Path(args.out)
    if args.quick:
        out = out.with_name(f"{out.stem}_quick{out.suffix}")
    reps = 1 if args.quick else args.reps
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows, described, reuse = [], [], []
    for suite, plan in chosen:
        if args.quick:
            suite = dataclasses.replace(
                suite,
                datasets=tuple(
                    dataclasses.replace(d, n_prompts=2, max_new_tokens=16) for d in suite.datasets
                ),
            )
        target, _ = suite.load()
        sets = {d.name: d.load(target.tokenizer) for d in suite.datasets}
        for ps in sets.values():
            described.append(
                f"{suite.name} / {ps.name}: {ps.description}, {ps.max_new_tokens} new tokens"
            )
        for temperature, names in plan.items():
            if args.reuse_only:
                first = sets[names[0]]
                stats = reuse_stats(suite, target, first, temperature)
                reuse += reuse_lines(suite.name, first.name, temperature, stats)
                jax.clear_caches()
                continue
            rows += bench(
                target,
                [sets[n] for n in names],
                suite.methods,
                temperatures=(temperature,),
                reps=reps,
                hf=False,
            )
            first = sets[names[0]]
            reuse += reuse_lines(
                suite.name, first.name, temperature, reuse_stats(suite, target, first, temperature)
            )
            # Dozens of compiled programs per block: dropping them keeps one process within the
            # machine's memory (XLA:CPU ran out of code memory without this).
            jax.clear_caches()
    if args.reuse_only:
        text = out.read_text()
        kept = text[: text.index(REUSE_HEADING)] if REUSE_HEADING in text else text
        out.write_text(kept + "\n".join(reuse_table(reuse)[1:]) + "\n")
        print(out.read_text())
        return 0
    suites = [s for s, _ in chosen]
    settings = header_settings(
        suites,
        temperatures=(0.0, 1.0),
        reps=reps,
        hf=False,
        command=shlex.join(["python", "experiments/drafters.py", *(argv or sys.argv[1:])]),
    )
    settings["prompts"] = "; ".join(described)
    settings["wall time"] = f"{(time.perf_counter() - t0) / 60:.1f} min for the whole run"
    header = device_header(**settings)
    smollm2_pair = (
        "the two SmolLM2 kinds share their steps, and their data but for the answers the eagle "
        "leaves out (those to turns resembling an evaluation turn)"
        if not candidates
        else "the SmolLM2 candidate's are in its own CARD.md"
    )
    notes = [
        "Feature drafters (mdc, eagle) draft dynamic trees: `tree N/dD/topK` is N draft nodes "
        "at most D deep, expanding the top-K children of the best K frontier nodes per level "
        "(EAGLE-2 style, static shapes). Each drafter's data and training steps are in its "
        f"checkpoints/*/CARD.md: the two stories260K kinds share theirs; {smollm2_pair}. The "
        "shipped drafters' head-to-head on all 80 MT-bench first "
        "turns, with the acceptance at each tree depth (the mdc trails from depth 4), is "
        "experiments/results/drafter_tau.md; the mdc's deep levels tested (6 unrolled "
        "levels, 4 path tokens) in drafter_tau_mdc_levels6.md and drafter_tau_mdc_path4.md; "
        "the stale-plus-fresh logits in drafter_tau_mdc_stale.md; where each loses agreement "
        "with the target, level by level, in drafter_agreement.md.",
        "`:noreuse` recomputes the hidden-state chain every step (reuse on is the default; the "
        "reuse table measures how many leading chain slots to recompute).",
        "`:nopv`: the drafter without its trained pre-verifier, so every row drafts and verifies "
        "its whole budget (experiments/pacer.py measures the pre-verifiers).",
    ]
    for shipped, given in candidates.items():
        notes.append(
            f"Not the shipped drafter: the SmolLM2 rows named {Path(shipped).name} ran {given}."
        )
    write_markdown(
        rows,
        header,
        out,
        notes=notes,
        title="Drafters: self-draft, EAGLE-style and hidden-state (mdc)",
    )
    with open(out, "a") as f:
        f.write("\n".join(reuse_table(reuse)) + "\n")
    plot = plot_tau_vs_budget(rows, out.with_name(f"{out.stem}_tau_budget.png"))
    smollm2 = () if args.only == "stories260K" else (SMOLLM2_MDC, SMOLLM2_EAGLE)
    drafters = {Path(shipped).name: candidates.get(shipped, shipped) for shipped in smollm2}
    extra = {"header": header, "reuse": reuse, "smollm2_drafters": drafters}
    write_json(rows, extra, out.with_suffix(".json"))
    print(out.read_text())
    print(f"[drafters] wrote {out}" + (f", {plot}" if plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
