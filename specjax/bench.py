"""Spec-Bench-style benchmark harness: methods x datasets x temperatures, side by side with
specjax autoregressive decoding and the Hugging Face transformers peer.

Axis letters: P = max draft depth + 1 (accepted-length histogram bins).

What one run measures, per (target, dataset, temperature, method):

- tau: tokens emitted per target call (Spec-Bench convention: accepted + 1), mean over prompts
  with a 95% CI. specjax methods report it from `speculative_generate`'s stats; for transformers
  rows it is generated tokens / target forward calls (counted with a forward hook): the same
  quantity, since assisted decoding has no separate prefill call (and plain generate makes one
  call per token, prefill included).
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
  time. transformers has nothing to compile; its warm-up decodes the first prompt.
- greedy = AR: at temperature 0, the fraction of prompts whose output equals specjax
  autoregressive decoding token for token. Every mismatch is explained: the first differing
  position and the target's log-probability gap between the two candidate tokens there (a gap
  below NEAR_TIE_NATS is a near-tie flipped by float summation order, not a bug).

Every prompt is decoded alone (batch 1): transformers' assisted generation supports batch 1 only,
and it keeps the comparison with the peer like for like.

Layers: `read_spec_bench` / `Dataset` build `PromptSet`s; `Method` (and `parse_method`) names what
runs; `bench` runs one target over prompt sets and returns `Row`s; `Suite` + `run_suites` bundle
the default configuration; `write_markdown`, `write_plots` and `write_json` write the results;
`add_arguments` / `main` are the command line shared by `specjax bench` and experiments/bench.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import numpy as np

from specjax.benchmark import device_header, mean_ci, time_interleaved
from specjax.config import SamplingConfig, SpecConfig, TreeConfig
from specjax.datasets import (
    SPEC_BENCH_FILES,
    TINYSTORIES,
    encode_question,
    read_spec_bench,
    resolve_path,
    select_questions,
    tinystories_prompts,
)
from specjax.paths import (
    LLAMA2XS,
    SMOLLM2,
    SMOLLM2_EAGLE,
    SMOLLM2_MDC,
    STORIES260K,
    STORIES260K_EAGLE,
    STORIES260K_MDC,
)

# ---------------------------------------------------------------------------------------------
# Prompt sets
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt: an id for reports (question_id or paragraph index), its category, its ids."""

    id: str
    category: str
    ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """Prompts decoded with the same budget of `max_new_tokens` generated tokens each."""

    name: str
    prompts: tuple[Prompt, ...]
    max_new_tokens: int
    description: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dataset:
    """A recipe for a PromptSet: `source` is TINYSTORIES (TinyStories dev prefixes, for story
    models) or a Spec-Bench jsonl file (a short name from SPEC_BENCH_FILES, a path, or a file
    name under the shared data folder) whose first turns are used (for chat models)."""

    name: str
    source: str
    n_prompts: int
    max_new_tokens: int

    @property
    def kind(self) -> str:
        return "story" if self.source == TINYSTORIES else "chat"

    @classmethod
    def named(cls, name: str, n_prompts: int, max_new_tokens: int) -> Dataset:
        """A dataset by short name (tinystories, mt_bench, gsm8k, ...) or by jsonl path."""
        if name == TINYSTORIES:
            source = TINYSTORIES
        elif name in SPEC_BENCH_FILES:
            source = SPEC_BENCH_FILES[name]
        elif name.endswith(".jsonl"):
            source, name = name, Path(name).stem
        else:
            known = ", ".join([TINYSTORIES, *SPEC_BENCH_FILES])
            raise ValueError(f"unknown dataset {name!r}: use one of {known} or a .jsonl path")
        return cls(name=name, source=source, n_prompts=n_prompts, max_new_tokens=max_new_tokens)

    def load(self, tokenizer) -> PromptSet:
        if tokenizer is None:
            raise ValueError(f"dataset {self.name}: the target has no tokenizer")
        if self.kind == "story":
            ids = tinystories_prompts(tokenizer, self.n_prompts)
            prompts = tuple(Prompt(str(i), "story", tuple(p)) for i, p in enumerate(ids))
            description = f"first 8 words of {len(prompts)} TinyStories dev paragraphs"
        else:
            chosen = select_questions(read_spec_bench(self.source), self.n_prompts)
            prompts = tuple(
                Prompt(q.question_id, q.category, tuple(encode_question(tokenizer, q.turns[0])))
                for q in chosen
            )
            n_cat = len({q.category for q in chosen})
            template = "chat template" if tokenizer.chat_template else "raw text"
            description = (
                f"{len(prompts)} first turns of {Path(self.source).name} "
                f"({n_cat} categories, round-robin; {template})"
            )
        return PromptSet(self.name, prompts, self.max_new_tokens, description)


# ---------------------------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------------------------

AR = "ar"  # specjax.generate: the baseline of every speedup
SPEC = "spec"  # specjax.speculative_generate with a drafter and a tree
HF_GENERATE = "hf"  # transformers generate()
HF_ASSISTED = "hf-assisted"  # transformers assisted generation with a draft model
HF_LOOKUP = "hf-pld"  # transformers prompt-lookup decoding
PEER_KINDS = (HF_GENERATE, HF_ASSISTED, HF_LOOKUP)

