"""What a user waits for on the first call of the default (SpecConfig.auto()): SmolLM2-135M with
its eagle drafter on the first B MT-bench first turns, with an empty cost cache, every progress
line of the measurement stamped with the seconds since the call began. Then the same call again
(costs read from the cache, programs compiled), and the same call in new processes: two with
the measured costs only, then two that also read the compiled programs back (JAX's persistent
compilation cache, which the `specjax` command line turns on: specjax.compile_cache). Each
process's load time (target, tokenizer, drafter) is given too, and the other shipped drafter's
first call in the first process (the target's costs are then on disk; its drafter's are not).
Writes experiments/results/first_call.md.

    python experiments/first_call.py                 # B=1, 64 new tokens, the eagle first
    python experiments/first_call.py --batch 8
    python experiments/first_call.py --drafter mdc --out /tmp/first_call_mdc.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax

from specjax.paths import SMOLLM2_EAGLE, SMOLLM2_MDC

RESULTS = Path(__file__).resolve().parent / "results"


DRAFTERS = {"eagle": SMOLLM2_EAGLE, "mdc": SMOLLM2_MDC}


def _load_drafter(name: str, target):
    import specjax
    from specjax.paths import repo_dir

    return specjax.load_drafter(repo_dir() / DRAFTERS[name], target)


def _load(batch: int, drafter_name: str):
    """(target, tokenizer, drafter, prompts, seconds spent loading)."""
    import specjax
    from specjax.datasets import encode_question, read_spec_bench, select_questions
    from specjax.paths import SMOLLM2, shared_path

    start = time.perf_counter()
    loaded = specjax.load(shared_path(SMOLLM2))
    tok = loaded.tokenizer
    questions = select_questions(read_spec_bench("mt_bench_question.jsonl"), 80)
    prompts = [encode_question(tok, q.turns[0]) for q in questions][:batch]
    drafter = _load_drafter(drafter_name, loaded.model)
    return loaded.model, tok, drafter, prompts, time.perf_counter() - start


def _call(target, tok, drafter, prompts, max_new_tokens):
    import specjax

    out = specjax.speculative_generate(
        target, drafter, prompts, max_new_tokens=max_new_tokens, eos_id=tok.eos_id
    )
    return jax.block_until_ready(out)


def one_call(args) -> int:
    """A new process: load, one call, its seconds as JSON on the last line."""
    from specjax.compile_cache import enable_compilation_cache

    enable_compilation_cache()  # None where $SPECJAX_COMPILATION_CACHE=0
    target, tok, drafter, prompts, load_s = _load(args.batch, args.drafter)
    start = time.perf_counter()
    out = _call(target, tok, drafter, prompts, args.max_new_tokens)
    call_s = time.perf_counter() - start
    print(json.dumps({"load": load_s, "call": call_s, "tree": str(out.stats.get("tree"))}))
    return 0


def new_process(args, *, compiled_programs: bool) -> dict:
    env = dict(os.environ, SPECJAX_COMPILATION_CACHE="1" if compiled_programs else "0")
    argv = [sys.executable, __file__, "--one-call", "--batch", str(args.batch)]
    argv += ["--drafter", args.drafter]
    argv += ["--max-new-tokens", str(args.max_new_tokens)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--drafter", choices=sorted(DRAFTERS), default="eagle")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default=str(RESULTS / "first_call.md"))
    parser.add_argument("--one-call", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_call:
        return one_call(args)

    cache = tempfile.mkdtemp(prefix="specjax-first-call-")
    os.environ["SPECJAX_CACHE"] = cache  # empty: everything is measured
    os.environ["SPECJAX_COMPILATION_CACHE"] = "1"

    from specjax import autotune, choice
    from specjax.benchmark import device_header
    from specjax.compile_cache import enable_compilation_cache

    enable_compilation_cache()  # as the command line does: <cache>/xla, empty
    target, tok, drafter, prompts, load_s = _load(args.batch, args.drafter)

    stamps: list[tuple[float, str]] = []
    start = 0.0

    def stamp(message: str) -> None:
        stamps.append((time.perf_counter() - start, message))
        print(f"[{stamps[-1][0]:6.1f}s] {message}", file=sys.stderr, flush=True)

    autotune._print_progress = stamp  # the progress lines of the measurement, stamped
    choice._say = stamp

    start = time.perf_counter()
    out = _call(target, tok, drafter, prompts, args.max_new_tokens)
    first = time.perf_counter() - start
    first_stamps = list(stamps)  # the table is the first call's; the second call's lines go on
    t0 = time.perf_counter()
    _call(target, tok, drafter, prompts, args.max_new_tokens)
    second = time.perf_counter() - t0
    other = next(name for name in DRAFTERS if name != args.drafter)
    other_drafter = _load_drafter(other, target)
    t0 = time.perf_counter()
    other_out = _call(target, tok, other_drafter, prompts, args.max_new_tokens)
    other_first = time.perf_counter() - t0
    # Each new process runs twice: the first may still time a tree the ledger lacks (a new
    # process starts from the calibrated acceptance, not this one's adapted shift) and compile
    # what no earlier process wrote.
    print("[first_call] new processes ...", file=sys.stderr, flush=True)
    runs = [
        (label, new_process(args, compiled_programs=programs))
        for label, programs in [
            ("a new process, costs cached", False),
            ("another new process, costs cached", False),
            ("a new process, costs and compiled programs cached", True),
            ("another new process, costs and compiled programs cached", True),
        ]
    ]

    lines = [
        "# The default call's first call",
        "",
        device_header(
            model="SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to float32) + "
            + DRAFTERS[args.drafter],
            prompts=f"first {args.batch} MT-bench first turn(s), chat template, "
            f"{args.max_new_tokens} new tokens, greedy",
            command="python experiments/first_call.py " + " ".join(argv or sys.argv[1:]),
        ),
        "",
        "| the call | loading (s) | the call (s) | chosen |",
        "|---|---|---|---|",
        f"| first call, empty caches | {load_s:.1f} | {first:.1f} | {out.stats.get('tree')} |",
        f"| the same call again, same process | | {second:.1f} | |",
        f"| {DRAFTERS[other]}'s first call, same process | | {other_first:.1f} | "
        f"{other_out.stats.get('tree')} |",
        *(f"| {label} | {r['load']:.1f} | {r['call']:.1f} | {r['tree']} |" for label, r in runs),
        "",
        "| seconds into the first call | progress line |",
        "|---|---|",
        *(f"| {t:.1f} | {m} |" for t, m in first_stamps),
        f"| {first:.1f} | done |",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print(f"[first_call] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
