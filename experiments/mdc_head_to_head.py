"""The mdc against the shipped eagle under the same data, steps and continuations (issue
"Drafters v2", point 4), as one resumable chain of commands.

The mdc gets the eagle's card recipe stage for stage (checkpoints/smollm2-eagle/CARD.md: 9,600
steps from scratch without the evaluation-like answers, then three 500-step continuations on
the first 9, 24 and 40 shards of self-written answers) with six unrolled levels and four path
tokens, then both drafters' taus are paired on MT-bench and on EAGLE's qa, sum and gsm8k (the
eagle's from the committed drafter_tau_eagle_clean_1500b*.json, which decoded the shipped
eagle; greedy taus are deterministic on one machine, so rerun those two files first on another
kind of CPU).

    python experiments/mdc_head_to_head.py            # run or resume every stage left
    python experiments/mdc_head_to_head.py --dry-run  # print the commands and what is done

A stage is skipped once its output exists; a training stage that was stopped resumes from its
`<out>/smollm2-mdc.resume` save (train_drafters saves every 10 minutes). On 2 CPU cores the
first stage is ~6.4 h of steps after ~1 h of teacher-forced features (experiments/cache/), the
continuations ~25 min each, the taus ~40 min: more than one 3-hour session, so it needs runs/
and experiments/cache/ to survive between sessions, or an accelerator.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = "runs/mdc6p4c"
MDC = ["--only", "smollm2-mdc", "--train", "levels=6", "--recipe", "path_tokens=4",
       "--recipe", "drop_evaluation_like=True", "--no-calibrate"]  # fmt: skip
# The eagle's continuations (its CARD.md, steps 2-4): seed, self-written shards, output suffix.
CONTINUATIONS = ((1, 9, "self500"), (2, 24, "self1000"), (3, 40, "self1500"))
EAGLE_TAUS = "experiments/results/drafter_tau_eagle_clean_1500b"
EAGLE_NAME = "eagle_clean_self1500b/smollm2-eagle"


def stages() -> list[tuple[str, list[str], Path]]:
    """(name, command arguments after `python`, the file whose existence means done)."""
    out = [("scratch", ["experiments/train_drafters.py", *MDC, "--out", f"{RUNS}_scratch"],
            REPO / f"{RUNS}_scratch" / "smollm2-mdc" / "drafter.json")]  # fmt: skip
    previous = f"{RUNS}_scratch"
    for seed, shards, suffix in CONTINUATIONS:
        sets = f'("smollm2-self", {shards}), ("smollm2-broad", 4), ("smollm2-tasks", 4)'
        folder = f"{RUNS}_{suffix}"
        out.append((suffix, ["experiments/train_drafters.py", *MDC, "--steps", "500",
                             "--train", "lr=5e-4", "--train", f"seed={seed}",
                             "--train", 'products="bfloat16"',
                             "--init-from", f"{previous}/smollm2-mdc",
                             "--recipe", "max_shards=8", "--recipe", f"extra_sets=({sets})",
                             "--out", folder],
                    REPO / folder / "smollm2-mdc" / "drafter.json"))  # fmt: skip
        previous = folder
    for sets, suffix in ((["mt_bench"], ""), (["qa", "sum", "gsm8k"], "_tasks")):
        result = f"experiments/results/drafter_tau_mdc6p4_clean{suffix}"
        out.append((f"tau{suffix or '_mt_bench'}",
                    ["experiments/drafter_tau.py", "--drafter", f"{previous}/smollm2-mdc",
                     "--baseline", f"{EAGLE_TAUS}{suffix}.json", "--baseline-name", EAGLE_NAME,
                     "--sets", *sets, "--temperatures", "0", "--out", f"{result}.md"],
                    REPO / f"{result}.json"))  # fmt: skip
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the stages and stop")
    args = parser.parse_args(argv)
    for name, command, done in stages():
        shown = shlex.join(["python", *command])
        if done.exists():
            print(f"[head-to-head] {name}: done ({done.relative_to(REPO)})", flush=True)
            continue
        print(f"[head-to-head] {name}: {shown}", flush=True)
        if args.dry_run:
            continue
        subprocess.run([sys.executable, *command], cwd=REPO, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
