"""The CPU attention kernel against XLA's attention, over SmolLM2's heads.

A decoding or verification block of N queries attends over one layer of the KV cache at a
context of C committed positions, in a cache of S static slots; 30 layers in a jitted loop, as a
forward runs them (the cache read, not written: in the target's layer scan, which writes it,
XLA also copies each layer's slice out). XLA's attention ("reference": the layer's slice out
of the whole cache, all S slots computed, masked) costs what S makes it cost; the kernel
("cpu") reads the layer in place and only the C + N visible positions. Cache sizes: S = C + 40
(a cache barely larger than the context) and S = 2 C + 64 (a call halfway through generating as
many tokens as its prompt held).

    python experiments/cpu_attention.py [--out experiments/results/cpu_attention.md]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from specjax.kernels import cpu_panels

from specjax.attention import reference_attention
from specjax.benchmark import device_header

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 30, 9, 3, 64  # SmolLM2-135M


def forward_time(impl: str, n: int, context: int, slots: int, reps: int) -> float:
    """Median seconds of 30 layers' attention (each layer's output feeds the next query)."""
    from specjax.kernels.cpu_panels.cache_attention import cache_attention

    rng = np.random.default_rng(0)
    shape = (LAYERS, 1, slots, KV_HEADS, HEAD_DIM)
    k = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    v = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    q = jnp.asarray(rng.standard_normal((1, n, HEADS, HEAD_DIM)), jnp.float32)
    lengths = jnp.array([context], jnp.int32)
    mask = jnp.tril(jnp.ones((1, n, n), bool))

    def layer(i, x, k, v):
        if impl == "cpu":
            return x + cache_attention(q + x, k, v, i, lengths, mask)
        k_i = jax.lax.dynamic_index_in_dim(k, i, 0, keepdims=False)
        v_i = jax.lax.dynamic_index_in_dim(v, i, 0, keepdims=False)
        return x + reference_attention(q + x, k_i, v_i, lengths, mask)

    def forward(k, v):
        return jax.lax.fori_loop(0, LAYERS, lambda i, x: layer(i, x, k, v), jnp.zeros_like(q))

    run = jax.jit(forward)
    jax.block_until_ready(run(k, v))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(run(k, v))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/results/cpu_attention.md")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    if not cpu_panels.available():
        raise SystemExit("the CPU kernels do not build here: nothing to compare")
    rows = []
    for n in (1, 8, 16):
        for context in (128, 256, 512):
            for slots in (context + 40, 2 * context + 64):
                # Interleaved, so that a drift of the CPU's speed hits both alike.
                xla, kernel = [], []
                for _ in range(3):
                    xla.append(forward_time("reference", n, context, slots, args.reps))
                    kernel.append(forward_time("cpu", n, context, slots, args.reps))
                x, c = float(np.median(xla)), float(np.median(kernel))
                rows.append((n, context, slots, x, c))
                print(f"N {n} C {context} S {slots}: XLA {x * 1e3:.2f} ms, kernel {c * 1e3:.2f} ms")
    lines = [
        "# Attention over the KV cache on CPU: the kernel against XLA",
        "",
        device_header(command=f"python experiments/cpu_attention.py --reps {args.reps}"),
        "- what: 30 layers of SmolLM2's attention (9 heads, 3 kv heads, head dim 64), one row, "
        "a block of N queries (causal) at C committed positions in a cache of S slots, in one "
        "jitted loop over the layers (the cache read, not written); median of 3 interleaved "
        "rounds of the median "
        f"of {args.reps} calls",
        "",
        "| N | context C | cache S | XLA ms | kernel ms | XLA / kernel |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {n} | {c} | {s} | {x * 1e3:.2f} | {k * 1e3:.2f} | {x / k:.2f}x |"
        for n, c, s, x, k in rows
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
