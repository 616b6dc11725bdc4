"""Spec-Bench-style benchmark: specjax methods x datasets x temperatures, side by side with
specjax autoregressive decoding and Hugging Face transformers (plain, assisted and prompt-lookup
generation) on the same weights. Writes experiments/results/bench.md, bench.json and the plots
bench_tau.png, bench_speedup.png, bench_accepted.png.

    python experiments/bench.py            # the full default run (CPU, see README for the time)
    python experiments/bench.py --quick    # smoke run: 2 prompts x 8 tokens, 1 repetition
    python experiments/bench.py --targets smollm2 --datasets mt_bench,gsm8k --n-prompts 20
    python experiments/bench.py --prompts my_spec_bench_questions.jsonl --targets smollm2

The harness lives in specjax.bench (also behind `specjax bench`); see its docstring for the
definition of every column. The default targets, datasets and methods are the suites of
experiments/bench_suites.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench_suites import SUITES

from specjax.bench import main

RESULTS = Path(__file__).resolve().parent / "results"

if __name__ == "__main__":
    sys.exit(
        main(default_out=RESULTS / "bench.md", prog="python experiments/bench.py", suites=SUITES)
    )
