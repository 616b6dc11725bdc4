"""HiSpec's intermediate verification over draft trees, measured: each trained drafter with the
full target verifying every node, and with the trained verify exit (checkpoints/<target>-hispec)
screening the tree so that the layers above the exit run on the exit's path only. Same harness
as experiments/bench.py (interleaved repetitions in one process, specjax autoregressive decoding
as the baseline, greedy output compared token for token). Writes experiments/results/hispec.md.

    python experiments/hispec.py                          # both targets, T = 0 and 1
    python experiments/hispec.py --targets smollm2 --temperatures 0

Trees: the 31-node tree the trained drafters were benchmarked with (where verification of many
nodes costs the most, and the exit saves the most) and the small tree SpecConfig.auto() chose
on the 2-core CPU (dynamic(7,3,4)); the draft exit drafts a chain of 4. SmolLM2 runs its eagle
drafter (mdc is within a few percent of it on MT-bench), stories260K both.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from bench_suites import FEATURE_TREE, SUITES

from specjax.bench import AR, SPEC, Method, main
from specjax.config import TreeConfig
from specjax.paths import SMOLLM2_EAGLE, STORIES260K_EAGLE, STORIES260K_MDC

RESULTS = Path(__file__).resolve().parent / "results"
SMALL_TREE = TreeConfig.dynamic(7, 3, 4)
EXIT_CHAIN = TreeConfig.chain(4)


def methods(drafters, exit_heads):
    """Each drafter at both trees, with and without the verify exit; and HiSpec's draft exit
    drafting a chain of 4, with and without the verify exit (the three levels)."""
    rows = [Method(kind=AR)]
    for tree in (FEATURE_TREE, SMALL_TREE):
        for drafter in drafters:
            rows.append(Method(kind=SPEC, drafter=drafter, tree=tree))
            rows.append(Method(kind=SPEC, drafter=drafter, tree=tree, exit_heads=exit_heads))
    exit_drafter = f"exit:{exit_heads}"
    rows.append(Method(kind=SPEC, drafter=exit_drafter, tree=EXIT_CHAIN))
    rows.append(Method(kind=SPEC, drafter=exit_drafter, tree=EXIT_CHAIN, exit_heads=exit_heads))
    return tuple(rows)


# The targets and prompt sets of bench_suites.py with these methods.
HISPEC_SUITES = {
    "stories260K": dataclasses.replace(
        SUITES["stories260K"],
        methods=methods((STORIES260K_EAGLE, STORIES260K_MDC), "checkpoints/stories260K-hispec"),
    ),
    "smollm2": dataclasses.replace(
        SUITES["smollm2"], methods=methods((SMOLLM2_EAGLE,), "checkpoints/smollm2-hispec")
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
