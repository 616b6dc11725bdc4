"""How much a pre-verifier could give on this machine: the shipped one against a perfect
discriminator.

For each drafter, greedy steps with a generous collection tree are replayed
(specjax.pre_verifier_replay; exact tau for greedy) under this machine's measured costs (t(N)
and the drafter's cost per level, specjax.autotune) for:

- small fixed trees without a pre-verifier (the baseline the PACER goal is measured against:
  the best of them),
- each tree pruned by the shipped pre-verifier at the thresholds this machine chose for it
  (specjax.pre_verifier_local: what a default call uses), at the threshold that replays best
  on these very steps (hindsight), and with the engine's cost-aware bucket,
- each tree pruned by a perfect discriminator, which keeps exactly the nodes the target
  accepts (the tree's whole tau at the fewest nodes and levels that keep it),
- the shipped pre-verifier's predictions moved towards the truth, as a stand-in for better
  discriminators: what AUC a gain would need.

The steps come from the pre-verifier's held-out held-in steps (the fifth of its training
prompts it was not trained on, pre_verifier/replay.npz) and from first turns of evaluation sets
(MT-bench, EAGLE's qa). The pre-verifiers were never trained on the evaluation sets; the
hindsight thresholds are chosen on each set's own steps, which is what makes them hindsight.
("machine" on the held-in steps is close to hindsight too: those are the steps this machine's
thresholds were chosen on.) Writes experiments/results/pacer_ceiling.md and a plot beside it.

    python experiments/pacer_ceiling.py
    python experiments/pacer_ceiling.py --drafter checkpoints/smollm2-eagle --sets mt_bench
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import specjax
from specjax import autotune, pre_verifier_local
from specjax import pre_verifier_replay as pvr
from specjax.bench.prompts import Dataset
from specjax.benchmark import cpu_model
from specjax.config import TreeConfig
from specjax.paths import SMOLLM2, repo_dir, shared_path
from specjax.train import pre_verifier as pvt

RESULTS = Path(__file__).resolve().parent / "results"
DRAFTERS = ("checkpoints/smollm2-eagle", "checkpoints/smollm2-mdc")
# Fixed trees replayed as the baseline: the pre-verifier's own small trees and the trees the
# default call chose on these machines (experiments/results/bench.md).
FIXED = ((4, 2, 2), (6, 3, 4), (7, 3, 4), (7, 4, 4), (15, 5, 4))
PRUNED = ((7, 3, 4), (15, 5, 4))  # budgets pruned beside the collection tree
# t(N) at every count a replayed bucket or fixed tree verifies: on these CPUs t(N) moves in
# stairs, which interpolating a power-of-two grid would smooth away.
GRID = (*range(1, 17), 32, 64)
SHARPEN = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)  # logit shifts towards the labels
KINDS = ("whole", "machine", "hindsight", "by cost", "perfect")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def tree_words(tree: tuple[int, int, int]) -> str:
    return "dynamic({},{},{})".format(*tree)


def replay_costs(verify, draft, collection, topk: int) -> dict:
    """simulate's t_verify and t_draft for trees of top-k `topk`, drafting levels priced as in
    the collection tree's budget."""
    return dict(
        t_verify=verify.t_verify,
        t_draft=lambda levels: draft.t_draft(TreeConfig.dynamic(collection[0], levels, topk)),
    )


def replay_set(pv, records, collection, verify, draft) -> dict:
    """Every replay of one set of records: {"fixed": {tree: Simulated}, "best_fixed": tree,
    "pruned": {tree: {kind: Simulated}}} with kinds KINDS (the tree whole, this machine's
    threshold, the hindsight-best threshold, the cost-aware bucket at its best threshold, the
    perfect discriminator)."""

    def costs(topk: int) -> dict:
        return replay_costs(verify, draft, collection, topk)

    fixed = {t: pvr.simulate_fixed(records, t, **costs(t[2])) for t in FIXED}
    best_fixed = max(fixed, key=lambda t: fixed[t].tokens_per_second)
    pruned = {}
    for tree in (*PRUNED, collection):
        base = None if tree == collection else tree
        c = costs(tree[2])
        by_threshold = [pvr.simulate(pv, records, th, base=base, **c) for th in pvr.THRESHOLDS[1:]]
        by_cost = [pvr.simulate(pv, records, th, base=base, by_cost=True, **c)
                   for th in pvr.THRESHOLDS]  # fmt: skip
        whole = pvr.simulate(None, records, 0.0, base=base, **c)
        machine = pv.threshold_for(tree[0])
        pruned[tree] = {
            "whole": whole,
            "machine": pvr.simulate(pv, records, machine, base=base, **c) if machine else whole,
            "hindsight": fastest([whole, *by_threshold]),
            "by cost": fastest(by_cost),
            "perfect": pvr.simulate_oracle(records, base, **c),
        }
    return {"fixed": fixed, "best_fixed": best_fixed, "pruned": pruned}


