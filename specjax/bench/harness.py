"""The benchmark loop: `bench` runs one target's methods over prompt sets and temperatures with
interleaved timing and turns outputs and timings into table `Row`s (tau, throughput, paired
speedups, compile time, greedy equality), explaining every greedy mismatch."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from specjax.bench.hf_peer import HFPeer, hf_available
from specjax.bench.methods import (
    AR,
    HF_ASSISTED,
    HF_GENERATE,
    HF_LOOKUP,
    SPEC,
    Method,
    resolve_drafter,
)
from specjax.bench.prompts import Prompt, PromptSet
from specjax.bench.runner import Decoded, Runner, SpecjaxRunner, Target
from specjax.benchmark import mean_ci, time_interleaved
from specjax.config import SamplingConfig
from specjax.memory_maps import drop_compiled_programs_if_crowded

# Logits of the same fp32 model computed with different shapes (one token vs a tree block, XLA
# vs torch) differ by up to ~1e-3 over 30 layers (see tests/test_real_models.py); gaps below this
# bound are ties at that precision.
NEAR_TIE_NATS = 1e-2


@dataclasses.dataclass
class Row:
    """One line of the results table (see specjax.bench's docstring for the definitions).

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
    # Seconds of each prompt in each repetition ([prompt][repetition]): where a repetition's
    # time went when runs_s differ.
    prompt_s: list[list[float]] = dataclasses.field(default_factory=list)
    # Seconds each repetition spent compiling (0 when the warm-up compiled everything).
    compile_in_runs_s: list[float] = dataclasses.field(default_factory=list)
    chosen_tree: str = ""  # SpecConfig.auto() rows: what it chose and predicted
    predicted_tau: float = math.nan
    predicted_speedup: float = math.nan
    fallback: str = ""  # auto rows: "k/n prompts, x% of steps" decoded plainly after a fallback
    shift: str = ""  # auto rows: the acceptance shift of the first and the last prompt
    # Rows with an intermediate level (HiSpec, exit verify): tokens per call of the verify exit.
    intermediate_tau: float = math.nan
    # auto rows: each prompt's choice and its tau over speculative steps (runner.prompt_choice)
    per_prompt: list[dict] = dataclasses.field(default_factory=list)


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


def _paired_ratio(num: Sequence[float], den: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """Median and (min, max) of the per-repetition ratios num[i] / den[i]."""
    r = [a / b for a, b in zip(num, den, strict=True)]
    return statistics.median(r), (min(r), max(r))


def _prompt_speedups(runner: Runner, ar: Runner, out: Decoded, ar_out: Decoded) -> list[float]:
    """Each prompt's own speedup over autoregressive decoding: its tokens per second over the
    autoregressive call's on the same prompt, paired per interleaved repetition, median."""
    return [
        _paired_ratio(
            [len(out.tokens[i]) / t for t in runner.prompt_s[i]],
            [len(ar_out.tokens[i]) / t for t in ar.prompt_s[i]],
        )[0]
        for i in range(len(out.tokens))
    ]


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


def _calibrate_held_in(target, methods, drafters, kind, log) -> None:
    import functools

    from specjax.calibration import calibration_prompts, ensure_pair_profiles
    from specjax.hispec import HiSpec

    # HiSpec's default call chooses by timing its own prompts (specjax.hispec_choice): it has
    # no acceptance profile to calibrate.
    auto = {
        m.drafter
        for m in methods
        if m.kind == SPEC and m.auto and not isinstance(drafters[m.drafter], HiSpec)
    }
    if not auto:
        return
    prompts_for = functools.cache(lambda: calibration_prompts(kind, target.model, target.tokenizer))
    for spec in sorted(auto):
        t0 = time.perf_counter()
        ensure_pair_profiles(target.model, drafters[spec], prompts_for, eos_id=target.eos_id)
        log(f"[bench] acceptance profile of {spec}: ready in {time.perf_counter() - t0:.0f}s")


def bench(
    target: Target,
    prompt_sets: Sequence[PromptSet],
    methods: Sequence[Method],
    *,
    temperatures: Sequence[float] = (0.0, 1.0),
    reps: int = 3,
    hf: bool = True,
    log: Callable[[str], None] = print,
    calibration_kind: str | None = None,
) -> list[Row]:
    """Run every method on every prompt set at every temperature; returns the table's rows.

    Auto methods (SpecConfig.auto()) of drafters without a checkpoint profile are calibrated
    first on held-in prompts of `calibration_kind` ("chat" | "story", specjax.calibration), so
    that no profile comes from the evaluation prompts; None: they calibrate on their first call.

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
    if calibration_kind is not None and target.tokenizer is not None:
        _calibrate_held_in(target, methods, drafters, calibration_kind, log)
    peer = HFPeer(target, log) if any(m.is_peer for m in methods) else None

    rows = []
    for prompts in prompt_sets:
        for temperature in temperatures:
            # Each group compiles its own programs (prompt lengths, samplers); those of the
            # groups before are dropped once they crowd the process's memory mappings, which
            # ended a PACER run of 13 methods x 2 prompt sets in a crash (specjax.memory_maps).
            drop_compiled_programs_if_crowded(log=log)
            sampling = SamplingConfig(temperature=float(temperature))
            runners: dict[str, Runner] = {}
            for m in methods:
                if m.is_peer:
                    runners[m.name] = peer.runner(m, prompts, sampling)
                else:
                    drafter = drafters.get(m.drafter) if m.kind == SPEC else None
                    runners[m.name] = SpecjaxRunner(target, m, drafter, prompts, sampling)
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
            tau_ci=tau_ci,  # NaN with one prompt: no interval (the table prints "-")
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
            prompt_s=[list(t) for t in runners[m.name].prompt_s],
            compile_in_runs_s=list(runners[m.name].compile_in_runs_s),
        )
        if out.choice is not None:
            row.chosen_tree = str(out.choice["tree"])
            row.draft_nodes = row.chosen_tree
            row.predicted_tau = float(out.choice["predicted_tau"])
            row.predicted_speedup = float(out.choice["predicted_speedup"])
            row.fallback = (
                f"{out.choice['fell_back']}/{row.n_prompts} prompts, "
                f"{out.choice['plain_share']:.0%} of steps"
            )
            row.shift = out.choice["shift"]
            row.per_prompt = out.choice["per_prompt"]
            if len(row.per_prompt) == len(prompts.prompts):
                speedups = _prompt_speedups(
                    runners[m.name], runners[ar.name], out, decoded[ar.name]
                )
                for p, x in zip(row.per_prompt, speedups, strict=True):
                    p["speedup"] = x
        elif m.kind == SPEC and m.auto and runners[m.name].forced_settings:
            row.draft_nodes = runners[m.name].forced_settings
        if out.intermediate_tau:
            row.intermediate_tau = float(np.mean(out.intermediate_tau))
        drafted_only = not m.auto and m.kind == SPEC and m.config.tree.text_min_match > 0
        if (out.pre_verifier_stops or drafted_only) and out.draft_len:
            # A pre-verifier or the text's matches decided per step: the budget, then the mean
            # number drafted (what verification ran on, up to its bucket).
            row.draft_nodes = f"{row.draft_nodes} -> {np.mean(out.draft_len):.1f}"
        rows.append(row)
        log(
            f"  {m.name}: tau {row.tau:.2f}, {row.tokens_per_s:.1f} tok/s, "
            f"speedup {row.speedup:.2f}x" + ("" if math.isnan(equal) else f", = AR {equal:.0%}")
        )
    return rows