# Spec-Bench's prompt-lookup setting (num_pred_tokens = 10); transformers' defaults for the
# assistant, set explicitly so that the header states what ran whatever the installed version.
DEFAULT_LOOKUP_TOKENS = 10
HF_ASSISTANT_SETTINGS = dict(
    num_assistant_tokens=20,
    num_assistant_tokens_schedule="constant",
    assistant_confidence_threshold=0.4,
)


def _checkpoint_label(path: str) -> str:
    """llama2xs-279K for models/llama2xs-279K/model.bin (the folder names the model), the
    directory's own name for a trained drafter (checkpoints/smollm2-mdc -> smollm2-mdc)."""
    p = Path(path)
    if p.suffix == "":  # a drafter directory, possibly with an ablation switch
        return p.name
    return p.parent.name or p.stem


def resolve_drafter(spec: str) -> str:
    """self:K as is; a trained drafter directory relative to the current directory or to the
    repository (checkpoints/...); else a draft model under the shared models folder."""
    from specjax.drafters.spec import is_feature_drafter
    from specjax.paths import repo_dir

    if spec.startswith("self:"):
        return spec
    for candidate in (spec, str(repo_dir() / spec)):
        if is_feature_drafter(candidate):
            return candidate
    return str(resolve_path(spec, "models"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Method:
    """What runs: kind AR | SPEC | HF_GENERATE | HF_ASSISTED | HF_LOOKUP.

    drafter: for SPEC "self:K" (the target's first K layers) or a draft checkpoint path; for
    HF_ASSISTED the assistant checkpoint (exported to transformers with the same weights).
    tree/rule: SPEC's draft tree and acceptance rule; lookup_tokens: HF_LOOKUP's
    prompt_lookup_num_tokens. label: display name (derived when empty).
    """

    kind: str
    drafter: str | None = None
    tree: TreeConfig | None = None
    rule: str = "auto"
    lookup_tokens: int = DEFAULT_LOOKUP_TOKENS
    label: str = ""

    def __post_init__(self):
        if self.kind not in (AR, SPEC, *PEER_KINDS):
            raise ValueError(f"unknown method kind {self.kind!r}")
        if self.kind in (SPEC, HF_ASSISTED) and not self.drafter:
            raise ValueError(f"a {self.kind} method needs a drafter")
        if self.kind == SPEC:
            SpecConfig(tree=self.tree or TreeConfig(), rule=self.rule)  # validates the pair

    @property
    def is_peer(self) -> bool:
        return self.kind in PEER_KINDS

    @property
    def config(self) -> SpecConfig:
        return SpecConfig(tree=self.tree or TreeConfig(), rule=self.rule)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.kind == AR:
            return "specjax autoregressive"
        if self.kind == HF_GENERATE:
            return "HF generate"
        if self.kind == HF_LOOKUP:
            return f"HF prompt lookup ({self.lookup_tokens})"
        if self.kind == HF_ASSISTED:
            return f"HF assisted ({_checkpoint_label(self.drafter)})"
        tree = self.config.tree
        if tree.is_chain:
            shape = f"chain {tree.max_depth}"
        elif tree.is_dynamic:
            shape = f"tree {tree.budget}/d{tree.max_depth}/top{tree.topk}"
        else:
            shape = "tree (" + ",".join(map(str, tree.branching)) + ")"
        if self.drafter.startswith("self:"):
            who = f"self-draft {self.drafter.split(':', 1)[1]}L"
        else:
            who = _checkpoint_label(self.drafter)
        rule = "" if self.rule == "auto" else f", {self.rule}"
        return f"{who} {shape}{rule}"

    @property
    def draft_nodes(self) -> str:
        """Draft tokens per target call (the tree budget, root excluded)."""
        if self.kind == SPEC:
            return str(self.config.tree.num_nodes - 1)
        if self.kind == HF_LOOKUP:
            return f"<={self.lookup_tokens}"
        if self.kind == HF_ASSISTED:
            return f"<={HF_ASSISTANT_SETTINGS['num_assistant_tokens']}"
        return "-"


def parse_method(spec: str) -> Method:
    """A method from its command-line spelling:

    ar | hf | hf-pld[:K] | hf-assisted:CHECKPOINT | DRAFTER[@N,DEPTH,TOPK[@RULE]]

    DRAFTER is self:K, a draft checkpoint (same vocabulary as the target) or a trained drafter
    directory (checkpoints/...); the tree is `specjax generate --tree`'s N,DEPTH,TOPK (default: a
    chain of 4; for trained drafters a dynamic budget, default 31,6,8); RULE one of SpecConfig's.
    """
    spec = spec.strip()
    if spec == AR:
        return Method(kind=AR)
    if spec == HF_GENERATE:
        return Method(kind=HF_GENERATE)
    if spec == HF_LOOKUP or spec.startswith(HF_LOOKUP + ":"):
        k = spec.split(":", 1)[1] if ":" in spec else DEFAULT_LOOKUP_TOKENS
        return Method(kind=HF_LOOKUP, lookup_tokens=int(k))
    if spec.startswith(HF_ASSISTED + ":"):
        return Method(kind=HF_ASSISTED, drafter=spec.split(":", 1)[1])
    drafter, *rest = spec.split("@")
    if not drafter or len(rest) > 2:
        raise ValueError(f"method {spec!r}: expected DRAFTER[@N,DEPTH,TOPK[@RULE]]")
    from specjax.drafters.spec import tree_for

    tree = tree_for(resolve_drafter(drafter), rest[0] if rest else None)
    return Method(kind=SPEC, drafter=drafter, tree=tree, rule=rest[1] if len(rest) > 1 else "auto")


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Target:
    """The model under test. eos_id: rows stop after emitting it (None: always max_new_tokens)."""

    name: str
    model: object
    tokenizer: object | None = None
    eos_id: int | None = None


@dataclasses.dataclass
class Decoded:
    """One method's outputs on a prompt set: generated ids per prompt (EOS included), tau per
    prompt, and the accepted-length histogram [P] summed over prompts (specjax SPEC only)."""

    tokens: list[np.ndarray]
    tau: list[float]
    accepted_hist: np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        return int(sum(len(t) for t in self.tokens))


@dataclasses.dataclass
class Row:
    """One line of the results table (see the module docstring for the definitions).

    Ratios are medians over repetitions with their (min, max); nan where not applicable.
    runs_s: wall seconds of each repetition for the whole prompt set.
    """

    target: str
    dataset: str
    temperature: float
    method: str
    kind: str
    draft_nodes: str
    n_prompts: int
    n_tokens: int
    tau: float
    tau_ci: float
    tokens_per_s: float
    speedup: float
    speedup_range: tuple[float, float]
    vs_hf_generate: float
    vs_hf_spec: float
    compile_s: float
    greedy_equal: float
    mismatches: list[str]
    accepted_hist: list[int] | None
    runs_s: list[float]


class HFPeer:
    """The target's weights in a transformers model on CPU (float32, `to_transformers`), counting
    its forward calls (for tau), plus assistant models loaded on demand."""

    def __init__(self, target: Target, log: Callable[[str], None] = print):
        import transformers

        from specjax.io.export import to_transformers

        self._transformers = transformers
        self.log = log
        self.model = to_transformers(target.model)
        self._configure(self.model, target.eos_id)
        self.eos_id = target.eos_id
        self.calls = 0
        self.model.register_forward_hook(self._count)
        self._assistants: dict[str, object] = {}

    def _count(self, module, args, output):
        self.calls += 1

    def _configure(self, model, eos_id, **extra):
        # Replace the generation config wholesale: generate() fills unset fields from the model's
        # own config, so an exported default EOS (2) would otherwise stop rows specjax continues.
        model.generation_config = self._transformers.GenerationConfig(
            bos_token_id=None,
            eos_token_id=eos_id,
            pad_token_id=0 if eos_id is None else eos_id,
            **extra,
        )

    def assistant(self, path: str):
        if path not in self._assistants:
            import specjax
            from specjax.io.export import to_transformers

            hf = to_transformers(specjax.load(resolve_path(path, "models")).model)
            self._configure(hf, self.eos_id, **HF_ASSISTANT_SETTINGS)
            self._assistants[path] = hf
        return self._assistants[path]

    def runner(self, method: Method, prompts: PromptSet, sampling: SamplingConfig) -> _HFRunner:
        kwargs: dict = dict(max_new_tokens=prompts.max_new_tokens, do_sample=not sampling.greedy)
        if not sampling.greedy:
            # The same transform as specjax's SamplingConfig (0 / 1.0 switch top-k / top-p off;
            # transformers would otherwise apply its default top_k=50).
            kwargs.update(
                temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
            )
        if method.kind == HF_LOOKUP:
            kwargs["prompt_lookup_num_tokens"] = method.lookup_tokens
        elif method.kind == HF_ASSISTED:
            kwargs["assistant_model"] = self.assistant(method.drafter)
        return _HFRunner(prompts, self, kwargs)


class _Runner:
    """One method on one prompt set, called by `time_interleaved` (which waits on nothing: every
    prompt's result is waited on here, so the per-prompt times add up to the call's).

    The first call only warms up: it decodes the prompts of `warm_indices()` (for specjax one per
    padded prompt width, which compiles every program the set needs) and is timed as warm_s.
    Later calls decode every prompt, batch 1, prompt i with seed i, and keep the outputs of the
    last call (all calls give the same outputs).
    """

    def __init__(self, prompts: PromptSet):
        self.prompts = prompts
        self.warm_s: float | None = None
        self.prompt_s: list[list[float]] = [[] for _ in prompts.prompts]  # [prompt][repetition]
        self.outputs: list | None = None

    def warm_indices(self) -> list[int]:
        return [0]

    def decode(self, i: int, prompt: Prompt):
        raise NotImplementedError

    def __call__(self) -> None:
        if self.warm_s is None:
            t0 = time.perf_counter()
            for i in self.warm_indices():
                self.decode(i, self.prompts.prompts[i])
            self.warm_s = time.perf_counter() - t0
            return
        outs = []
        for i, p in enumerate(self.prompts.prompts):
            t0 = time.perf_counter()
            outs.append(self.decode(i, p))
            self.prompt_s[i].append(time.perf_counter() - t0)
        self.outputs = outs

    @property
    def compile_s(self) -> float:
        """Warm-up seconds minus what the warmed prompts take once compiled (their median)."""
        ran = sum(statistics.median(self.prompt_s[i]) for i in self.warm_indices())
        return max(self.warm_s - ran, 0.0)

    def decoded(self) -> Decoded:
        raise NotImplementedError


class _SpecjaxRunner(_Runner):
    def __init__(self, target: Target, method: Method, drafter, prompts: PromptSet, sampling):
        super().__init__(prompts)
        self.target, self.method, self.drafter, self.sampling = target, method, drafter, sampling

    def warm_indices(self) -> list[int]:
        from specjax.decode import prepare_prompts

        extra = self.method.config.tree.num_nodes + 1 if self.drafter is not None else 0
        first_of_width: dict[int, int] = {}
        for i, p in enumerate(self.prompts.prompts):
            ids, _ = prepare_prompts(
                [list(p.ids)], self.target.model.config, self.prompts.max_new_tokens, extra
            )
            first_of_width.setdefault(ids.shape[1], i)
        return sorted(first_of_width.values())

    def decode(self, i: int, prompt: Prompt):
        import specjax

        kw = dict(
            max_new_tokens=self.prompts.max_new_tokens,
            sampling=self.sampling,
            key=jax.random.key(i),
            eos_id=self.target.eos_id,
        )
        if self.drafter is None:
            out = specjax.generate(self.target.model, [list(prompt.ids)], **kw)
        else:
            out = specjax.speculative_generate(
                self.target.model, self.drafter, [list(prompt.ids)], config=self.method.config, **kw
            )
        return jax.block_until_ready(out)

    def decoded(self) -> Decoded:
        tokens, tau, hist = [], [], None
        for o in self.outputs:
            n = int(o.lengths[0])
            tokens.append(np.asarray(o.tokens[0, :n]))
            if o.stats is None:
                tau.append(1.0)
            else:
                tau.append(float(o.stats["tau"][0]))
                h = np.asarray(o.stats["accepted_hist"][0], np.int64)
                hist = h if hist is None else hist + h
        return Decoded(tokens=tokens, tau=tau, accepted_hist=hist)


class _HFRunner(_Runner):
    """transformers generate(); the warm-up (first prompt) pays one-off set-up costs, there is
    nothing to compile."""

    def __init__(self, prompts: PromptSet, peer: HFPeer, kwargs: dict):
        super().__init__(prompts)
        self.peer, self.kwargs = peer, kwargs

    def decode(self, i: int, prompt: Prompt) -> tuple[np.ndarray, int]:
        import torch

        torch.manual_seed(i)
        x = torch.tensor([list(prompt.ids)], dtype=torch.long)
        self.peer.calls = 0
        with torch.inference_mode():
            out = self.peer.model.generate(x, attention_mask=torch.ones_like(x), **self.kwargs)
        return out[0, x.shape[1] :].numpy(), self.peer.calls

    @property
    def compile_s(self) -> float:
        return math.nan

    def decoded(self) -> Decoded:
        tokens = [t for t, _ in self.outputs]
        tau = [len(t) / max(calls, 1) for t, calls in self.outputs]
        return Decoded(tokens=tokens, tau=tau)


def explain_mismatch(target: Target, prompt: Prompt, ref: np.ndarray, got: np.ndarray) -> str:
    """Where a greedy output departs from autoregressive decoding, and why: the target's
    log-probability gap (nats) between the autoregressive token and the other one at the first
    differing position, scored by `specjax.score` on the autoregressive prefix."""
    import specjax

    n = min(len(ref), len(got))
    diff = np.flatnonzero(ref[:n] != got[:n])
    if diff.size == 0:  # one output stopped at EOS earlier: only possible after a divergence
        return f"prompt {prompt.id}: lengths {len(ref)} vs {len(got)} with equal prefixes"
    j = int(diff[0])
    prefix = [*prompt.ids, *map(int, ref[:j])]
    logp, _ = specjax.score(target.model, [[*prefix, int(ref[j])], [*prefix, int(got[j])]])
    gap = float(logp[0, len(prefix) - 1] - logp[1, len(prefix) - 1])
    words = ""
    if target.tokenizer is not None:
        words = f" ({target.tokenizer.decode([int(ref[j])])!r} vs "
        words += f"{target.tokenizer.decode([int(got[j])])!r})"
    verdict = (
        "a near-tie flipped by float summation order"
        if abs(gap) < NEAR_TIE_NATS
        else "NOT a near-tie: investigate"
    )
    return (
        f"prompt {prompt.id}: first differs at generated token {j}: AR {int(ref[j])}, "
        f"this method {int(got[j])}{words}; log-prob gap {gap:.2e} nats: {verdict}"
    )


# Logits of the same fp32 model computed with different shapes (one token vs a tree block, XLA
# vs torch) differ by up to ~1e-3 over 30 layers (see tests/test_real_models.py); gaps below this
# bound are ties at that precision.
NEAR_TIE_NATS = 1e-2


def _paired_ratio(num: Sequence[float], den: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """Median and (min, max) of the per-repetition ratios num[i] / den[i]."""
    r = [a / b for a, b in zip(num, den, strict=True)]
    return statistics.median(r), (min(r), max(r))


def _drafters(target: Target, methods: Sequence[Method]) -> dict[str, object]:
    """One drafter object per drafter spec, shared by the methods that name it."""
    from specjax.drafters.spec import make_drafter

    out = {}
    for m in methods:
        if m.kind == SPEC and m.drafter not in out:
            drafter = make_drafter(resolve_drafter(m.drafter), target)
            drafter.check_compatible(target.model)
            out[m.drafter] = drafter
    return out


# Idle OpenMP threads of torch spin by default; on a CPU shared with other processes (or with
# XLA's own thread pool) a spinning thread that lost its core stalls every parallel region: torch
# ran 4x slower per token on the 2-core development machine under load. Passive waiting costs
# little when the machine is idle. Set before torch is first imported (a user's value wins).
OMP_WAIT_POLICY = "PASSIVE"


def _prepare_torch_env() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)


def hf_available() -> bool:
    _prepare_torch_env()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def bench(
    target: Target,
    prompt_sets: Sequence[PromptSet],
    methods: Sequence[Method],
    *,
    temperatures: Sequence[float] = (0.0, 1.0),
    reps: int = 3,
    hf: bool = True,
    log: Callable[[str], None] = print,
) -> list[Row]:
    """Run every method on every prompt set at every temperature; returns the table's rows.

    specjax autoregressive decoding is added as the first method when missing (it is the
    baseline of every speedup and of greedy equality). transformers peers are skipped, with a
    log line, when hf is False or torch/transformers are not installed (the [hf] extra).
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    methods = list(dict.fromkeys(methods))  # order kept, duplicates dropped
    if not any(m.kind == AR for m in methods):
        methods.insert(0, Method(kind=AR))
    if any(m.is_peer for m in methods) and not (hf and hf_available()):
        why = "--no-hf" if not hf else "torch/transformers not installed (pip install specjax[hf])"
        log(f"[bench] skipping the transformers peer: {why}")
        methods = [m for m in methods if not m.is_peer]
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"two methods share a name: {names}")
    drafters = _drafters(target, methods)
    peer = HFPeer(target, log) if any(m.is_peer for m in methods) else None

    rows = []
    for prompts in prompt_sets:
        for temperature in temperatures:
            sampling = SamplingConfig(temperature=float(temperature))
            runners: dict[str, _Runner] = {}
            for m in methods:
                if m.is_peer:
                    runners[m.name] = peer.runner(m, prompts, sampling)
                else:
                    drafter = drafters.get(m.drafter) if m.kind == SPEC else None
                    runners[m.name] = _SpecjaxRunner(target, m, drafter, prompts, sampling)
            t0 = time.perf_counter()
            timings = time_interleaved(runners, reps=reps)
            log(
                f"[bench] {target.name} / {prompts.name} / T={temperature:g}: "
                f"{len(methods)} methods x {reps} reps in {time.perf_counter() - t0:.0f}s"
            )
            rows += _rows(target, prompts, sampling, methods, runners, timings, log)
    return rows


def _rows(target, prompts, sampling, methods, runners, timings, log) -> list[Row]:
    """Metrics of one (prompt set, temperature) block from outputs and interleaved timings."""
    decoded = {name: runner.decoded() for name, runner in runners.items()}
    ar = next(m for m in methods if m.kind == AR)
    hf_gen = next((m for m in methods if m.kind == HF_GENERATE), None)
    hf_spec = next((m for m in methods if m.kind in (HF_ASSISTED, HF_LOOKUP)), None)

    def throughput(m: Method) -> list[float]:
        return [decoded[m.name].n_tokens / t for t in timings[m.name].runs_s]

    rows = []
    for m in methods:
        out, timing = decoded[m.name], timings[m.name]
        speedup, spread = _paired_ratio(throughput(m), throughput(ar))
        vs_gen = _paired_ratio(throughput(m), throughput(hf_gen))[0] if hf_gen else math.nan
        vs_spec = _paired_ratio(throughput(m), throughput(hf_spec))[0] if hf_spec else math.nan
        equal, mismatches = math.nan, []
        if sampling.greedy and m.kind != AR:
            ref = decoded[ar.name].tokens
            same = [np.array_equal(a, b) for a, b in zip(ref, out.tokens, strict=True)]
            equal = float(np.mean(same))
            mismatches = [
                explain_mismatch(target, p, r, g)
                for p, r, g, s in zip(prompts.prompts, ref, out.tokens, same, strict=True)
                if not s
            ]
        tau, tau_ci = (1.0, 0.0) if m.kind == AR else mean_ci(out.tau)
        row = Row(
            target=target.name,
            dataset=prompts.name,
            temperature=sampling.temperature,
            method=m.name,
            kind=m.kind,
            draft_nodes=m.draft_nodes,
            n_prompts=len(prompts.prompts),
            n_tokens=out.n_tokens,
            tau=tau,
            tau_ci=0.0 if math.isnan(tau_ci) else tau_ci,
            tokens_per_s=out.n_tokens / timing.median,
            speedup=speedup,
            speedup_range=spread,
            vs_hf_generate=vs_gen,
            vs_hf_spec=vs_spec,
            compile_s=runners[m.name].compile_s,
            greedy_equal=equal,
            mismatches=mismatches,
            accepted_hist=None if out.accepted_hist is None else out.accepted_hist.tolist(),
            runs_s=list(timing.runs_s),
        )
        rows.append(row)
        log(
            f"  {m.name}: tau {row.tau:.2f}, {row.tokens_per_s:.1f} tok/s, "
            f"speedup {row.speedup:.2f}x" + ("" if math.isnan(equal) else f", = AR {equal:.0%}")
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Default suites
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Suite:
    """A target with its default datasets and methods. kind: the datasets it takes ("chat":
    Spec-Bench questions through the chat template; "story": TinyStories prefixes). stop_at_eos:
    rows stop at the tokenizer's EOS (else every row generates max_new_tokens)."""

    name: str
    model: str
    kind: str
    datasets: tuple[Dataset, ...]
    methods: tuple[Method, ...]
    stop_at_eos: bool = True

    def load(self) -> tuple[Target, object]:
        import specjax

        loaded = specjax.load(resolve_path(self.model, "models"))
        eos = loaded.tokenizer.eos_id if (self.stop_at_eos and loaded.tokenizer) else None
        return Target(self.name, loaded.model, loaded.tokenizer, eos), loaded


# The trained drafters' tree in the default suites: 31 draft nodes, depth 6, top-8.
FEATURE_TREE = TreeConfig.dynamic(31, 6, 8)

# Sized for one reproducible CPU run of all suites in under 30 minutes (2 cores), transformers
# peer included; pass --n-prompts / --max-new-tokens / --datasets for larger runs.
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
            Method(kind=SPEC, drafter=LLAMA2XS, tree=TreeConfig.chain(4)),
            Method(kind=SPEC, drafter=LLAMA2XS, tree=TreeConfig(branching=(4, 1, 1, 1))),
            Method(kind=SPEC, drafter="self:2", tree=TreeConfig.chain(2)),
            Method(kind=SPEC, drafter=STORIES260K_EAGLE, tree=FEATURE_TREE),
            Method(kind=SPEC, drafter=STORIES260K_MDC, tree=FEATURE_TREE),
            Method(kind=HF_GENERATE),
            Method(kind=HF_ASSISTED, drafter=LLAMA2XS),
        ),
    ),
    "smollm2": Suite(
        name="SmolLM2-135M-Instruct",
        model=SMOLLM2,
        kind="chat",
        datasets=(Dataset.named("mt_bench", 8, 64),),
        # Every drafter specjax has for this target: self-drafting with its first 8 of 30 layers
        # (no smaller model shares its vocabulary in the shared folder) and the two trained
        # feature drafters. One tree shape each, to keep the whole run under 30 minutes on 2 CPU
        # cores (experiments/drafters.py compares budgets): the (3,1) tree was faster than a
        # chain of 3 for self-drafting in smoke runs (the chain: --methods ar self:8@3,3,1 ...).
        methods=(
            Method(kind=AR),
            Method(kind=SPEC, drafter="self:8", tree=TreeConfig(branching=(3, 1))),
            Method(kind=SPEC, drafter=SMOLLM2_EAGLE, tree=FEATURE_TREE),
            Method(kind=SPEC, drafter=SMOLLM2_MDC, tree=FEATURE_TREE),
            Method(kind=HF_GENERATE),
            Method(kind=HF_LOOKUP),
        ),
    ),
}


