"""How a drafter's greedy acceptance profile depends on where the calibration prompts come from:
held-in sources (the card's former mix of the broad and task generators, each of the project's
prompt generators alone, user turns the target writes itself, which SpecConfig.auto()'s profiles
are now measured on) against evaluation sets the drafters never trained on (MT-bench, EAGLE's
qa; evaluation only: nothing here is written into a checkpoint or a cache).

    python experiments/acceptance_by_source.py                       # both SmolLM2 drafters
    python experiments/acceptance_by_source.py --drafter checkpoints/smollm2-eagle --n 16
    python experiments/acceptance_by_source.py --source "self-written turns" --source \
        "MT-bench first turns"                                       # some sources only

Each source: n prompts (chat template) decoded greedily with the calibration probe, dynamic
(63, 8, 4), max_new_tokens each (specjax.acceptance.calibrate, as experiments/calibrate_drafters.py
does), then the tau the profile predicts for the trees the default call weighs. Why: the default
call's predicted speedups on MT-bench run 20-40% above the measured ones (bench.md, pacer.md);
this separates what the acceptance model gets wrong from what the prompts change (for greedy
decoding the dynamic-tree model is exact on the prompts it was measured on). Writes
experiments/results/acceptance_by_source.md. ~1 min per source and drafter on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TREES = ((3, 2, 4), (7, 3, 4), (15, 5, 4), (31, 6, 4))


def sources(model, tokenizer, n: int, only=None) -> dict:
    """{name: (token-id prompts, held-in?)}; only: the names to build (None: all)."""
    from specjax.calibration import CALIBRATION_SEED, calibration_prompts, held_in_prompts
    from specjax.datasets import (
        SPEC_BENCH_FILES,
        encode_question,
        read_spec_bench,
        select_questions,
    )
    from specjax.train.broad_prompts import broad_prompts
    from specjax.train.prompts import synthetic_prompts
    from specjax.train.task_prompts import task_prompts

    def chat(texts):
        return [encode_question(tokenizer, t) for t in texts]

    def evaluation(name):
        questions = select_questions(read_spec_bench(SPEC_BENCH_FILES[name]), n)
        return chat([q.turns[0] for q in questions])

    makers = {
        "card's calibration mix (broad + task)": (
            lambda: held_in_prompts("chat", tokenizer, n)[0], True),
        "broad_prompts": (lambda: chat(broad_prompts(n, seed=CALIBRATION_SEED)), True),
        "task_prompts": (lambda: chat(task_prompts(n, seed=CALIBRATION_SEED)), True),
        "synthetic_prompts": (lambda: chat(synthetic_prompts(n, seed=CALIBRATION_SEED)), True),
        "self-written turns": (lambda: calibration_prompts("chat", model, tokenizer, n)[0], True),
        "MT-bench first turns": (lambda: evaluation("mt_bench"), False),
        "EAGLE qa first turns": (lambda: evaluation("qa"), False),
    }  # fmt: skip
    unknown = set(only or ()) - set(makers)
    if unknown:
        raise SystemExit(f"unknown sources {sorted(unknown)}; choose from {sorted(makers)}")
    return {
        name: (make(), held_in)
        for name, (make, held_in) in makers.items()
        if only is None or name in only
    }


def main(argv=None) -> int:
    import specjax
    from specjax.acceptance import calibrate
    from specjax.benchmark import device_header
    from specjax.config import TreeConfig
    from specjax.drafters import load_drafter
    from specjax.paths import SMOLLM2, SMOLLM2_EAGLE, SMOLLM2_MDC, repo_dir, shared_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", action="append", default=None, help="drafter directory")
    parser.add_argument("--n", type=int, default=8, help="prompts per source")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--source", action="append", default=None, help="only these sources")
    parser.add_argument("--out", default=str(RESULTS / "acceptance_by_source.md"))
    args = parser.parse_args(argv)

    t_start = time.perf_counter()
    loaded = specjax.load(shared_path(SMOLLM2))
    probe = TreeConfig.dynamic(63, 8, 4)
    prompt_sets = sources(loaded.model, loaded.tokenizer, args.n, args.source)
    paths = args.drafter or [repo_dir() / p for p in (SMOLLM2_EAGLE, SMOLLM2_MDC)]
    rows = []
    for path in map(Path, paths):
        drafter = load_drafter(path, loaded.model, pre_verifier=False)
        for name, (prompts, held_in) in prompt_sets.items():
            profile = calibrate(loaded.model, drafter, prompts, probe=probe,
                                max_new_tokens=args.max_new_tokens,
                                eos_id=loaded.tokenizer.eos_id)  # fmt: skip
            taus = [profile.predict_tau(TreeConfig.dynamic(*t)) for t in TREES]
            rows.append((path.name, name, held_in, profile, taus))
            print(f"{path.name} | {name}: probe tau {profile.measured_tau:.2f}", flush=True)

    tree_heads = " | ".join(f"dynamic{t}" for t in TREES)
    command = "python experiments/acceptance_by_source.py " + shlex.join(argv or sys.argv[1:])
    lines = [
        "# Acceptance by prompt source: held-in calibration prompts against evaluation sets",
        "",
        f"- command: `{command}`",
        device_header(),
        f"- {args.n} prompts per source (chat template), {args.max_new_tokens} new tokens, "
        "greedy, calibration probe dynamic(63,8,4) without a pre-verifier; held-in sources "
        "drawn with the calibration seed (specjax.calibration.CALIBRATION_SEED), evaluation "
        "sets round-robin over categories (evaluation only)",
        f"- wall time: {(time.perf_counter() - t_start) / 60:.1f} min",
        "",
        f"| drafter | prompts | held-in | row-steps | probe tau | depth-1 acceptance | "
        f"{tree_heads} |",
        "|---|---|---|---|---|---|" + "---|" * len(TREES),
    ]
    for drafter, name, held_in, profile, taus in rows:
        lines.append(
            f"| {drafter} | {name} | {'yes' if held_in else 'no'} | {profile.steps} | "
            f"{profile.measured_tau:.2f} | {profile.depth_accept()[0]:.2f} | "
            + " | ".join(f"{t:.2f}" for t in taus)
            + " |"
        )
    lines += [
        "",
        "probe tau: tokens per target call of the probe tree itself; dynamic(nodes, depth, "
        "top-k): the tau the profile predicts for that tree (exact for greedy decoding on these "
        "prompts, specjax.acceptance). The default call predicts from the card's profile, measured "
        "on self-written turns (specjax.calibration.calibration_prompts; before, on the card's "
        "mix), and scales acceptance by what its earlier calls measured (specjax.adaptation).",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
