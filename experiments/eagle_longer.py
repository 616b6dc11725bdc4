"""The SmolLM2 eagle's card recipe with twice the steps from scratch (issue "Drafters v2": tau
>= 2.8 on MT-bench), as one resumable chain of commands.

The shipped eagle (checkpoints/smollm2-eagle/CARD.md) trained 9,600 steps from scratch in
float32, then three 500-step continuations on self-written answers. Doubling the first stage
has been the lever that moved MT-bench tau: 2,400 -> 4,800 -> 9,600 steps gained 0.10-0.15
each time, while more continuations (+0.006) and a weight average (+0.010) added nothing
measurable. This chain trains the first stage for 19,200 steps with bfloat16 products (float32
accumulation: ~0.54x a float32 step on an AMX CPU, ~1% lower tau at equal steps, so about the
wall time of 10,400 float32 steps), keeps the card's continuations as they are, and pairs the
result's taus with the shipped eagle's on MT-bench and on EAGLE's qa, sum and gsm8k
(experiments/card_chain.py).

    python experiments/eagle_longer.py            # run or resume every stage left
    python experiments/eagle_longer.py --dry-run  # print the commands and what is done

On 2 CPU cores (AMX) the first stage is ~6 h, the continuations ~15 min each, the taus ~40
min: it needs runs/ to survive between sessions, or an accelerator. The candidate ships only
if it measures better (then calibrate_drafters.py and train_pre_verifier.py, as the card's
last step says).
"""

from __future__ import annotations

import argparse
import sys

from card_chain import card_stages, run_stages

STEPS = 19_200


def stages(steps: int = STEPS, name: str | None = None):
    """(name, command arguments after `python`, the file whose existence means done).

    name: the runs/ folders' prefix and the tau results' suffix (default `eagle<steps>`); a
    rerun of the chain under another name keeps the first run's committed taus."""
    name = name or f"eagle{steps}"
    return card_stages(
        "smollm2-eagle",
        f"runs/{name}",
        ["--recipe", "drop_evaluation_like=True", "--no-calibrate"],
        scratch_args=["--steps", str(steps), "--train", 'products="bfloat16"'],
        tau_prefix=f"experiments/results/drafter_tau_{name}",
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the stages and stop")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps from scratch")
    parser.add_argument(
        "--name", help="runs/ folder prefix and tau results suffix (default eagle<steps>)"
    )
    args = parser.parse_args(argv)
    return run_stages(stages(args.steps, args.name), tag="eagle-longer", dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
