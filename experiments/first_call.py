"""What a user waits for on the first call of the default (SpecConfig.auto()): SmolLM2-135M with
its eagle drafter on the first B MT-bench first turns, with an empty cost cache, every progress
line of the measurement stamped with the seconds since the call began. Then the same call again
(costs read from the cache, programs compiled). Writes experiments/results/first_call.md.

    python experiments/first_call.py                 # B=1, 64 new tokens
    python experiments/first_call.py --batch 8
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import jax

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default=str(RESULTS / "first_call.md"))
    args = parser.parse_args(argv)

    cache = tempfile.mkdtemp(prefix="specjax-first-call-")
    os.environ["SPECJAX_CACHE"] = cache  # empty: everything is measured

    import specjax
    from specjax import autotune, choice
    from specjax.benchmark import device_header
    from specjax.datasets import encode_question, read_spec_bench, select_questions
    from specjax.paths import SMOLLM2, SMOLLM2_EAGLE, repo_dir, shared_path

    loaded = specjax.load(shared_path(SMOLLM2))
    tok = loaded.tokenizer
    questions = select_questions(read_spec_bench("mt_bench_question.jsonl"), 80)
    prompts = [encode_question(tok, q.turns[0]) for q in questions][: args.batch]
    drafter = specjax.load_drafter(repo_dir() / SMOLLM2_EAGLE, loaded.model)

    stamps: list[tuple[float, str]] = []
    start = 0.0

    def stamp(message: str) -> None:
        stamps.append((time.perf_counter() - start, message))
        print(f"[{stamps[-1][0]:6.1f}s] {message}", file=sys.stderr, flush=True)

    autotune._print_progress = stamp  # the progress lines of the measurement, stamped
    choice._say = stamp

    def call():
        out = specjax.speculative_generate(
            loaded.model, drafter, prompts, max_new_tokens=args.max_new_tokens, eos_id=tok.eos_id
        )
        return jax.block_until_ready(out)

    start = time.perf_counter()
    out = call()
    first = time.perf_counter() - start
    t0 = time.perf_counter()
    call()
    second = time.perf_counter() - t0

    lines = [
        "# The default call's first call",
        "",
        device_header(
            model="SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to float32) + checkpoints/"
            "smollm2-eagle",
            prompts=f"first {args.batch} MT-bench first turn(s), chat template, "
            f"{args.max_new_tokens} new tokens, greedy",
            command="python experiments/first_call.py " + " ".join(argv or sys.argv[1:]),
        ),
        "",
        f"First call (empty cost cache): {first:.1f} s; the same call again: {second:.1f} s. "
        f"Chosen: {out.stats.get('tree')}.",
        "",
        "| seconds into the first call | progress line |",
        "|---|---|",
        *(f"| {t:.1f} | {m} |" for t, m in stamps),
        f"| {first:.1f} | done |",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print(f"[first_call] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
