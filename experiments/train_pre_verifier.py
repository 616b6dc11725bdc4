"""Train a drafter's pre-verifier (PACER; specjax.models.pre_verifier) and keep it in the
drafter's checkpoint folder (DIR/pre_verifier/), with its calibration in the drafter's CARD.md
and in experiments/results/pre_verifier_<drafter>.md (+ a calibration plot).

    python experiments/train_pre_verifier.py --drafter checkpoints/stories260K-eagle
    python experiments/train_pre_verifier.py --drafter checkpoints/smollm2-eagle

Labels: greedy speculative decoding with the collection tree on held-in prompts
(specjax.calibration.held_in_prompts: the project's broad and task prompt generators in the chat
template for SmolLM2 (their cards name the mix each was trained on), TinyStories training
paragraphs for stories260K); the last fifth of
the prompts is held out for the calibration figures. MT-bench's first turns are used for
evaluation only (AUC and calibration on them; nothing is fitted there). The thresholds are the
ones whose replay on the held-out steps (specjax.pre_verifier_replay) gives the most tokens per
second under this machine's measured costs (specjax.autotune); the held-out steps are kept in
pre_verifier/replay.npz, so that each machine the drafter runs on chooses again under its own
costs (specjax.pre_verifier_local).

    python experiments/train_pre_verifier.py --drafter checkpoints/smollm2-mdc --replay-only

records only the held-out steps into an existing pre-verifier's folder (the same prompts and
collection tree as its training; nothing is retrained).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np

import specjax
from specjax import autotune
from specjax import pre_verifier_replay as pvr
from specjax.benchmark import cpu_model
from specjax.calibration import held_in_prompts, update_card
from specjax.config import TreeConfig
from specjax.models.pre_verifier import (
    FOLDER,
    REPLAY,
    PreVerifierConfig,
    read_pre_verifier_header,
    save_pre_verifier,
)
from specjax.paths import SMOLLM2, STORIES260K, repo_dir, shared_path
from specjax.train import pre_verifier as pvt

RESULTS = Path(__file__).resolve().parent / "results"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def eval_prompts(tokenizer, n: int) -> list[list[int]]:
    """MT-bench first turns in the chat template (evaluation only)."""
    from specjax.bench.prompts import Dataset

    return [list(p.ids) for p in Dataset.named("mt_bench", n, 64).load(tokenizer).prompts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True, help="a trained feature drafter directory")
    ap.add_argument("--tree", default="31,6,8", help="collection tree N,DEPTH,TOPK")
    ap.add_argument("--prompts", type=int, default=40, help="held-in prompts (1/5 held out)")
    ap.add_argument("--eval-prompts", type=int, default=16, help="MT-bench prompts (chat only)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3000, help="training steps")
    ap.add_argument("--block", type=int, default=1, help="levels drafted between checks (b)")
    ap.add_argument(
        "--replay-only",
        action="store_true",
        help="only record the held-out steps into an existing pre_verifier/",
    )
    args = ap.parse_args()
    # The command as run, for the card and the results file (every flag changes what is trained).
    command = shlex.join(["python", "experiments/train_pre_verifier.py", *sys.argv[1:]])

    folder = Path(args.drafter)
    folder = folder if folder.exists() else repo_dir() / args.drafter
    chat = "smollm2" in folder.name.lower()
    target = specjax.load(shared_path(SMOLLM2 if chat else STORIES260K))
    drafter = specjax.load_drafter(folder, target.model, pre_verifier=False)
    nodes, depth, topk = (int(x) for x in args.tree.split(","))
    config = specjax.SpecConfig(tree=TreeConfig.dynamic(nodes, depth, topk))
    eos = target.tokenizer.eos_id

    prompts, description = held_in_prompts("chat" if chat else "story", target.tokenizer,
                                            n=args.prompts)  # fmt: skip
    n_train = len(prompts) * 4 // 5
    t0 = time.time()
    record = dict(config=config, max_new_tokens=args.max_new, eos_id=eos, progress=say)
    if args.replay_only:
        pv_header = read_pre_verifier_header(folder / FOLDER)
        if pv_header["card"].get("collection_tree") != args.tree:
            raise SystemExit(
                f"{folder / FOLDER} was trained with --tree "
                f"{pv_header['card'].get('collection_tree')}, not {args.tree}"
            )
        held_rec = pvt.record_steps(target.model, drafter, prompts[n_train:], **record)
        pvr.save_records(held_rec, folder / FOLDER / REPLAY)
        say(f"wrote {folder / FOLDER / REPLAY}: {len(held_rec)} row-steps")
        return
    train_rec = pvt.record_steps(target.model, drafter, prompts[:n_train], **record)
    held_rec = pvt.record_steps(target.model, drafter, prompts[n_train:], **record)
    eval_rec = []
    if chat and args.eval_prompts:
        eval_rec = pvt.record_steps(
            target.model, drafter, eval_prompts(target.tokenizer, args.eval_prompts), **record
        )
    record_s = time.time() - t0
    x, y = pvt.node_labels(train_rec)
    say(f"{len(y)} labelled nodes ({y.mean():.3f} accepted) from {len(train_rec)} row-steps")

    t0 = time.time()
    pv = pvt.train_pre_verifier(
        x, y, config=PreVerifierConfig(block=args.block), steps=args.steps, progress=say
    )
    train_s = time.time() - t0

    sets = {"held-out": held_rec} | ({"MT-bench (evaluation only)": eval_rec} if eval_rec else {})
    quality = {}
    for name, recs in sets.items():
        xs, ys = pvt.node_labels(recs)
        p = pvr.predict(pv, xs)
        base = pvt.auc(-np.abs(xs[:, 0]), ys)  # the draft probability alone, for comparison
        quality[name] = (len(ys), pvt.auc(p, ys), base, pvt.calibration_bins(p, ys))

    verify = autotune.verify_costs(target.model, with_ar=False)
    topks = sorted({topk, *(k for _, _, k in pvr.FIXED_TREES)})
    draft = autotune.draft_costs(target.model, drafter, verify, topks=tuple(topks))

    replay = pvr.replay_thresholds(
        pv, held_rec, collection=(nodes, depth, topk), t_verify=verify.t_verify,
        t_draft=lambda levels, k: draft.t_draft(TreeConfig.dynamic(nodes, levels, k)),
    )  # fmt: skip
    best, best_fixed, vs_fixed = replay.best, replay.best_fixed, replay.vs_best_fixed
    base_words = (
        f"dynamic({args.tree})" if replay.best_base is None else f"dynamic{replay.best_base}"
    )
    per_budget = replay.table
    pv = pv.with_settings(
        threshold=best.threshold, budget_thresholds=tuple(sorted(per_budget.items()))
    )
    held_auc = quality["held-out"][1]
    card = {
        "drafter": folder.name,
        "collection_tree": args.tree,
        "block": args.block,
        "threshold": best.threshold,
        "held_out_auc": held_auc,
        "threshold_chosen_on": base_words,
        "budget_thresholds": {str(n): t for n, t in sorted(per_budget.items())},
        "replay_vs_best_fixed_tree": {"tree": list(best_fixed), "ratio": round(vs_fixed, 3)},
        "labelled_nodes": int(len(y)),
        "prompts": description,
    }
    save_pre_verifier(pv, folder / FOLDER, card=card)
    # The held-out steps stay with it: where the drafter runs, its thresholds are chosen again
    # under that machine's costs (specjax.pre_verifier_local).
    pvr.save_records(held_rec, folder / FOLDER / REPLAY)

    lines = [
        f"## Pre-verifier ({FOLDER}/)",
        "",
        f"Trained by `{command}` on "
        f"{len(y)} labelled nodes from greedy decoding with dynamic({args.tree}) on "
        f"{n_train} held-in prompts ({description}); {args.steps} steps, "
        f"{train_s:.0f} s (+{record_s:.0f} s recording). Block b = {args.block} level(s); "
        f"threshold {best.threshold} (the best replayed tokens/s on the held-out prompts, "
        f"pruning {base_words}): {vs_fixed:.2f}x the replayed tokens/s of the best small fixed "
        f"tree without it, dynamic{best_fixed}. A tree of N draft nodes is pruned at the "
        f"threshold that replayed best at the largest of these budgets <= N: "
        + ", ".join(f"{n} nodes {t}" for n, t in sorted(per_budget.items()))
        + ".",
        "",
        "| prompts | labelled nodes | AUC | AUC of the draft probability alone |",
        "|---|---|---|---|",
    ]
    lines += [f"| {k} | {n} | {a:.3f} | {b:.3f} |" for k, (n, a, b, _) in quality.items()]
    lines += [
        "",
        "Calibration (held-out): predicted vs observed P(accepted | parent accepted)",
        "",
        "| predicted | nodes | mean predicted | observed |",
        "|---|---|---|---|",
    ]
    lines += [f"| {lo:.1f}-{hi:.1f} | {c} | {mp:.3f} | {ob:.3f} |"
              for lo, hi, c, mp, ob in quality["held-out"][3]]  # fmt: skip
    section = "\n".join(lines) + "\n"
    update_card(folder, section, heading=f"Pre-verifier ({FOLDER}/)")

    out = RESULTS / f"pre_verifier_{folder.name}.md"
    rows = [
        f"# Pre-verifier of {folder.name}",
        "",
        f"- host: {cpu_model()}, jax {__import__('jax').__version__}",
        f"- `{command}`",
        "",
        section,
        "## Replay of the held-out steps (greedy; costs measured on this machine)",
        "",
        "Tokens per step (tau), draft nodes verified, verified bucket, drafted levels and "
        "predicted tokens/s of each threshold, from the recorded steps (exact for greedy: the "
        "pruned tree accepts the longest kept prefix of the recorded path), and of small fixed "
        "trees without the pre-verifier (their nodes taken from the recorded tree: "
        "specjax.train.pre_verifier.fixed_subtree).",
        "",
        "| threshold | tau | draft nodes | bucket | levels | predicted tok/s | vs none |",
        "|---|---|---|---|---|---|---|",
    ]
    sims = (replay.unpruned, *replay.by_threshold)
    for s in sims:
        name = "none" if s is sims[0] else f"{s.threshold}"
        ratio = s.tokens_per_second / sims[0].tokens_per_second
        rows.append(
            f"| {name} | {s.tau:.2f} | {s.draft_len:.1f} | {s.bucket:.1f} | {s.depth:.1f} "
            f"| {s.tokens_per_second:.1f} | {ratio:.2f}x |"
        )
    for tree, pruned in replay.pruned.items():
        for label, s in (
            (f"fixed dynamic{tree}, no pre-verifier", replay.fixed[tree]),
            (f"dynamic{tree} pruned at {pruned.threshold} (its best)", pruned),
        ):
            ratio = s.tokens_per_second / sims[0].tokens_per_second
            rows.append(
                f"| {label} | {s.tau:.2f} | {s.draft_len:.1f} | {s.bucket:.1f} | {s.depth:.1f} "
                f"| {s.tokens_per_second:.1f} | {ratio:.2f}x |"
            )
    out.write_text("\n".join(rows) + "\n")
    plot_calibration(quality, RESULTS / f"pre_verifier_{folder.name}.png")
    say(f"wrote {folder / FOLDER}, {out}; threshold {best.threshold}, AUC {held_auc:.3f}")


def plot_calibration(quality: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
    for name, (_, a, _, bins) in quality.items():
        ax.plot(
            [b[3] for b in bins], [b[4] for b in bins], marker="o", label=f"{name} (AUC {a:.2f})"
        )
    ax.set_xlabel("predicted P(accepted | parent accepted)")
    ax.set_ylabel("observed")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