def best_fixed_rate(rep: dict) -> float:
    """The best fixed tree's replayed tokens/s in a replay_set result."""
    return rep["fixed"][rep["best_fixed"]].tokens_per_second


def fastest(replays: list[pvr.Simulated]) -> pvr.Simulated:
    return max(replays, key=lambda s: s.tokens_per_second)


def cell(sim: pvr.Simulated, reference: float) -> str:
    """A table cell: tokens/s over the reference's, tau and draft nodes verified."""
    return (
        f"{sim.tokens_per_second / reference:.2f}x (tau {sim.tau:.2f}, {sim.draft_len:.1f} nodes)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", action="append", help="feature drafter folder(s) with a "
                    "pre-verifier (default: both SmolLM2 drafters)")  # fmt: skip
    ap.add_argument("--sets", default="mt_bench,qa", help="evaluation sets (first turns)")
    ap.add_argument("--prompts", type=int, default=16, help="first turns per evaluation set")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--out", default=str(RESULTS / "pacer_ceiling.md"))
    args = ap.parse_args()
    started = time.time()
    target = specjax.load(shared_path(SMOLLM2))
    context = pre_verifier_local.cost_context(target.model)
    sets = [s for s in args.sets.split(",") if s]
    results, described = {}, {}
    for name in args.drafter or DRAFTERS:
        folder = Path(name) if Path(name).exists() else repo_dir() / name
        drafter = specjax.load_drafter(folder, target.model, pre_verifier=True)
        pv = drafter.pre_verifier
        if pv is None or pv.replay_file is None:
            raise SystemExit(f"{folder}: no pre-verifier with recorded steps (replay.npz)")
        header = json.loads((Path(pv.replay_file).parent / "pre_verifier.json").read_text())
        collection = tuple(int(x) for x in str(header["card"]["collection_tree"]).split(","))
        verify = autotune.verify_costs(target.model, context=context, with_ar=False, nodes=GRID)
        pre_verifier_local.localize(target.model, drafter, context=context)
        topks = sorted({collection[2], *(t[2] for t in FIXED)})
        draft = autotune.draft_costs(target.model, drafter, verify, context=context,
                                     topks=tuple(topks), with_overhead=False)  # fmt: skip
        record_sets = {"held-in (held out)": pvr.load_records(pv.replay_file)}
        config = specjax.SpecConfig(tree=TreeConfig.dynamic(*collection))
        for s in sets:
            prompt_set = Dataset.named(s, args.prompts, args.max_new).load(target.tokenizer)
            described[s] = prompt_set.description
            say(f"{folder.name}: recording {s} ({args.prompts} prompts, {args.max_new} tokens)")
            record_sets[s] = pvt.record_steps(
                target.model, drafter, [list(p.ids) for p in prompt_set.prompts],
                config=config, max_new_tokens=args.max_new, eos_id=target.tokenizer.eos_id,
            )  # fmt: skip
        replays = {
            k: (len(r), replay_set(pv, r, collection, verify, draft))
            for k, r in record_sets.items()
        }

        results[folder.name] = {
            "collection": collection,
            "table": {n: pv.threshold_for(n) for n in (7, 15, collection[0])},
            "sets": replays,
            "auc": {k: auc_pair(pv, r) for k, r in record_sets.items()},
            "sharper": {
                k: sharper_discriminators(
                    pv, r, collection, verify, draft, best_fixed_rate(replays[k][1])
                )
                for k, r in record_sets.items()
            },
            "t_verify": verify,
            "context": context,
        }
    write(results, described, args, time.time() - started)


