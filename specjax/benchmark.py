"""Measurement helpers shared by the experiments: prompt sets, interleaved timing, headers.

Speed is always measured side by side in one process: every repetition runs each method once, in
turn, so drifts of the machine hit all methods alike; compile time is measured separately (the
first call of each method) and excluded from the repetitions.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import statistics
import time
from collections.abc import Callable

import jax
import numpy as np

from specjax.models.precision import has_amx


@dataclasses.dataclass
class Timing:
    compile_s: float
    runs_s: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.runs_s)

    @property
    def spread(self) -> tuple[float, float]:
        return min(self.runs_s), max(self.runs_s)


def time_interleaved(methods: dict[str, Callable[[], object]], reps: int = 3) -> dict[str, Timing]:
    """Call each method once to compile (timed as compile_s), then `reps` interleaved timed runs,
    each repetition's order rotated by one.

    Each callable must block until its result is ready (or return arrays; they are waited on).
    A method with a `settle()` is called once more after every method's first call (added to
    its compile_s): SpecConfig.auto() calls sharing a drafter with later methods were measured
    compiling again in their first timed run after the later methods' first calls (the cause
    was not isolated), and such a compile belongs before the timed runs.
    """
    timings = {}
    for name, fn in methods.items():
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        timings[name] = Timing(compile_s=time.perf_counter() - t0, runs_s=[])
    for name, fn in methods.items():
        settle = getattr(fn, "settle", None)
        if settle is not None:
            t0 = time.perf_counter()
            jax.block_until_ready(settle())
            timings[name].compile_s += time.perf_counter() - t0
    names = list(methods)
    for r in range(reps):
        # Each repetition starts one method later, so that no method always runs first (after
        # another library's threads, or as the machine drifts within a repetition).
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = methods[name]
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            timings[name].runs_s.append(time.perf_counter() - t0)
    for t in timings.values():  # the first call also ran the program once
        t.compile_s = max(t.compile_s - t.median, 0.0)
    return timings


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with df degrees of freedom: exact for df 1 and 2, else the
    Cornish-Fisher expansion around the normal quantile (Abramowitz & Stegun 26.7.5; at
    p = 0.975 within 0.004 of the exact value at df 3, within 0.001 from df 4)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def mean_ci(values, level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval at `level` (the prompt sets
    are small: at 8 prompts the t interval is 21% wider than the normal one); NaN half-width
    for fewer than 2 values."""
    arr = np.asarray(values, np.float64)
    if arr.size < 2:
        return float(arr.mean()), float("nan")
    t = t_quantile(0.5 + level / 2, arr.size - 1)
    return float(arr.mean()), float(t * arr.std(ddof=1) / np.sqrt(arr.size))


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The host CPU's model name and its widest vector instructions, e.g. "AMD EPYC (AVX-512)",
    with ", AMX" where it has Intel's bfloat16 matrix units (from cpuinfo on Linux, else what
    platform reports). Why the instructions: machines that report the same name differ in them,
    and with them in the cost of a few-row product; AMX makes bfloat16 products ~4-5x faster
    than float32 ones (drafter training: TrainConfig.products). A name without a model number
    (virtual machines often report just "AMD EPYC") gets the CPU family and model numbers,
    e.g. "AMD EPYC family 25 model 17", which tell the generations apart."""
    name, flags, ids = None, set(), {}
    try:
        for line in open(cpuinfo, encoding="utf-8"):
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "model name" and name is None:
                name = value
            elif key in ("cpu family", "model") and key not in ids:
                ids[key] = value
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    name = name or platform.processor() or "unknown"
    if not any(c.isdigit() for c in name) and len(ids) == 2:
        name += f" family {ids['cpu family']} model {ids['model']}"
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    if isa and has_amx(cpuinfo):  # the one place that knows AMX's flag
        isa += ", AMX"
    return f"{name} ({isa})" if isa else name


def machine_line() -> str:
    """This machine as results files name it: backend, device, CPU model, cores and jax version
    (what greedy decoding's exact floats, and so its tokens, depend on)."""
    dev = jax.devices()[0]
    return (
        f"backend: {jax.default_backend()}, device: {dev.device_kind}, "
        f"host: {platform.machine()} ({cpu_model()}, {os.cpu_count()} cores), "
        f"jax {jax.__version__}"
    )


def device_header(**settings) -> str:
    """A markdown header naming the machine (CPU model included) and the settings of a results
    file."""
    lines = [f"- {machine_line()}"]
    lines += [f"- {k.replace('_', ' ')}: {v}" for k, v in settings.items()]
    return "\n".join(lines)
