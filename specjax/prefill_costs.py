"""What a call pays before its first decoded token: the prefill's seconds, measured on this
backend and kept on disk, so that SpecConfig.auto() predicts a whole call's speedup
(specjax.choice.Choice.for_call), not only its decoding steps'.

Axis letters: B batch, W padded prompt width.

Why: a call's time is prefill + decoding. The prefill costs the same with or without a draft
tree, so it pulls a call's speedup towards 1: SmolLM2's prefill of an MT-bench prompt is 50-120
ms of a 0.6-1.5 s speculative call of 64 new tokens on 2-core CPUs, and leaving it out
overstated the predicted speedup by ~5-7%.

The prefill is timed as a whole plain call that decodes one token (the target over the padded
prompts, the first token, and what every call pays around its compiled programs: ~1.5 ms on a
2-core CPU, a quarter of a 128-token call of stories260K, where leaving it out overstated the
predicted speedup by ~30%), at powers of two of the width, each once per machine (the same
key as the target's costs: backend, device kind, weights, batch, dtype, layout), and
interpolated linearly between the two that bracket a call's width. A speculative call's prefill
runs the same target forward, plus the drafter's own prefill (a feature drafter's one layer over
the prompt, ~1/30 of SmolLM2's): the prediction takes plain decoding's for both.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax.autotune import cost_key, filler_prompts, keep_record, kept_record

FORMAT_VERSION = 2  # 2: a whole one-token call, not the compiled start alone
MIN_WIDTH = 16  # widths are bracketed by powers of two from here
REPS = 3

# Seconds already read or measured in this process, by (id(target), batch, width), with the
# target held so that its id stays unique: a call of a small model lasts a few milliseconds,
# and reading the file again (the key fingerprints the weights) would be a visible part of it.
_KNOWN: dict[tuple[int, int, int], tuple[float, object]] = {}


def bracket(width: int) -> tuple[int, int]:
    """The powers of two (>= MIN_WIDTH) at or around `width`: (w, w) when it is one of them."""
    lo = MIN_WIDTH
    while lo * 2 <= width:
        lo *= 2
    return (lo, lo) if width <= lo else (lo, lo * 2)


def measure_prefill(target, *, batch: int, width: int, reps: int = REPS) -> float:
    """Seconds of a whole specjax.generate call of `batch` filler prompts of `width` tokens
    that decodes one token (its prefill and first token, and what any call pays around its
    compiled programs: arguments split and placed, dispatch, outputs), compiled once and timed
    as the median of `reps` calls."""
    from specjax.decode import generate

    prompts = jnp.asarray(filler_prompts(target, batch, width), jnp.int32)
    call = lambda: jax.block_until_ready(generate(target, prompts, max_new_tokens=1).tokens)  # noqa: E731
    call()  # compiles
    seconds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - t0)
    return float(np.median(seconds))


def prefill_seconds(
    target, *, batch: int, width: int, progress: Callable[[str], None] | None = None
) -> float:
    """Seconds of the prefill of `batch` prompts padded to `width` tokens on this backend:
    linear between the measured powers of two that bracket `width` (each measured on first use,
    with a progress line, and kept in the cache folder)."""
    if width < 1 or batch < 1:
        raise ValueError(f"prefill_seconds needs batch >= 1 and width >= 1, got {batch}, {width}")
    lo, hi = bracket(width)
    t_lo = _kept_or_measured(target, batch, lo, progress)
    if hi == lo:
        return t_lo
    t_hi = _kept_or_measured(target, batch, hi, progress)
    return t_lo + (t_hi - t_lo) * (width - lo) / (hi - lo)


def keep_prefill_seconds(target, *, batch: int, width: int, seconds: float) -> None:
    """Keep `seconds` as the prefill of `batch` rows of `width` tokens (a power of two)."""
    key = cost_key(target, batch=batch, context=width)
    path, _ = kept_record(key, "prefill", FORMAT_VERSION)
    keep_record(path, {"version": FORMAT_VERSION, "key": key, "seconds": float(seconds)})
    _KNOWN.pop((id(target), batch, width), None)


def _kept_or_measured(target, batch: int, width: int, progress) -> float:
    known = _KNOWN.get((id(target), batch, width))
    if known is not None:
        return known[0]
    _, record = kept_record(cost_key(target, batch=batch, context=width), "prefill", FORMAT_VERSION)
    if record is not None:
        seconds = float(record["seconds"])
    else:
        if progress is not None:
            progress(f"measuring the prefill: {batch} row(s) of {width} tokens")
        seconds = measure_prefill(target, batch=batch, width=width)
        keep_prefill_seconds(target, batch=batch, width=width, seconds=seconds)
    _KNOWN[(id(target), batch, width)] = (seconds, target)
    return seconds
