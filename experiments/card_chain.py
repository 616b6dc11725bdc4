"""The SmolLM2 eagle card's training chain (checkpoints/smollm2-eagle/CARD.md) as resumable
stages: training from scratch, three 500-step continuations on the first 9, 24 and 40 shards of
self-written answers, then greedy taus on MT-bench and on EAGLE's qa, sum and gsm8k paired with
the shipped eagle's committed taus. experiments/mdc_head_to_head.py and
experiments/eagle_longer.py are this chain with other drafter settings.

A stage is skipped once its output exists and is newer than the output of the stage before it
(a stage run again makes every later one run again); a training stage that was stopped resumes
from its `<out>/<drafter>.resume` save (train_drafters saves every 10 minutes), so rerunning
the same command after an interruption carries on where it stopped.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The eagle's continuations (its CARD.md, steps 2-4): seed, self-written shards, output suffix.
CONTINUATIONS = ((1, 9, "self500"), (2, 24, "self1000"), (3, 40, "self1500"))
# The shipped eagle's greedy taus (decoded by drafter_tau.py on the machine each file records)
# and its name in them.
EAGLE_TAUS = "experiments/results/drafter_tau_eagle_clean_1500b"
EAGLE_NAME = "eagle_clean_self1500b/smollm2-eagle"
SHIPPED_EAGLE = "checkpoints/smollm2-eagle"


def eagle_pairing(taus_json: str, machine: str | None = None) -> list[str]:
    """drafter_tau arguments that compare a candidate with the shipped eagle: its committed
    per-prompt taus where they were decoded on this machine (greedy taus reproduce there
    only; machine: specjax.benchmark.machine_line()), else the shipped eagle decoded beside the
    candidate (the stage then takes twice as long)."""
    if machine is None:
        from specjax.benchmark import machine_line

        machine = machine_line()
    recorded = json.loads((REPO / taus_json).read_text()).get("machine")
    if recorded == machine:
        return ["--baseline", taus_json, "--baseline-name", EAGLE_NAME]
    return ["--drafter", SHIPPED_EAGLE]


def chain_result(drafter: str, runs: str) -> str:
    """The drafter folder the chain's last continuation writes (what the taus measure)."""
    return f"{runs}_{CONTINUATIONS[-1][2]}/{drafter}"


def card_stages(
    drafter: str,
    runs: str,
    train_args: Sequence[str],
    *,
    scratch_args: Sequence[str] = (),
    continuation_args: Sequence[str] = (),
    tau_prefix: str,
    machine: str | None = None,
) -> list[tuple[str, list[str], Path]]:
    """(name, command arguments after `python`, the file whose existence means done) for each
    stage, in order.

    drafter: the train_drafters recipe ("smollm2-mdc"); runs: the output folders' prefix
    (stage folders are `<runs>_scratch`, `<runs>_self500`, ...); train_args: arguments every
    training stage gets; scratch_args / continuation_args: arguments for the first stage only /
    for the continuations only; tau_prefix: the tau results' path without its suffix (writes
    `<tau_prefix>.md` for MT-bench, `<tau_prefix>_tasks.md` for the three sets); machine:
    this machine's description (eagle_pairing; default: this one's).
    """
    train = ["experiments/train_drafters.py", "--only", drafter, *train_args]
    out = [("scratch", [*train, *scratch_args, "--out", f"{runs}_scratch"],
            REPO / f"{runs}_scratch" / drafter / "drafter.json")]  # fmt: skip
    previous = f"{runs}_scratch"
    for seed, shards, suffix in CONTINUATIONS:
        sets = f'("smollm2-self", {shards}), ("smollm2-broad", 4), ("smollm2-tasks", 4)'
        folder = f"{runs}_{suffix}"
        out.append((suffix, [*train, "--steps", "500", "--train", "lr=5e-4",
                             "--train", f"seed={seed}", *continuation_args,
                             "--init-from", f"{previous}/{drafter}",
                             "--recipe", "max_shards=8", "--recipe", f"extra_sets=({sets})",
                             "--out", folder],
                    REPO / folder / drafter / "drafter.json"))  # fmt: skip
        previous = folder
    for sets, suffix in ((["mt_bench"], ""), (["qa", "sum", "gsm8k"], "_tasks")):
        result = f"{tau_prefix}{suffix}"
        out.append((f"tau{suffix or '_mt_bench'}",
                    ["experiments/drafter_tau.py", "--drafter", chain_result(drafter, runs),
                     *eagle_pairing(f"{EAGLE_TAUS}{suffix}.json", machine),
                     "--sets", *sets, "--temperatures", "0", "--out", f"{result}.md"],
                    REPO / f"{result}.json"))  # fmt: skip
    return out


def stage_done(done: Path, before: float) -> bool:
    """A stage's output exists and was written after the stage before it finished (before: that
    output's modification time; 0 for the first stage): an earlier stage run again since makes
    this one stale."""
    return done.exists() and done.stat().st_mtime >= before


def run_stages(stages, *, tag: str, dry_run: bool = False) -> int:
    """Run each stage that is not done (stage_done), in order (a failing stage stops the chain);
    with dry_run, print the commands and what is done."""
    before = 0.0
    for name, command, done in stages:
        shown = shlex.join(["python", *command])
        if stage_done(done, before):
            shown_done = done.relative_to(REPO) if done.is_relative_to(REPO) else done
            print(f"[{tag}] {name}: done ({shown_done})", flush=True)
        else:
            stale = " (its output predates the stage before it)" if done.exists() else ""
            print(f"[{tag}] {name}{stale}: {shown}", flush=True)
            if dry_run:
                before = float("inf")  # every later stage runs too
                continue
            subprocess.run([sys.executable, *command], cwd=REPO, check=True)
            if not done.exists():
                raise SystemExit(f"[{tag}] {name} finished without writing {done}")
        before = done.stat().st_mtime
    return 0
