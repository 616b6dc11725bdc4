"""Measurement helpers shared by the experiments: prompt sets, interleaved timing, headers.

Speed is always measured side by side in one process: every repetition runs each method once, in
turn, so drifts of the machine hit all methods alike; compile time is measured separately (the
first call of each method) and excluded from the repetitions.
"""

from __future__ import annotations

import dataclasses
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
    """Call each method once to compile (timed as compile_s), then `reps` interleaved timed runs.

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
    for _ in range(reps):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            timings[name].runs_s.append(time.perf_counter() - t0)
    for t in timings.values():  # the first call also ran the program once
        t.compile_s = max(t.compile_s - t.median, 0.0)
    return timings


def mean_ci(values, z: float = 1.96) -> tuple[float, float]:
    """Mean and the half-width of its normal-approximation 95% confidence interval."""
    arr = np.asarray(values, np.float64)
    if arr.size < 2:
        return float(arr.mean()), float("nan")
    return float(arr.mean()), float(z * arr.std(ddof=1) / np.sqrt(arr.size))


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


def device_header(**settings) -> str:
    """A markdown header naming the machine (CPU model included) and the settings of a results
    file."""
    dev = jax.devices()[0]
    lines = [
        f"- backend: {jax.default_backend()}, device: {dev.device_kind}, "
        f"host: {platform.machine()} ({cpu_model()}, {os.cpu_count()} cores), "
        f"jax {jax.__version__}",
    ]
    lines += [f"- {k.replace('_', ' ')}: {v}" for k, v in settings.items()]
    return "\n".join(lines)
