"""Tree-attention microbenchmark: the Pallas kernel vs the plain-jnp reference compiled by XLA.

Axis letters: B batch, N tree nodes, S cache length, H query heads, K kv heads, D head dim.

Tree verification is memory-bound: each call streams a row's committed K/V once. The figure of
merit is therefore the achieved bandwidth, bytes of K/V a call must read (sum over rows of
(lengths[b] + N) * K * D * 2 tensors * itemsize) divided by its time, as a fraction of the
device's peak HBM bandwidth. The same byte count is used for the reference (which in fact reads
the whole S-long cache and materialises [B, K, G, N, S] scores), so the fractions compare the two
on the work that is actually needed.

    python experiments/bench_tree_attention.py           # GPU/TPU: B=1..8, N=64, S=2048/8192,
                                                          # H=32, K=8, D=128, bf16; on a GPU
                                                          # writes results/tree_attention_gpu.md
    python experiments/bench_tree_attention.py --smoke   # tiny shapes, runs anywhere (CPU:
                                                          # interpret mode, nothing written)
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from specjax.kernels.tree_attention import tree_attention, tree_attention_reference

from specjax.benchmark import device_header, time_interleaved
from specjax.tree import static_ancestor_mask

RESULTS = Path(__file__).resolve().parent / "results"

# Peak HBM bandwidth in bytes/s by device_kind substring; the first match wins, so specific
# names come before their families. Vendor datasheet numbers.
PEAK_BANDWIDTH = [
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100", 3.35e12),  # SXM5 80GB HBM3 ("NVIDIA H100 80GB HBM3")
    ("GH200", 4.0e12),
    ("H200", 4.8e12),
    ("B200", 8.0e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),  # 40GB parts
    ("L40S", 0.864e12),
    ("L4", 0.3e12),
    ("A10G", 0.6e12),
    ("RTX 4090", 1.008e12),
    ("TPU v4", 1.2e12),
    ("TPU v5 lite", 0.819e12),
    ("TPU v5e", 0.819e12),
    ("TPU v5p", 2.765e12),
    ("TPU v5", 2.765e12),
    ("TPU v6 lite", 1.64e12),
    ("TPU v6e", 1.64e12),
]


def peak_bandwidth(device_kind: str) -> float | None:
    """Peak bytes/s for a jax device_kind, or None when unknown (e.g. CPU)."""
    for name, peak in PEAK_BANDWIDTH:
        if name.lower() in device_kind.lower():
            return peak
    return None


def random_tree_mask(rng: np.random.Generator, batch: int, n: int) -> np.ndarray:
    """[B, N, N] ancestors-or-self masks of random trees (parents[i] < i, node 0 the root)."""
    return np.stack(
        [
            static_ancestor_mask([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
            for _ in range(batch)
        ]
    )


def make_inputs(b, n, s, h, kh, d, dtype, seed=0):
    """q [B,N,H,D], k/v [B,S,K,D], lengths [B] = S - N (a full cache), tree_mask [B,N,N]."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, n, h, d)), dtype)
    k = jnp.asarray(rng.standard_normal((b, s, kh, d)), dtype)
    v = jnp.asarray(rng.standard_normal((b, s, kh, d)), dtype)
    lengths = jnp.full((b,), s - n, jnp.int32)
    return q, k, v, lengths, jnp.asarray(random_tree_mask(rng, b, n))


def kv_bytes(lengths, n, kh, d, dtype) -> int:
    """Bytes of K and V a call must read: rows [0, lengths[b] + N) of both caches."""
    rows = int(np.sum(np.asarray(lengths) + n))
    return rows * kh * d * 2 * jnp.dtype(dtype).itemsize


def run(args) -> str:
    dtype = {"bf16": jnp.bfloat16, "f32": jnp.float32, "f16": jnp.float16}[args.dtype]
    dev = jax.devices()[0]
    peak = peak_bandwidth(dev.device_kind)
    interpret = jax.default_backend() == "cpu"
    kernel = jax.jit(functools.partial(tree_attention, interpret=interpret))
    reference = jax.jit(tree_attention_reference)
    header = (
        "| B | N | S | kernel ms | kernel GB/s | kernel % peak | XLA ref ms | XLA GB/s "
        "| XLA % peak | speedup | max abs err |\n|" + "---|" * 11
    )
    lines = [header]
    print(header, flush=True)
    for s in args.seqs:
        for b in args.batches:
            inputs = make_inputs(b, args.nodes, s, args.heads, args.kv_heads, args.head_dim, dtype)
            timings = time_interleaved(
                {"kernel": lambda x=inputs: kernel(*x), "ref": lambda x=inputs: reference(*x)},
                reps=args.reps,
            )
            err = float(
                jnp.max(
                    jnp.abs(
                        kernel(*inputs).astype(jnp.float32) - reference(*inputs).astype(jnp.float32)
                    )
                )
            )
            nbytes = kv_bytes(inputs[3], args.nodes, args.kv_heads, args.head_dim, dtype)
            row = [str(b), str(args.nodes), str(s)]
            for name in ("kernel", "ref"):
                t = timings[name].median
                bw = nbytes / t
                frac = f"{100 * bw / peak:.1f}%" if peak else "n/a"
                row += [f"{1e3 * t:.3f}", f"{bw / 1e9:.1f}", frac]
            row += [f"{timings['ref'].median / timings['kernel'].median:.2f}x", f"{err:.2e}"]
            line = "| " + " | ".join(row) + " |"
            lines.append(line)
            print(line, flush=True)
    settings = device_header(
        shapes=f"H={args.heads}, K={args.kv_heads}, D={args.head_dim}, {args.dtype}, "
        f"lengths = S - N (full cache)",
        peak_bandwidth=f"{peak / 1e12:.2f} TB/s" if peak else "unknown for this device",
        timing=f"median of {args.reps} runs after a compile run, interleaved kernel/reference",
        kernel="interpret mode" if interpret else f"compiled Pallas ({jax.default_backend()})",
    )
    return (
        "# Tree attention: Pallas kernel vs XLA reference\n\n"
        + settings
        + "\n\nBandwidth = bytes of K/V the call must read (rows [0, lengths + N) of both caches)"
        " / median time, for both columns.\n\n" + "\n".join(lines) + "\n"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes; runs on CPU (interpret)")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    p.add_argument("--seqs", type=lambda s: [int(x) for x in s.split(",")], default=[2048, 8192])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "f32", "f16"], default="bf16")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results file (default on GPU: experiments/results/tree_attention_gpu.md)",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.batches, args.seqs, args.nodes = [1, 2], [96], 7
        args.heads, args.kv_heads, args.head_dim, args.reps = 4, 2, 64, 2
    report = run(args)
    out = args.out
    if out is None and jax.default_backend() == "gpu" and not args.smoke:
        out = RESULTS / "tree_attention_gpu.md"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
