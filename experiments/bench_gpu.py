"""The benchmark of experiments/bench.py on a GPU, sized for a short accelerator session: both
reference targets, the default call (SpecConfig.auto(): the tree chosen from costs measured on
this GPU) for each trained drafter and the draft model, the chosen tree run even where plain
decoding is predicted faster, the 31-node tree the README recommended before the default, and
transformers generate on the same GPU. Writes experiments/results/bench_gpu.md (+ json, plots).

    python experiments/bench_gpu.py
    python experiments/bench_gpu.py --targets smollm2 --out /tmp/bench_gpu.md

Same options as experiments/bench.py (--n-prompts, --max-new-tokens, --temperatures, --reps...).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from bench_suites import FEATURE_TREE, SUITES

from specjax.bench import AR, HF_GENERATE, SPEC, Dataset, Method, main
from specjax.datasets import TINYSTORIES
from specjax.paths import LLAMA2XS, SMOLLM2_EAGLE, SMOLLM2_MDC, STORIES260K_EAGLE, STORIES260K_MDC

RESULTS = Path(__file__).resolve().parent / "results"

# The suites of bench_suites.py (same targets and settings), with fewer prompts and methods.
GPU_SUITES = {
    "stories260K": dataclasses.replace(
        SUITES["stories260K"],
        datasets=(Dataset.named(TINYSTORIES, 4, 128),),
        methods=(
            Method(kind=AR),
            Method(kind=SPEC, drafter=LLAMA2XS, auto=True),
            Method(kind=SPEC, drafter=STORIES260K_EAGLE, auto=True),
            Method(kind=SPEC, drafter=STORIES260K_MDC, auto=True),
            Method(kind=SPEC, drafter=STORIES260K_EAGLE, auto=True, auto_fallback=False),
            Method(kind=SPEC, drafter=STORIES260K_EAGLE, tree=FEATURE_TREE),
            Method(kind=HF_GENERATE),
        ),
    ),
    "smollm2": dataclasses.replace(
        SUITES["smollm2"],
        datasets=(Dataset.named("mt_bench", 4, 64),),
        methods=(
            Method(kind=AR),
            Method(kind=SPEC, drafter=SMOLLM2_EAGLE, auto=True),
            Method(kind=SPEC, drafter=SMOLLM2_MDC, auto=True),
            Method(kind=SPEC, drafter=SMOLLM2_EAGLE, auto=True, auto_fallback=False),
            Method(kind=SPEC, drafter=SMOLLM2_EAGLE, tree=FEATURE_TREE),
            Method(kind=HF_GENERATE),
        ),
    ),
}

if __name__ == "__main__":
    sys.exit(
        main(
            default_out=RESULTS / "bench_gpu.md",
            prog="python experiments/bench_gpu.py",
            suites=GPU_SUITES,
        )
    )
