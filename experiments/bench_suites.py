"""The default suites of the Spec-Bench-style benchmark: each reference target with its datasets
and methods (the shipped drafters included). experiments/bench.py runs them, and `specjax bench`
reads this file from a repository checkout (specjax.bench.load_suites).

Sized for one reproducible CPU run of all suites at T=0 in about an hour (2 cores), transformers
peer included; pass --n-prompts / --max-new-tokens / --datasets for other runs. SmolLM2 answers
MT-bench turns with up to 256 new tokens, most of an answer's length: over 64 tokens each
call's prefill, paid alike by every method, held the ratios down (1.29x against 1.73x for the
same default call on one host, experiments/results/bench_epyc_zen4.md and _256.md).
"""

from __future__ import annotations

from specjax.bench import AR, HF_ASSISTED, HF_GENERATE, HF_LOOKUP, SPEC, Dataset, Method, Suite
from specjax.config import TreeConfig
from specjax.datasets import TINYSTORIES
from specjax.paths import (
    LLAMA2XS,
    SMOLLM2,
    SMOLLM2_EAGLE,
    SMOLLM2_HISPEC,
    SMOLLM2_MDC,
    SMOLLM2_NGRAM,
    STORIES260K,
    STORIES260K_EAGLE,
    STORIES260K_HISPEC,
    STORIES260K_MDC,
    STORIES260K_NGRAM,
)

# The trained drafters' fixed tree before SpecConfig.auto(): 31 draft nodes, depth 6, top-8.
FEATURE_TREE = TreeConfig.dynamic(31, 6, 8)

SUITES = {
    "stories260K": Suite(
        name="stories260K",
        model=STORIES260K,
        kind="story",
        # Fixed-length stories (as experiments/bench_engine.py): stories260K ends a story with
        # BOS rather than EOS, so stopping would change nothing but the comparability of tau.
        stop_at_eos=False,
        datasets=(Dataset.named(TINYSTORIES, 10, 128),),
        methods=(
            Method(kind=AR),
            # The default call (SpecConfig.auto()) for every drafter, and one fixed tree each
            # for the two drafter families as they were benchmarked before the default existed.
            Method(kind=SPEC, drafter=LLAMA2XS, auto=True),
            Method(kind=SPEC, drafter="self:2", auto=True),
            Method(kind=SPEC, drafter=STORIES260K_EAGLE, auto=True),
            Method(kind=SPEC, drafter=STORIES260K_MDC, auto=True),
            Method(kind=SPEC, drafter=STORIES260K_NGRAM, auto=True),
            Method(kind=SPEC, drafter=STORIES260K_HISPEC, auto=True),
            # What the default would run if it had to speculate (checks its predictions).
            Method(kind=SPEC, drafter=STORIES260K_EAGLE, auto=True, auto_fallback=False),
            Method(kind=SPEC, drafter=LLAMA2XS, tree=TreeConfig.chain(4)),
            Method(kind=SPEC, drafter=STORIES260K_EAGLE, tree=FEATURE_TREE),
            Method(kind=HF_GENERATE),
            Method(kind=HF_ASSISTED, drafter=LLAMA2XS),
        ),
    ),
    "smollm2": Suite(
        name="SmolLM2-135M-Instruct",
        model=SMOLLM2,
        kind="chat",
        datasets=(Dataset.named("mt_bench", 8, 256),),
        # Every drafter specjax has for this target with the default call (SpecConfig.auto():
        # the tree chosen from measured costs), self-drafting with its first 8 of 30 layers (no
        # smaller model shares its vocabulary in the shared folder) and the two trained feature
        # drafters, the n-gram tables with the text lookup (no network; transformers' prompt
        # lookup is its peer), plus eagle at the 31-node tree the README recommended before the
        # default.
        methods=(
            Method(kind=AR),
            Method(kind=SPEC, drafter="self:8", auto=True),
            Method(kind=SPEC, drafter=SMOLLM2_EAGLE, auto=True),
            Method(kind=SPEC, drafter=SMOLLM2_MDC, auto=True),
            Method(kind=SPEC, drafter=SMOLLM2_NGRAM, auto=True),
            # HiSpec's exit heads: the default call times the three levels against plain
            # decoding on its first call and keeps the faster (specjax.hispec_choice).
            Method(kind=SPEC, drafter=SMOLLM2_HISPEC, auto=True),
            Method(kind=SPEC, drafter=SMOLLM2_EAGLE, auto=True, auto_fallback=False),
            Method(kind=SPEC, drafter=SMOLLM2_MDC, auto=True, auto_fallback=False),
            # HiSpec's three levels at its card's settings, as the default runs them when it
            # decodes with them (experiments/hispec.py compares them with the single-level
            # exit and the screened tree).
            Method(
                kind=SPEC,
                drafter=SMOLLM2_HISPEC,
                auto=True,
                auto_fallback=False,
                label="smollm2-hispec three levels (its card's draft length and buffer)",
            ),
            Method(kind=SPEC, drafter=SMOLLM2_EAGLE, tree=FEATURE_TREE),
            Method(kind=HF_GENERATE),
            Method(kind=HF_LOOKUP),
        ),
    ),
}
