"""SpecConfig.auto() for a HiSpec drafter: run the three-level loop only where it beats plain
decoding on this machine.

HiSpec's speed depends on how often its exits agree with the layers above them and on what a
pass over a range of layers costs here, and neither is known well enough to predict it: on a
2-core CPU the shipped SmolLM2 exit heads ran at 0.84-0.93x plain decoding with their card's
settings and 0.54-0.59x with a chain of 3 and a buffer of 4 (experiments/results/hispec.md). So
the default call measures it: on its first call for a key (backend, device kind, the target's
weights, the exit heads and their settings, batch, sampling mode, cache-length bucket, probe
length) it decodes the call's own prompts for PROBE_TOKENS tokens with HiSpec
and with plain decoding, one compile call and PROBE_ROUNDS interleaved timed calls each, keeps the
ratio of their tokens per second on disk beside the other measured costs, and decodes with
HiSpec when the ratio is above 1, else plainly. Later calls with the same key read the file.
Output is exact either way (both paths are); only the speed differs.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from specjax import autotune
from specjax.benchmark import time_interleaved
from specjax.config import SamplingConfig

PROBE_TOKENS = 32  # new tokens per row of a probe call (fewer when the call asks for fewer)
PROBE_ROUNDS = 2  # timed calls of each method, interleaved, after one compile call each
FORMAT_VERSION = 1
MIN_CONTEXT_BUCKET = 64

# Choices made in this process, by (target, HiSpec, batch, mode, context bucket, probe length): a
# repeated call skips the fingerprints (~1 s for SmolLM2) and the file read.
_CHOSEN: dict[tuple, tuple] = {}


@dataclasses.dataclass(frozen=True)
class HiSpecChoice:
    """HiSpec or plain decoding, from the measured ratio of their tokens per second (HiSpec over
    plain) and HiSpec's tokens per full-target call in the probe."""

    use_hispec: bool
    ratio: float
    tau: float
    label: str

    def stats(self) -> dict:
        return {
            "tree": self.label if self.use_hispec else "autoregressive",
            "predicted_tau": self.tau if self.use_hispec else 1.0,
            "predicted_speedup": self.ratio if self.use_hispec else 1.0,
            "hispec_probe_speedup": self.ratio,
            "acceptance_shift": 1.0,  # as the tree choice reports it (no profile is scaled)
        }

    def describe(self) -> str:
        verdict = "decoding with HiSpec" if self.use_hispec else "decoding autoregressively"
        return (
            f"{self.label} ran at {self.ratio:.2f}x autoregressive decoding on this call's "
            f"prompts (tau {self.tau:.2f}; measured once, kept on disk): {verdict}"
        )


def label_of(hispec) -> str:
    return f"hispec(draft_len={hispec.draft_len},buffer={hispec.buffer})"


def context_bucket(prompts, max_new_tokens: int) -> int:
    """The call's cache length rounded up to a power of two (at least MIN_CONTEXT_BUCKET): calls
    of similar lengths share one measurement."""
    longest = prompts.shape[1] if hasattr(prompts, "shape") else max(len(p) for p in prompts)
    need = max(int(longest) + int(max_new_tokens), MIN_CONTEXT_BUCKET)
    return 1 << (need - 1).bit_length()


def probe_tokens(max_new_tokens: int) -> int:
    """New tokens per row of the probe: PROBE_TOKENS, fewer when the call asks for fewer (a
    probe of a token or two times little but the prefill, so its ratio is kept apart)."""
    return min(PROBE_TOKENS, max_new_tokens)


def choice_key(target, hispec, *, batch: int, mode: str, context: int, probe: int) -> str:
    return "|".join((
        autotune.cost_key(target, batch=batch, context=context),
        autotune.module_fingerprint(hispec),
        label_of(hispec),
        mode,
        f"probe{probe}",
    ))  # fmt: skip


def measure(target, hispec, prompts, *, sampling: SamplingConfig, max_new_tokens: int,
            eos_id, key) -> tuple[float, float]:  # fmt: skip
    """(HiSpec tokens/s over plain decoding's, HiSpec's tokens per full-target call) on
    `prompts`, PROBE_TOKENS new tokens (at most max_new_tokens)."""
    from specjax.decode import generate
    from specjax.hispec import hispec_generate

    kw = dict(max_new_tokens=probe_tokens(max_new_tokens), sampling=sampling, eos_id=eos_id,
              key=key)  # fmt: skip
    last = {}  # each method's latest output (the same every round: same prompts and keys)

    def recorded(name, run):
        def call():
            last[name] = run()
            return last[name].tokens

        return call

    timings = time_interleaved({
        "plain": recorded("plain", lambda: generate(target, prompts, **kw)),
        "hispec": recorded("hispec", lambda: hispec_generate(target, hispec, prompts, **kw)),
    }, reps=PROBE_ROUNDS)  # fmt: skip
    speed = {n: int(np.asarray(last[n].lengths).sum()) / t.median for n, t in timings.items()}
    tau = float(np.mean(np.asarray(last["hispec"].stats["tau"])))
    return speed["hispec"] / speed["plain"], tau


def choose_hispec(target, hispec, prompts, *, sampling: SamplingConfig, max_new_tokens: int,
                  eos_id=None, key=None, announce: bool = True) -> HiSpecChoice:  # fmt: skip
    """HiSpec or plain decoding for this call (see the module docstring)."""
    mode = "greedy" if sampling.temperature == 0 else "sampled"
    batch = int(prompts.shape[0]) if hasattr(prompts, "shape") else len(prompts)
    context = context_bucket(prompts, max_new_tokens)
    probe = probe_tokens(max_new_tokens)
    memo_key = (id(target), id(hispec), label_of(hispec), batch, mode, context, probe)
    if memo_key in _CHOSEN:
        return _CHOSEN[memo_key][0]
    cache_key = choice_key(target, hispec, batch=batch, mode=mode, context=context, probe=probe)
    path, record = autotune.kept_record(cache_key, "hispec", FORMAT_VERSION)
    if record is None:
        if announce:
            print(
                f"[specjax] timing {label_of(hispec)} against autoregressive decoding on this "
                "call's prompts (once per machine and setting)", file=sys.stderr, flush=True,
            )  # fmt: skip
        ratio, tau = measure(target, hispec, prompts, sampling=sampling,
                             max_new_tokens=max_new_tokens, eos_id=eos_id, key=key)  # fmt: skip
        record = {"version": FORMAT_VERSION, "key": cache_key, "ratio": ratio, "tau": tau}
        autotune.keep_record(path, record)
    choice = HiSpecChoice(
        use_hispec=record["ratio"] > 1.0, ratio=float(record["ratio"]), tau=float(record["tau"]),
        label=label_of(hispec),
    )  # fmt: skip
    if announce:
        print(f"[specjax] {choice.describe()}", file=sys.stderr, flush=True)
    _CHOSEN[memo_key] = (choice, target, hispec)  # holding them keeps their ids unique
    return choice
