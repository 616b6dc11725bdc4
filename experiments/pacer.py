"""PACER's pre-verifier measured: each trained drafter with its pre-verifier (checkpoints/
<drafter>/pre_verifier, trained by experiments/train_pre_verifier.py) against the same drafter
without it, as the hardware-aware default call runs (SpecConfig.auto() as a user calls it: it
may stop speculating within a call, the table's fallback columns say where) and at fixed
trees. Same harness as experiments/bench.py
(interleaved repetitions in one process, specjax autoregressive decoding as the baseline,
greedy output compared token for token). Writes experiments/results/pacer.md.

    python experiments/pacer.py                                  # both targets, T = 0
    python experiments/pacer.py --targets smollm2 --datasets mt_bench qa

The pre-verifier prunes a small tree (7 nodes, depth 3, top-4: the fixed tree the default
usually picks on a CPU), a middle one (15 nodes, depth 5, top-4) and a generous one (31 nodes,
depth 6, top-8: the budget the trained drafters were first benchmarked with), each at the
threshold that replayed best for that budget under this machine's costs (chosen at the first
call from the steps recorded in the checkpoint: specjax.pre_verifier_local), to the nodes it
expects to be accepted, and verifies the smallest of a few static node counts that holds them;
draft nodes "N -> m" in the table give the budget and the mean number verified. The default
call with the pre-verifier ("auto-tree" without ":nopv") chooses its tree the same way (the
two calls can still choose differently: the eagle's chose dynamic(3,2,8)+text(4) with it and
dynamic(3,2,4)+text(4) without it on MT-bench in pacer.md's latest run), then lets the
pre-verifier prune it where the replay predicts at least 3% more tokens per second
(its tree label then ends in "pre-verified").

SmolLM2 adds the adaptive lengths that pay on a CPU (SMOLLM2_ADAPTIVE: a text chain drafted
from 3+ token matches and verified where drafted, and the cost-aware pre-verifier weighing the
tree's and the chain's nodes together; "15 -> m" the budget and the mean nodes verified),
against each drafter's best fixed setting (the tree its default chooses most often, every node
verified) and the default call with and without the pre-verifier, over 256 new tokens. With a
feature drafter's pre-verifier a greedy default call verifies its chosen tree widened to at
least (7,3,4) plus a chain of 8 from any match, pruned every step by this machine's costs
(specjax.api._cost_aware_candidate; its tree label says "pre-verified by cost" and names the
tree chosen whole).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from bench_suites import FEATURE_TREE, SUITES

from specjax.bench import AR, SPEC, Dataset, Method, main
from specjax.config import TreeConfig
from specjax.paths import SMOLLM2_EAGLE, SMOLLM2_MDC, STORIES260K_EAGLE, STORIES260K_MDC

RESULTS = Path(__file__).resolve().parent / "results"
SMALL_TREE = TreeConfig.dynamic(7, 3, 4)
MID_TREE = TreeConfig.dynamic(15, 5, 4)  # a budget with top-4 levels: cheaper to draft


def methods(drafters):
    """Per drafter: the default's best fixed tree and two fixed trees without the pre-verifier,
    the default call with it (pruning its tree where the replay predicts a gain), and three
    budgets with it (each pruned at its threshold for that budget)."""
    rows = [Method(kind=AR)]
    for d in drafters:
        rows.append(Method(kind=SPEC, drafter=f"{d}:nopv", auto=True, auto_fallback=False))
        rows.append(Method(kind=SPEC, drafter=d, auto=True, auto_fallback=False))
        rows.append(Method(kind=SPEC, drafter=f"{d}:nopv", tree=SMALL_TREE))
        rows.append(Method(kind=SPEC, drafter=f"{d}:nopv", tree=FEATURE_TREE))
        rows.append(Method(kind=SPEC, drafter=d, tree=SMALL_TREE))
        rows.append(Method(kind=SPEC, drafter=d, tree=MID_TREE))
        rows.append(Method(kind=SPEC, drafter=d, tree=FEATURE_TREE))
    return tuple(rows)


# Each SmolLM2 drafter's best fixed setting on this kind of CPU: the tree its default chooses
# most often, its text chain of 4 verified whole (experiments/results/
# bench_smollm2_text_adaptive_xeon.md: eagle 1.86x, mdc 1.84x).
SMOLLM2_FIXED = {
    SMOLLM2_EAGLE: TreeConfig.dynamic(4, 3, 4).with_text_chain(4),
    SMOLLM2_MDC: TreeConfig.dynamic(3, 2, 8).with_text_chain(4),
}
# The adaptive length that pays on a CPU: each drafter's small tree with a text chain of 8,
# drafted from 3+ token matches and verified where drafted, and the same tree and chain (any
# match) pruned together by the cost-aware pre-verifier (`DIR:pvcost`: every step verifies
# the node count with the most expected tokens per second under this machine's t(N); chain
# nodes weighed by their match, the drafter's by the network).
SMOLLM2_ADAPTIVE = {
    SMOLLM2_EAGLE: TreeConfig.dynamic(7, 4, 4),
    SMOLLM2_MDC: TreeConfig.dynamic(7, 3, 4),
}


def smollm2_methods(drafters):
    """Per drafter: its best fixed setting, the default call with and without the
    pre-verifier, the small tree without and with the threshold pre-verifier, and the adaptive
    chains. (The 31-node budget pruned by the threshold pre-verifier, 1.24-1.54x in pacer.md at
    561ec35, is left to `methods`.)"""
    rows = [Method(kind=AR)]
    for d in drafters:
        tree = SMOLLM2_ADAPTIVE[d]
        rows += [
            Method(kind=SPEC, drafter=f"{d}:nopv", tree=SMOLLM2_FIXED[d]),
            Method(kind=SPEC, drafter=d, auto=True),
            Method(kind=SPEC, drafter=f"{d}:nopv", auto=True),
            Method(kind=SPEC, drafter=f"{d}:nopv", tree=SMALL_TREE),
            Method(kind=SPEC, drafter=d, tree=SMALL_TREE),
            Method(kind=SPEC, drafter=d, tree=tree.with_text_chain(8, min_match=3)),
            Method(kind=SPEC, drafter=f"{d}:pvcost", tree=tree.with_text_chain(8, min_match=1)),
            Method(kind=SPEC, drafter=f"{d}:pvcost", tree=tree.with_text_chain(12, min_match=1)),
        ]
    return tuple(rows)


PACER_SUITES = {
    "stories260K": dataclasses.replace(
        SUITES["stories260K"], methods=methods((STORIES260K_EAGLE, STORIES260K_MDC))
    ),
    "smollm2": dataclasses.replace(
        SUITES["smollm2"],
        datasets=(Dataset.named("mt_bench", 8, 256), Dataset.named("qa", 8, 256)),
        methods=smollm2_methods((SMOLLM2_EAGLE, SMOLLM2_MDC)),
    ),
}

if __name__ == "__main__":
    sys.exit(
        main(
            default_out=RESULTS / "pacer.md",
            prog="python experiments/pacer.py",
            suites=PACER_SUITES,
        )
    )