def run_suites(
    suites: Sequence[Suite],
    *,
    temperatures: Sequence[float] = (0.0, 1.0),
    reps: int = 3,
    hf: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[list[Row], list[str]]:
    """Run each suite; returns (rows, one description line per target and prompt set)."""
    rows, described = [], []
    for suite in suites:
        t0 = time.perf_counter()
        target, _ = suite.load()
        prompt_sets = [d.load(target.tokenizer) for d in suite.datasets]
        stop = f"stops at EOS (id {target.eos_id})" if target.eos_id is not None else "no EOS stop"
        for ps in prompt_sets:
            described.append(
                f"{suite.name} / {ps.name}: {ps.description}, {ps.max_new_tokens} new tokens, "
                f"{stop}"
            )
        log(f"[bench] {suite.name}: loaded in {time.perf_counter() - t0:.1f}s")
        rows += bench(
            target, prompt_sets, suite.methods, temperatures=temperatures, reps=reps, hf=hf, log=log
        )
        jax.clear_caches()  # many compiled programs per suite: keep one process within memory
    return rows, described


# ---------------------------------------------------------------------------------------------
# Results: markdown, plots, json
# ---------------------------------------------------------------------------------------------

COLUMNS = (
    "target",
    "dataset",
    "T",
    "method",
    "draft nodes",
    "tau (95% CI)",
    "tokens/s",
    "speedup vs AR (min-max)",
    "vs HF generate",
    "vs HF spec",
    "compile s",
    "greedy = AR",
)


def _fmt(x: float, spec: str, suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:{spec}}{suffix}"


def format_row(r: Row) -> str:
    tau = "1.00" if r.kind == AR else f"{r.tau:.2f} ± {r.tau_ci:.2f}"
    lo, hi = r.speedup_range
    equal = ""
    if not math.isnan(r.greedy_equal):
        n_equal = round(r.greedy_equal * r.n_prompts)
        equal = f"{r.greedy_equal:.0%} ({n_equal}/{r.n_prompts})"
    cells = (
        r.target,
        r.dataset,
        f"{r.temperature:g}",
        r.method,
        r.draft_nodes,
        tau,
        f"{r.tokens_per_s:.1f}",
        f"{r.speedup:.2f}x ({lo:.2f}-{hi:.2f})",
        _fmt(r.vs_hf_generate, ".2f", "x"),
        _fmt(r.vs_hf_spec, ".2f", "x"),
        _fmt(r.compile_s, ".1f"),
        equal,
    )
    return "| " + " | ".join(cells) + " |"


BENCH_TITLE = (
    "Spec-Bench-style benchmark: specjax methods, autoregressive decoding and transformers"
)


def write_markdown(
    rows: Sequence[Row],
    header: str,
    path: str | Path,
    notes: Sequence[str] = (),
    title: str = BENCH_TITLE,
):
    """The results table with its header, definitions and the explanation of every mismatch."""
    lines = [
        f"# {title}",
        "",
        header,
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *(format_row(r) for r in rows),
        "",
        "tau: tokens emitted per target call (accepted + 1), mean over prompts (transformers: "
        "generated tokens / target forward calls). tokens/s: generated tokens (EOS included) / "
        "median wall time of the prompt set. speedup vs AR: throughput over specjax "
        "autoregressive decoding, paired per interleaved repetition in this process, median "
        "(min-max). vs HF generate / vs HF spec: the same paired throughput ratio against "
        "transformers `generate` and against its speculative peer (assisted generation or "
        "prompt lookup) on the same weights. compile s: compile time of a specjax method "
        "(warm-up minus run time), excluded from the repetitions. greedy = AR: prompts whose "
        "T=0 output equals specjax autoregressive decoding token for token. On CPU, quote the "
        "ratios, not absolute speed.",
        "",
    ]
    mismatches = [(r, m) for r in rows for m in r.mismatches]
    lines.append("## Greedy mismatches")
    lines.append("")
    if mismatches:
        lines += [f"- {r.target} / {r.dataset} / {r.method}: {m}" for r, m in mismatches]
    else:
        lines.append("None: every greedy output equals specjax autoregressive decoding.")
    if notes:
        lines += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    Path(path).write_text("\n".join(lines) + "\n")


def _groups(rows: Sequence[Row]) -> dict[tuple, list[Row]]:
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.target, r.dataset, r.temperature), []).append(r)
    return groups


