"""PACER's motivating figure for a shipped drafter: the best draft length changes from step to
step. Greedy decoding of MT-bench first turns (evaluation only) with a generous tree records,
per step, how deep the target accepted (the length a perfect oracle would have drafted) and
how deep the drafter's pre-verifier would have kept the tree. Writes
experiments/results/pacer_draft_length.png and pacer_draft_length.md.

    python experiments/pacer_figures.py --drafter checkpoints/smollm2-eagle
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import specjax
from specjax import pre_verifier_replay as pvr
from specjax.bench.prompts import Dataset
from specjax.benchmark import cpu_model
from specjax.config import TreeConfig
from specjax.paths import SMOLLM2, repo_dir, shared_path
from specjax.pre_verifier_replay import path_probability
from specjax.train import pre_verifier as pvt

RESULTS = Path(__file__).resolve().parent / "results"


def kept_depth(pv, record) -> int:
    """Depth of the deepest node the pre-verifier keeps in a recorded tree."""
    p = pvr.predict(pv, record.node_stats)
    keep = record.valid & (path_probability(p, record.parents) >= pv.config.threshold)
    keep[0] = True
    return int(record.node_stats[keep, 5].max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default="checkpoints/smollm2-eagle")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new", type=int, default=96)
    args = ap.parse_args()
    folder = Path(args.drafter)
    folder = folder if folder.exists() else repo_dir() / args.drafter
    target = specjax.load(shared_path(SMOLLM2))
    drafter = specjax.load_drafter(folder, target.model, pre_verifier=True)
    pv = drafter.pre_verifier
    prompts = [list(p.ids) for p in Dataset.named("mt_bench", args.prompts, 64).load(
        target.tokenizer).prompts]  # fmt: skip
    config = specjax.SpecConfig(tree=TreeConfig.dynamic(31, 6, 8))
    records = pvt.record_steps(target.model, drafter, prompts, config=config,
                               max_new_tokens=args.max_new, batch=1,
                               eos_id=target.tokenizer.eos_id)  # fmt: skip
    accepted = np.array([len(r.path) for r in records])
    kept = np.array([kept_depth(pv, r) for r in records])

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [3, 1]})
    n = min(120, len(records))
    ax1.step(range(n), accepted[:n], where="mid", label="accepted depth (best draft length)")
    ax1.step(range(n), kept[:n], where="mid", alpha=0.7, label="depth the pre-verifier keeps")
    ax1.set_xlabel("step")
    ax1.set_ylabel("draft length")
    ax1.legend(fontsize=7, loc="upper right")
    bins = np.arange(0, 8) - 0.5
    ax2.hist(accepted, bins=bins, alpha=0.6, label="accepted")
    ax2.hist(kept, bins=bins, alpha=0.6, label="kept")
    ax2.set_xlabel("length")
    ax2.legend(fontsize=7)
    fig.suptitle(f"{folder.name}, MT-bench, greedy, dynamic(31,6,8)", fontsize=9)
    fig.tight_layout()
    fig.savefig(RESULTS / "pacer_draft_length.png", dpi=120)

    lines = [
        "# Per-step best draft length and the pre-verifier's choice",
        "",
        f"- host: {cpu_model()}; `python experiments/pacer_figures.py --drafter {args.drafter} "
        f"--prompts {args.prompts} --max-new {args.max_new}`",
        f"- {len(records)} greedy steps on {len(prompts)} MT-bench first turns, {args.max_new} "
        f"tokens each, tree dynamic(31,6,8); threshold {pv.config.threshold}",
        "",
        "| length | steps where the target accepted this deep | steps the pre-verifier kept "
        "this deep |",
        "|---|---|---|",
    ]
    for k in range(7):
        lines.append(f"| {k} | {int(np.sum(accepted == k))} | {int(np.sum(kept == k))} |")
    over = float(np.mean(kept > accepted))
    under = float(np.mean(kept < accepted))
    lines += [
        "",
        f"Kept deeper than accepted (drafted and verified in vain) in {over:.0%} of steps, "
        f"shallower (tokens lost) in {under:.0%}; exact in {1 - over - under:.0%}. Correlation "
        f"of the two: {np.corrcoef(accepted, kept)[0, 1]:.2f}. See pacer_draft_length.png.",
    ]
    (RESULTS / "pacer_draft_length.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
