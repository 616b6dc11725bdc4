"""Spec-Bench-style benchmark harness: methods x datasets x temperatures, side by side with
specjax autoregressive decoding and the Hugging Face transformers peer.

Axis letters: P = max draft depth + 1 (accepted-length histogram bins).

What one run measures, per (target, dataset, temperature, method):

- tau: tokens emitted per target call, mean over prompts with a Student-t 95% CI: specjax rows
  (generated - 1) / verification calls (the prefill's first token and call left out; HiSpec's
  full-target calls), transformers rows generated tokens / forward calls counted with a hook
  (assisted generation's first call verifies candidates as it prefills). specjax's is a little
  below the acceptance length `speculative_generate` reports as stats["tau"] (accepted + 1 a
  step), which counts a row's last accepted path whole where max_new_tokens or EOS cut it.
- tokens/s: generated tokens (the EOS that stops a row included, both for specjax and
  transformers) / median wall time of the whole prompt set.
- speedup: throughput over specjax autoregressive decoding of the same target, computed per
  repetition (every repetition runs each method once, in turn, in this process; see
  `specjax.benchmark.time_interleaved`) and reported as median and min-max over repetitions.
  Throughput rather than time ratios, so that sampled runs that stop at EOS at different points
  still compare fairly.
- vs HF: the same paired throughput ratio against transformers `generate` and against its
  speculative peer (assisted generation or prompt-lookup decoding) on the same weights.
- compile s: a warm-up call before the repetitions decodes one prompt per padded prompt width
  (which compiles every program the set needs); its time minus those prompts' median compiled
  time. A second pass over the same prompts follows once every method has warmed up (default
  calls were measured compiling again in their first timed repetition, after later methods'
  warm-ups), counted here too; a timed repetition that still compiled is named in the report.
  transformers has nothing to compile; its warm-up decodes the first prompt.
- greedy = AR: at temperature 0, the fraction of prompts whose output equals specjax
  autoregressive decoding token for token. Every mismatch is explained: the first differing
  position and the target's log-probability gap between the two candidate tokens there (a gap
  below NEAR_TIE_NATS is a near-tie flipped by float summation order, not a bug).

Every prompt is decoded alone (batch 1): transformers' assisted generation supports batch 1 only,
and it keeps the comparison with the peer like for like.

Modules, bottom up:

- prompts: `Prompt`, `PromptSet` and the `Dataset` recipe (readers in specjax.datasets);
- methods: `Method`, `parse_method`, `resolve_drafter` and the method kinds;
- runner: the `Target`, the `Runner` protocol timed by time_interleaved, the specjax runner;
- hf_peer: the transformers peer (`HFPeer`, `hf_available`); the only user of torch/transformers;
- harness: `bench` (one target over prompt sets) and its `Row`s, `explain_mismatch`;
- suites: `Suite`, `run_suites`, `load_suites` (the default suites live in
  experiments/bench_suites.py, outside the library);
- report: `write_markdown`, `write_plots`, `write_json`, `header_settings`;
- cli: `add_arguments` / `main` / `run_from_args`, shared by `specjax bench` and
  experiments/bench.py.
"""

from specjax.bench.cli import add_arguments, main, run_from_args, suites_from_args
from specjax.bench.harness import NEAR_TIE_NATS, Row, bench, explain_mismatch
from specjax.bench.hf_peer import HFPeer, hf_available
from specjax.bench.methods import (
    AR,
    DEFAULT_LOOKUP_TOKENS,
    HF_ASSISTANT_SETTINGS,
    HF_ASSISTED,
    HF_GENERATE,
    HF_LOOKUP,
    PEER_KINDS,
    SPEC,
    Method,
    parse_method,
    resolve_drafter,
)
from specjax.bench.prompts import Dataset, Prompt, PromptSet
from specjax.bench.report import (
    BENCH_TITLE,
    COLUMNS,
    compiles_in_runs,
    format_row,
    header_settings,
    write_json,
    write_markdown,
    write_plots,
)
from specjax.bench.runner import Decoded, Target
from specjax.bench.suites import Suite, load_suites, run_suites

# Re-exported for the callers of the harness: the prompt readers and the results header.
from specjax.benchmark import device_header
from specjax.datasets import (
    SPEC_BENCH_FILES,
    TINYSTORIES,
    Question,
    encode_question,
    read_spec_bench,
    select_questions,
    tinystories_prompts,
)

__all__ = [
    "AR",
    "BENCH_TITLE",
    "COLUMNS",
    "DEFAULT_LOOKUP_TOKENS",
    "HF_ASSISTANT_SETTINGS",
    "HF_ASSISTED",
    "HF_GENERATE",
    "HF_LOOKUP",
    "NEAR_TIE_NATS",
    "PEER_KINDS",
    "SPEC",
    "SPEC_BENCH_FILES",
    "TINYSTORIES",
    "Dataset",
    "Decoded",
    "HFPeer",
    "Method",
    "Prompt",
    "PromptSet",
    "Question",
    "Row",
    "Suite",
    "Target",
    "add_arguments",
    "bench",
    "compiles_in_runs",
    "device_header",
    "encode_question",
    "explain_mismatch",
    "format_row",
    "header_settings",
    "hf_available",
    "load_suites",
    "main",
    "parse_method",
    "read_spec_bench",
    "resolve_drafter",
    "run_from_args",
    "run_suites",
    "select_questions",
    "suites_from_args",
    "tinystories_prompts",
    "write_json",
    "write_markdown",
    "write_plots",
]
