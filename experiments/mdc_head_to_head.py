"""The mdc against the shipped eagle under the same data, steps and continuations (issue
"Drafters v2", point 4), as one resumable chain of commands.

The mdc gets the eagle's card recipe stage for stage (checkpoints/smollm2-eagle/CARD.md: 9,600 steps
from scratch without the evaluation-like answers, then three 500-step continuations on the first 9,
24 and 40 shards of self-written answers) with six unrolled levels and four path tokens (its
products in bfloat16 with float32 accumulation, the mdc recipe's default and its continuations':
~0.54x the step time of float32 on an AMX CPU, ~1% lower tau at equal steps; the eagle's in
float32), then both drafters' taus are paired on MT-bench and on EAGLE's qa, sum and gsm8k (the
eagle's from the committed drafter_tau_eagle_clean_1500b*.json, which decoded the shipped eagle;
greedy taus are deterministic on one machine, so rerun those two files first on another kind of
CPU). The chain itself is experiments/card_chain.py.

    python experiments/mdc_head_to_head.py            # run or resume every stage left
    python experiments/mdc_head_to_head.py --dry-run  # print the commands and what is done

A stage is skipped once its output exists; a training stage that was stopped resumes from its
`<out>/smollm2-mdc.resume` save (train_drafters saves every 10 minutes). On 2 CPU cores the first
stage is ~6.4 h of steps after ~1 h of teacher-forced features (experiments/cache/), the
continuations ~25 min each, the taus ~40 min, drafters.py's SmolLM2 suite (tau, reuse, chain calls
and wall clock of both drafters; needs the CPU to itself) ~15 min: more than one 3-hour session, so
it needs runs/ and experiments/cache/ to survive between sessions, or an accelerator.
"""

from __future__ import annotations

import argparse
import sys

from card_chain import REPO, card_stages, chain_result, run_stages

RUNS = "runs/mdc6p4c"
MDC = ["--train", "levels=6", "--recipe", "path_tokens=4",
       "--recipe", "drop_evaluation_like=True", "--no-calibrate"]  # fmt: skip


DRAFTERS = "experiments/results/drafters_mdc6p4_clean"


def stages():
    """(name, command arguments after `python`, the file whose existence means done): the card's
    chain, then the two drafters' reuse, chain calls and wall clock side by side (drafters.py's
    SmolLM2 suite with the candidate mdc)."""
    chain = card_stages(
        "smollm2-mdc",
        RUNS,
        MDC,
        continuation_args=["--train", 'products="bfloat16"'],
        tau_prefix="experiments/results/drafter_tau_mdc6p4_clean",
    )
    speed = ["experiments/drafters.py", "--only", "smollm2",
             "--smollm2-mdc", chain_result("smollm2-mdc", RUNS),
             "--out", f"{DRAFTERS}.md"]  # fmt: skip
    return [*chain, ("drafters", speed, REPO / f"{DRAFTERS}.json")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the stages and stop")
    args = parser.parse_args(argv)
    return run_stages(stages(), tag="head-to-head", dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
