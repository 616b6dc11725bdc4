"""HiSpec measured with the trained exit heads (checkpoints/<target>-hispec), side by side in one
process: specjax autoregressive decoding; single-level early-exit self-speculation with the draft
exit (LayerSkip-style, the full target verifies its chain: the paper's baseline); HiSpec's three
levels (specjax.hispec: draft exit, verify exit, buffered full verification, one shared cache) at
two settings; and a trained feature drafter's tree verified by the full target alone and screened
by the verify exit (specjax.verifiers.early_exit). Same harness as experiments/bench.py
(interleaved repetitions, greedy output compared token for token). Writes
experiments/results/hispec.md.

    python experiments/hispec.py --targets smollm2        # MT-bench and EAGLE's qa, T = 0 and 1
    python experiments/hispec.py --targets stories260K --temperatures 0
    python experiments/hispec.py --targets smollm2-screening --temperatures 0 \
        --out experiments/results/hispec_tree_screening.md    # point 3: a large tree screened

tau of a HiSpec row: tokens per full-target call (a buffer flush).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from bench_suites import FEATURE_TREE, SUITES

from specjax.bench import AR, SPEC, Dataset, Method, main
from specjax.config import TreeConfig
from specjax.paths import (
    SMOLLM2_EAGLE,
    SMOLLM2_HISPEC,
    STORIES260K_EAGLE,
    STORIES260K_HISPEC,
    STORIES260K_MDC,
)

RESULTS = Path(__file__).resolve().parent / "results"
SMALL_TREE = TreeConfig.dynamic(7, 3, 4)
# The single-level baseline at a short and the paper-like chain: with exits that agree with the
# last layer on about a third of tokens a chain of 1 is its best length, so HiSpec is compared
# against that and not only against a chain that drafts mostly rejected tokens.
EXIT_CHAINS = (1, 4)
# (draft length k, buffer): short drafts for exits that agree with the layer above on about a
# third of tokens, and the paper-like longer setting.
HISPEC_SETTINGS = ((1, 2), (3, 4))


def methods(drafters, exit_heads):
    """The single-level baseline, HiSpec's three levels, each drafter's small tree with and
    without the verify exit screening it."""
    name = Path(exit_heads).name
    rows = [Method(kind=AR)]
    rows += [
        Method(kind=SPEC, drafter=f"exit:{exit_heads}", tree=TreeConfig.chain(k))
        for k in EXIT_CHAINS
    ]
    for k, buffer in HISPEC_SETTINGS:
        rows.append(
            Method(
                kind=SPEC,
                drafter=f"{exit_heads}:buffer{buffer}",
                tree=TreeConfig.chain(k),
                label=f"HiSpec three levels ({name}) chain {k}, buffer {buffer}",
            )  # fmt: skip
        )
    # The feature drafters without their pre-verifiers (`:nopv`): a pre-verifier would prune
    # the tree before either verifier sees it, and the two rows compare verifiers on one tree.
    for drafter in drafters:
        whole = f"{drafter}:nopv"
        rows.append(Method(kind=SPEC, drafter=whole, tree=SMALL_TREE))
        rows.append(Method(kind=SPEC, drafter=whole, tree=SMALL_TREE, exit_heads=exit_heads))
    return tuple(rows)


def screening_methods(drafter, exit_heads, tree=FEATURE_TREE):
    """A feature drafter's large tree verified by the whole target and screened by the verify
    exit: where a tree's verification costs most, the screen has the most to save."""
    whole = f"{drafter}:nopv"
    return (
        Method(kind=AR),
        Method(kind=SPEC, drafter=whole, tree=tree),
        Method(kind=SPEC, drafter=whole, tree=tree, exit_heads=exit_heads),
    )


# The targets and prompt sets of bench_suites.py with these methods.
HISPEC_SUITES = {
    "stories260K": dataclasses.replace(
        SUITES["stories260K"],
        methods=methods((STORIES260K_EAGLE, STORIES260K_MDC), STORIES260K_HISPEC),
    ),
    "smollm2": dataclasses.replace(
        SUITES["smollm2"],
        datasets=(Dataset.named("mt_bench", 8, 64), Dataset.named("qa", 8, 64)),
        methods=methods((SMOLLM2_EAGLE,), SMOLLM2_HISPEC),
    ),
    "smollm2-screening": dataclasses.replace(
        SUITES["smollm2"],
        datasets=(Dataset.named("mt_bench", 8, 64),),
        methods=screening_methods(SMOLLM2_EAGLE, SMOLLM2_HISPEC),
    ),
}

if __name__ == "__main__":
    sys.exit(
        main(
            default_out=RESULTS / "hispec.md",
            prog="python experiments/hispec.py",
            suites=HISPEC_SUITES,
        )
    )