def sharper_discriminators(pv, records, collection, verify, draft, best_fixed: float) -> list:
    """[(alpha, AUC, best replay over the best fixed tree)]: the pre-verifier's predictions
    moved towards the truth, logit(p) + alpha * (+1 accepted, -1 not), as a stand-in for a
    better discriminator; for each, the fastest replay over the pruned trees, thresholds and
    bucket rules. Shows what AUC a pre-verifier would need to reach a given gain here.
    best_fixed: the best fixed tree's replayed tokens/s on these records."""
    stats = np.concatenate([r.node_stats for r in records])
    p = np.clip(pvr.predict(pv, stats), 1e-6, 1 - 1e-6)
    on_path, eligible = [], []  # every node; the labelled ones (parent accepted)
    for r in records:
        on_path.append(np.isin(np.arange(len(r.parents)), r.path))
        chosen = np.zeros(len(r.parents), bool)
        chosen[pvt.labelled_nodes(r)[0]] = True
        eligible.append(chosen)
    on_path, eligible = np.concatenate(on_path), np.concatenate(eligible)
    rows = []
    for alpha in SHARPEN:
        logit = np.log(p / (1 - p)) + alpha * np.where(on_path, 1.0, -1.0)
        probs = 1.0 / (1.0 + np.exp(-logit))
        auc = pvt.auc(probs[eligible], on_path[eligible])
        replays = []
        for tree in (*PRUNED, collection):
            base = None if tree == collection else tree
            c = replay_costs(verify, draft, collection, tree[2])
            for th in pvr.THRESHOLDS[1:]:
                for by_cost in (False, True):
                    replays.append(pvr.simulate(None, records, th, base=base, by_cost=by_cost,
                                                node_probs=probs, **c))  # fmt: skip
        rows.append((alpha, auc, fastest(replays).tokens_per_second / best_fixed))
    return rows


def auc_pair(pv, records) -> tuple[float, float]:
    """(the pre-verifier's AUC, the draft probability's alone) on a set's labelled nodes."""
    x, y = pvt.node_labels(records)
    return pvt.auc(pvr.predict(pv, x), y), pvt.auc(-np.abs(x[:, 0]), y)