def write_plots(rows: Sequence[Row], stem: str | Path) -> list[Path]:
    """Three figures next to the table: {stem}_tau.png (tau per method), {stem}_speedup.png
    (speedup over specjax AR, min-max bars) and {stem}_accepted.png (fraction of target calls
    that accepted n draft tokens, per speculative specjax method). Returns the paths written
    (none when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    stem = Path(stem)
    groups = _groups(rows)
    titles = [f"{t} / {d} / T={temp:g}" for t, d, temp in groups]
    paths = []

    def bar_figure(name: str, value, err, ylabel: str, hline: float | None):
        fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.2), squeeze=False)
        for ax, title, group in zip(axes[0], titles, groups.values(), strict=True):
            x = np.arange(len(group))
            ax.bar(x, [value(r) for r in group], yerr=np.array([err(r) for r in group]).T)
            if hline is not None:
                ax.axhline(hline, color="k", lw=0.8)
            ax.set_xticks(x, [r.method for r in group], rotation=70, ha="right", fontsize=7)
            ax.set_title(title, fontsize=8)
        axes[0][0].set_ylabel(ylabel)
        fig.tight_layout()
        path = stem.with_name(f"{stem.name}_{name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    bar_figure(
        "tau",
        lambda r: r.tau,
        lambda r: (r.tau_ci, r.tau_ci),
        "tau (tokens per target call)",
        1.0,
    )
    bar_figure(
        "speedup",
        lambda r: r.speedup,
        lambda r: (r.speedup - r.speedup_range[0], r.speedup_range[1] - r.speedup),
        "throughput / specjax autoregressive",
        1.0,
    )
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.6), squeeze=False)
    for ax, title, group in zip(axes[0], titles, groups.values(), strict=True):
        spec_rows = [r for r in group if r.accepted_hist]
        width = 0.8 / max(len(spec_rows), 1)
        for i, r in enumerate(spec_rows):
            h = np.asarray(r.accepted_hist, np.float64)
            offset = (i - (len(spec_rows) - 1) / 2) * width  # bars centred on their count
            ax.bar(np.arange(h.size) + offset, h / max(h.sum(), 1), width, label=r.method)
        ax.set_xlabel("draft tokens accepted per target call")
        ax.set_title(title, fontsize=8)
        if spec_rows:
            ax.legend(fontsize=6)
    axes[0][0].set_ylabel("fraction of target calls")
    fig.tight_layout()
    path = stem.with_name(f"{stem.name}_accepted.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths


def write_json(rows: Sequence[Row], settings: dict, path: str | Path):
    """Every row with its raw repetition times, and the settings, for later analysis."""

    def clean(x):  # json has no nan
        if isinstance(x, float) and math.isnan(x):
            return None
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    data = {
        "settings": settings,
        "rows": [{k: clean(v) for k, v in dataclasses.asdict(r).items()} for r in rows],
    }
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def header_settings(
    suites: Sequence[Suite],
    *,
    temperatures: Sequence[float],
    reps: int,
    hf: bool,
    command: str,
    prompts: Sequence[str] = (),
) -> dict[str, str]:
    """The settings named in every results file (after device_header's backend, device kind,
    host and jax version): dtype, batch, tree budgets, temperatures, repetitions, peer, load."""
    budgets = sorted(
        {
            f"{m.name}: {m.draft_nodes}"
            for s in suites
            for m in s.methods
            if m.kind == SPEC or (hf and m.kind in (HF_ASSISTED, HF_LOOKUP))
        }
    )
    settings = {
        "dtype": "float32 (specjax and transformers)",
        "batch": "1 (each prompt decoded alone; transformers' assisted generation takes batch 1)",
        "temperatures": ", ".join(f"{t:g}" for t in temperatures)
        + " (T=0 greedy; T>0 samples with top-k and top-p off)",
        "tree budget (draft tokens per target call)": "; ".join(budgets) or "-",
        "repetitions": f"{reps} interleaved (median, min-max), after one compile/warm-up call",
    }
    if prompts:
        settings["prompts"] = "; ".join(prompts)
    if hf and hf_available():
        import torch
        import transformers
        from transformers.utils import is_sklearn_available

        adaptive = "adapted" if is_sklearn_available() else "fixed: scikit-learn not installed"
        settings["transformers peer"] = (
            f"transformers {transformers.__version__}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY="
            f"{os.environ.get('OMP_WAIT_POLICY', 'default')}, same weights via specjax.io.export."
            f"to_transformers; assistant: {HF_ASSISTANT_SETTINGS['num_assistant_tokens']} "
            f"tokens, {HF_ASSISTANT_SETTINGS['num_assistant_tokens_schedule']} schedule, "
            f"confidence threshold {HF_ASSISTANT_SETTINGS['assistant_confidence_threshold']} "
            f"({adaptive}); prompt lookup: max_matching_ngram_size default (2)"
        )
    else:
        settings["transformers peer"] = "not run"
    host = f"{os.cpu_count()} cores"
    if hasattr(os, "getloadavg"):  # other processes skew CPU timings: say how busy it was
        host += f", 1-minute load average {os.getloadavg()[0]:.2f} at start"
    settings["host load"] = host
    settings["python"] = f"{platform.python_version()}"
    settings["command"] = command
    return settings


# ---------------------------------------------------------------------------------------------
# Command line (specjax bench, experiments/bench.py)
# ---------------------------------------------------------------------------------------------


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_arguments(parser: argparse.ArgumentParser, default_out: str | Path) -> None:
    parser.add_argument(
        "--targets",
        default=",".join(SUITES),
        help=f"comma-separated targets (default: all of {', '.join(SUITES)})",
    )
    parser.add_argument(
        "--datasets",
        default=None,
        help="comma-separated datasets: tinystories for story targets; "
        f"{', '.join(SPEC_BENCH_FILES)} or a .jsonl path for chat targets (default: each "
        "target's own)",
    )
    parser.add_argument(
        "--prompts",
        nargs="+",
        default=(),
        metavar="FILE",
        help="Spec-Bench jsonl files (question_id, category, turns) to run on the chat targets",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        metavar="SPEC",
        help="methods for every selected target instead of its defaults: ar | hf | hf-pld[:K] | "
        "hf-assisted:CKPT | DRAFTER[@N,DEPTH,TOPK[@RULE]] with DRAFTER self:K or a checkpoint",
    )
    parser.add_argument("--n-prompts", type=int, default=None, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--temperatures", default="0,1", help="comma-separated (default 0,1)")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (>= 1)")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers peer")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--out",
        default=str(default_out),
        help="results markdown; plots and json are written next to it (default: %(default)s)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2 prompts x 8 tokens, 1 repetition, written to <out>_quick.*",
    )
    parser.add_argument(
        "--device-info", action="store_true", help="print the results header and exit"
    )


def suites_from_args(args) -> list[Suite]:
    """The default suites, narrowed and overridden by the command-line options."""
    names = _csv(args.targets)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise ValueError(f"unknown target(s) {unknown}: choose from {list(SUITES)}")
    quick_n, quick_new = (2, 8) if args.quick else (None, None)
    requested = _csv(args.datasets) if args.datasets else []
    requested += [str(p) for p in args.prompts]
    methods = tuple(parse_method(s) for s in args.methods) if args.methods else None
    suites = []
    for name in names:
        suite = SUITES[name]
        d0 = suite.datasets[0]
        n = args.n_prompts or quick_n or None
        new = args.max_new_tokens or quick_new or None
        datasets = [
            Dataset.named(d, n or d0.n_prompts, new or d0.max_new_tokens) for d in requested
        ]
        datasets = [d for d in datasets if d.kind == suite.kind]
        if not datasets:  # none of this target's kind named: keep its defaults
            datasets = [
                dataclasses.replace(
                    d, n_prompts=n or d.n_prompts, max_new_tokens=new or d.max_new_tokens
                )
                for d in suite.datasets
            ]
        suites.append(
            dataclasses.replace(suite, datasets=tuple(datasets), methods=methods or suite.methods)
        )
    return suites


def main(argv: Sequence[str] | None = None, *, default_out: str | Path, prog: str) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_arguments(parser, default_out)
    args = parser.parse_args(argv)
    return run_from_args(
        args, command=f"{prog} " + " ".join(sys.argv[1:] if argv is None else argv)
    )


def run_from_args(args, *, command: str) -> int:
    """Run the benchmark the options describe and write the markdown, plots and json."""
    if args.torch_threads:
        _prepare_torch_env()
        import torch

        torch.set_num_threads(args.torch_threads)
    suites = suites_from_args(args)
    temperatures = [float(t) for t in _csv(args.temperatures)]
    reps = 1 if args.quick else args.reps
    hf = not args.no_hf
    settings = header_settings(suites, temperatures=temperatures, reps=reps, hf=hf, command=command)
    if args.device_info:
        print(device_header(**settings))
        return 0
    out = Path(args.out)
    if args.quick:
        out = out.with_name(f"{out.stem}_quick{out.suffix}")
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows, described = run_suites(suites, temperatures=temperatures, reps=reps, hf=hf)
    settings = {**settings, "prompts": "; ".join(described)}
    settings["wall time"] = f"{(time.perf_counter() - t0) / 60:.1f} min for the whole run"
    header = device_header(**settings)
    write_markdown(rows, header, out)
    plots = write_plots(rows, out.with_suffix(""))
    write_json(rows, {"header": header, **settings}, out.with_suffix(".json"))
    print(out.read_text())
    print(f"[bench] wrote {out}, {out.with_suffix('.json')}" + "".join(f", {p}" for p in plots))
    return 0
