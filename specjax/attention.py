"""Attention dispatch: one entry for prefill, decode and tree verification.

Axis letters: B batch, N query (tree) nodes, S cache length, H query heads, K kv heads, D head dim.

Every query block is written into the cache at positions [lengths[b], lengths[b] + N) before
attention, so the three cases share one mask rule: query i of row b sees key position j iff
j < lengths[b] (committed context) or j = lengths[b] + m with tree_mask[b, i, m] (the block: causal
for prefill, ancestors-or-self for a draft tree, just itself for one-token decode).

Implementations: "reference" (plain jnp), "cpu" (the C++ kernel in
specjax.kernels.cpu_panels.cache_attention, which reads only the positions a query sees, in place
in the whole [L, B, S, K, D] cache: the CPU default where it builds), "pallas" (the flash-style
kernel in specjax.kernels.tree_attention, compiled for TPU/GPU), "interpret" (the same kernel in
Pallas interpret mode, for CPU tests). "auto" picks "pallas" on accelerators when the compiled
kernel takes the model's head dim (the GPU kernel needs a power of two >= 16: stories260K's D=8
does not qualify) and "reference" otherwise; on CPU "cpu" where the kernel builds (see
cpu_kernel_ok for the blocks it takes), else "reference".
"""

from __future__ import annotations

import functools
import os
from typing import Literal

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

# block_visibility and reference_attention stay importable from here (the dispatch's public names).
from specjax.attention_reference import block_visibility as block_visibility
from specjax.attention_reference import reference_attention as reference_attention
from specjax.sharding import DATA, active_mesh, kv_heads_axis

AttentionImpl = Literal["auto", "reference", "cpu", "pallas", "interpret"]
ATTENTION_IMPLS = ("auto", "reference", "cpu", "pallas", "interpret")
# Query blocks wider than this (prompts being prefilled) keep XLA's batched products even with
# "cpu": the kernel is written for a few queries over a long context, and a prefill runs once a
# call.
CPU_KERNEL_MAX_QUERIES = 64
CPU_ATTENTION_SWITCH = "SPECJAX_CPU_ATTENTION"  # "0": keep XLA's attention on CPU


def resolve_impl(impl: AttentionImpl, head_dim: int | None = None) -> str:
    """The implementation `impl` stands for on JAX's default backend; head_dim lets "auto" avoid
    a compiled kernel that cannot take it (None: assume it can)."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(
            f"unknown attention implementation {impl!r}; choose from {ATTENTION_IMPLS}"
        )
    if impl == "auto":
        if jax.default_backend() == "cpu":
            return "cpu" if _cpu_kernel_builds() else "reference"
        from specjax.kernels.tree_attention import compiled_supports

        return "pallas" if head_dim is None or compiled_supports(head_dim) else "reference"
    if impl == "cpu" and not _cpu_kernel_builds():
        raise ValueError(
            "attention implementation 'cpu' needs the CPU kernel, which is off here "
            f"({_cpu_kernel_why()}): use 'auto' or 'reference'"
        )
    if impl == "pallas":
        # Checked here, before tracing: the kernel's own errors name settings a caller of
        # speculative_generate cannot pass (interpret=..., Triton's head-dim limits).
        from specjax.kernels.tree_attention import compiled_supports

        if jax.default_backend() == "cpu":
            raise ValueError(
                "attention implementation 'pallas' compiles for a GPU or TPU: on a CPU use "
                "'interpret' (the same kernel interpreted), 'auto' or 'reference'"
            )
        if head_dim is not None and not compiled_supports(head_dim):
            raise ValueError(
                f"the compiled Pallas kernel cannot take head_dim {head_dim} on this "
                f"{jax.default_backend()}: use 'auto' or 'reference'"
            )
    return impl


def _cpu_kernel_builds() -> bool:
    from specjax.kernels import cpu_panels

    return os.environ.get(CPU_ATTENTION_SWITCH, "1") != "0" and cpu_panels.available()


def _cpu_kernel_why() -> str:
    from specjax.kernels import cpu_panels

    return cpu_panels.why_unavailable() or f"{CPU_ATTENTION_SWITCH}=0"


def cpu_kernel_ok(impl: str, n_queries: int, dtype) -> bool:
    """Whether a block of n_queries over a cache of `dtype` goes through the CPU kernel under the
    resolved implementation `impl`: float32 caches, blocks up to CPU_KERNEL_MAX_QUERIES, and no
    active mesh (XLA's partitioner cannot split a custom call: a sharded model keeps the jnp
    attention)."""
    return (
        impl == "cpu"
        and n_queries <= CPU_KERNEL_MAX_QUERIES
        and jnp.dtype(dtype) == jnp.float32
        and active_mesh() is None
    )


def attend_cache(q, k_all, v_all, layer, lengths, tree_mask, impl: AttentionImpl = "auto", *,
                 visible=None):  # fmt: skip
    """attend() over layer `layer` (traced) of the whole cache k_all / v_all [L, B, S, K, D]:
    the CPU kernel reads it in place, the other implementations read the layer's slice."""
    impl = resolve_impl(impl, q.shape[-1])
    if cpu_kernel_ok(impl, q.shape[1], k_all.dtype):
        from specjax.kernels.cpu_panels.cache_attention import cache_attention

        return cache_attention(q, k_all, v_all, layer, lengths, tree_mask)
    k = jax.lax.dynamic_index_in_dim(k_all, layer, 0, keepdims=False)
    v = jax.lax.dynamic_index_in_dim(v_all, layer, 0, keepdims=False)
    return attend(q, k, v, lengths, tree_mask, impl, visible=visible)


def attend(q, k, v, lengths, tree_mask, impl: AttentionImpl = "auto", *, visible=None):
    """Tree attention through the chosen implementation; shapes as in reference_attention.

    visible [B, N, S]: block_visibility precomputed by a caller that runs many layers (used by the
    reference implementation)."""
    impl = resolve_impl(impl, q.shape[-1])
    if cpu_kernel_ok(impl, q.shape[1], k.dtype):
        from specjax.kernels.cpu_panels.cache_attention import cache_attention

        return cache_attention(q, k[None], v[None], 0, lengths, tree_mask)
    if impl in ("reference", "cpu"):
        return reference_attention(q, k, v, lengths, tree_mask, visible)
    from specjax.kernels.tree_attention import tree_attention

    kernel = functools.partial(tree_attention, interpret=(impl == "interpret"))
    mesh = active_mesh()
    if mesh is None:
        return kernel(q, k, v, lengths, tree_mask)
    # A pallas_call is opaque to XLA's partitioner: run it per device on its rows and kv heads
    # (the query heads of a kv head group travel with it; heads replicate when K does not divide).
    heads = kv_heads_axis(k.shape[2], mesh)
    qkv = P(DATA, None, heads, None)
    return jax.shard_map(
        kernel,
        in_specs=(qkv, qkv, qkv, P(DATA), P(DATA, None, None)),
        out_specs=qkv,
        check_vma=False,
    )(q, k, v, lengths, tree_mask)