def write(results: dict, described: dict, args, seconds: float) -> None:
    out = Path(args.out)
    command = (
        f"python experiments/pacer_ceiling.py --sets {args.sets} --prompts {args.prompts} "
        f"--max-new {args.max_new}" + "".join(f" --drafter {d}" for d in args.drafter or [])
    )
    lines = [
        "# PACER on this machine: the shipped pre-verifier against a perfect discriminator",
        "",
        f"- host: {cpu_model()}, jax {__import__('jax').__version__}",
        f"- command: `{command}`",
        f"- wall time: {seconds / 60:.1f} min",
        "- steps: greedy speculative decoding with the pre-verifier's collection tree; "
        "held-in: the steps kept in its pre_verifier/replay.npz (held-out prompts of its "
        "training); "
        + "; ".join(f"{k}: {v}, {args.max_new} new tokens" for k, v in described.items()),
        "- replay: specjax.pre_verifier_replay under this machine's t(N) and per-level "
        "drafting costs (specjax.autotune, batch 1); exact tau for greedy decoding, predicted "
        "seconds per step (drafting + verification; the step's fixed overhead is left out, so "
        "every ratio here is a little larger than a measured one would be)",
        "",
        "Each cell: predicted tokens/s over the best fixed tree's on the same steps (tau, draft "
        "nodes verified). machine: pruned at the threshold this machine chose for that budget "
        "(0: the tree whole); hindsight: at the threshold that replays best on these steps; "
        "by cost: the engine's cost-aware bucket (verify the most probable nodes of the bucket "
        "with the most expected tokens per second, PreVerifierConfig.costs) after the threshold "
        "that replays best with it; perfect: a pre-verifier that keeps exactly the nodes the "
        "target accepts (a perfect discriminator).",
        "",
    ]
    first = next(iter(results.values()))
    verify = first["t_verify"]
    t1 = verify.t_verify(1)
    lines += [
        f"## Target cost per verification t(N) (batch 1, context {first['context']})",
        "",
        "| N | " + " | ".join(str(n) for n in verify.nodes) + " |",
        "|---" * (len(verify.nodes) + 1) + "|",
        "| ms | " + " | ".join(f"{s * 1e3:.1f}" for s in verify.seconds) + " |",
        "| / t(1) | " + " | ".join(f"{s / t1:.2f}" for s in verify.seconds) + " |",
        "",
    ]
    for drafter, res in results.items():
        table = ", ".join(f"{n} nodes {t}" for n, t in res["table"].items())
        lines += [f"## {drafter}", "", f"Thresholds this machine chose: {table}.", ""]
        lines += ["| steps | AUC (pre-verifier / draft probability) | best fixed tree |",
                  "|---|---|---|"]  # fmt: skip
        for set_name, (count, rep) in res["sets"].items():
            a, b = res["auc"][set_name]
            bf = rep["best_fixed"]
            s = rep["fixed"][bf]
            lines.append(
                f"| {set_name} ({count} steps) | {a:.3f} / {b:.3f} | {tree_words(bf)}: tau "
                f"{s.tau:.2f}, {s.tokens_per_second:.1f} tok/s predicted |"
            )
        lines += ["", "Fixed trees without a pre-verifier:", ""]
        names = list(res["sets"])
        lines += ["| tree | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for tree in FIXED:
            row = []
            for set_name in names:
                rep = res["sets"][set_name][1]
                ref = best_fixed_rate(rep)
                row.append(cell(rep["fixed"][tree], ref))
            lines.append(f"| {tree_words(tree)} | " + " | ".join(row) + " |")
        lines += ["", "Pruned:", ""]
        lines += ["| tree | pruning | " + " | ".join(names) + " |",
                  "|---|---" + "|---" * len(names) + "|"]  # fmt: skip
        for tree in (*PRUNED, res["collection"]):
            for kind in KINDS:
                row = []
                for set_name in names:
                    rep = res["sets"][set_name][1]
                    ref = best_fixed_rate(rep)
                    sim = rep["pruned"][tree][kind]
                    extra = f", at {sim.threshold}" if kind in ("hindsight", "by cost") else ""
                    row.append(cell(sim, ref) + extra)
                lines.append(f"| {tree_words(tree)} | {kind} | " + " | ".join(row) + " |")
        lines += [
            "",
            "A sharper discriminator (hypothetical: the pre-verifier's logits moved by alpha "
            "towards the truth), its AUC and the fastest pruning it replays (any of the trees "
            "above, any threshold, with or without the cost-aware bucket), over the best fixed "
            "tree:",
            "",
            "| alpha | " + " | ".join(names) + " |",
            "|---" * (len(names) + 1) + "|",
        ]
        for i, alpha in enumerate(SHARPEN):
            row = []
            for set_name in names:
                _, auc, ratio = res["sharper"][set_name][i]
                row.append(f"AUC {auc:.3f}: {ratio:.2f}x")
            lines.append(f"| {alpha} | " + " | ".join(row) + " |")
        lines.append("")
    out.write_text("\n".join(lines) + "\n")
    plot(results, out.with_suffix(".png"))
    print("\n".join(lines))


def plot(results: dict, path: Path) -> None:
    """Per drafter: (top) the best replay of each kind over the best fixed tree, per set;
    (bottom) that ratio against the AUC of sharper discriminators."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = KINDS[1:]
    fig, axes = plt.subplots(2, len(results), figsize=(5 * len(results), 6.6), squeeze=False)
    for col, (drafter, res) in enumerate(results.items()):
        ax, curve = axes[0][col], axes[1][col]
        names = list(res["sets"])
        x = np.arange(len(names))
        for i, kind in enumerate(kinds):
            ratios = []
            for set_name in names:
                rep = res["sets"][set_name][1]
                ref = best_fixed_rate(rep)
                ratios.append(max(p[kind].tokens_per_second for p in rep["pruned"].values()) / ref)
            width = 0.8 / len(kinds)
            ax.bar(x + (i - (len(kinds) - 1) / 2) * width, ratios, width=width, label=kind)
        ax.set_xticks(x, [n.split(" (")[0] for n in names], fontsize=8)
        ax.set_ylabel("predicted tokens/s / best fixed tree")
        ax.set_title(drafter, fontsize=9)
        for set_name in names:
            rows = res["sharper"][set_name]
            line = curve.plot([r[1] for r in rows], [r[2] for r in rows], marker=".",
                              label=set_name.split(" (")[0])  # fmt: skip
            curve.plot(rows[0][1], rows[0][2], marker="o", color=line[0].get_color())
        curve.set_xlabel("discriminator AUC (o: the shipped pre-verifier)")
        curve.set_ylabel("best pruning / best fixed tree")
        for a in (ax, curve):
            a.axhline(1.0, color="grey", lw=0.8)
            a.axhline(1.1, color="grey", lw=0.8, ls="--")
            a.legend(fontsize=6, loc="lower right" if a is curve else "lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
