"""Attention dispatch: one entry for prefill, decode and tree verification.

Axis letters: B batch, N query (tree) nodes, S cache length, H query heads, K kv heads, D head dim.

Every query block is written into the cache at positions [lengths[b], lengths[b] + N) before
attention, so the three cases share one mask rule: query i of row b sees key position j iff
j < lengths[b] (committed context) or j = lengths[b] + m with tree_mask[b, i, m] (the block: causal
for prefill, ancestors-or-self for a draft tree, just itself for one-token decode).

Implementations: "reference" (plain jnp, the CPU default), "pallas" (the flash-style kernel in
specjax.kernels.tree_attention, compiled for TPU/GPU), "interpret" (the same kernel in Pallas
interpret mode, for CPU tests). "auto" picks "pallas" on accelerators and "reference" on CPU.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

AttentionImpl = Literal["auto", "reference", "pallas", "interpret"]
ATTENTION_IMPLS = ("auto", "reference", "pallas", "interpret")


def block_visibility(lengths: jax.Array, tree_mask: jax.Array, cache_len: int) -> jax.Array:
    """Boolean [B, N, S]: which cache positions each query of the block may attend to."""
    n = tree_mask.shape[-1]
    pos = jnp.arange(cache_len)[None, :]  # [1, S]
    offset = pos - lengths[:, None]  # [B, S]: position relative to the block start
    in_block = (offset >= 0) & (offset < n)
    # tree_mask[b, i, offset] for positions inside the block (clipped gather, masked after).
    block_vis = jnp.take_along_axis(
        tree_mask,
        jnp.broadcast_to(
            jnp.clip(offset, 0, n - 1)[:, None, :], tree_mask.shape[:2] + (cache_len,)
        ),
        axis=2,
    )
    committed = (offset < 0)[:, None, :]
    return committed | (in_block[:, None, :] & block_vis)


def reference_attention(q, k, v, lengths, tree_mask, visible=None):
    """Plain-jnp tree attention. q [B,N,H,D], k/v [B,S,K,D], lengths [B], tree_mask [B,N,N];
    visible [B,N,S'] (S' >= S) the precomputed block_visibility, so a caller running many layers
    builds it once."""
    b, n, h, d = q.shape
    s, kh = k.shape[1], k.shape[2]
    g = h // kh
    q5 = q.reshape(b, n, kh, g, d).astype(jnp.float32)
    scores = jnp.einsum("BNKGD,BSKD->BKGNS", q5, k.astype(jnp.float32)) / jnp.sqrt(d)
    if visible is None:
        visible = block_visibility(lengths, tree_mask, s)
    scores = jnp.where(visible[:, None, None, :, :s], scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("BKGNS,BSKD->BNKGD", weights, v.astype(jnp.float32))
    return out.reshape(b, n, h, d).astype(q.dtype)


# Smallest cache prefix the bucketed reference attention reads; buckets double from here.
MIN_ATTENTION_BUCKET = 128


def attention_buckets(cache_len: int) -> tuple[int, ...]:
    """Static cache-prefix lengths the reference attention may read: 128, 256, ... below
    cache_len, then cache_len itself."""
    sizes, size = [], MIN_ATTENTION_BUCKET
    while size < cache_len:
        sizes.append(size)
        size *= 2
    return (*sizes, cache_len)


def bucket_index(lengths: jax.Array, block: int, buckets: tuple[int, ...]) -> jax.Array:
    """Index of the smallest bucket covering every row's [0, lengths + block) (a traced int)."""
    need = jnp.max(lengths) + block
    return jnp.sum(jnp.asarray(buckets[:-1]) < need).astype(jnp.int32)


def bucketed_reference_attention(q, k, v, lengths, tree_mask, visible, bucket):
    """reference_attention over the cache prefix [0, buckets[bucket]) only: on a CPU attention
    cost is the cache read, so a short context should not pay for the whole static cache.
    bucket: traced index into attention_buckets(S) (see bucket_index); visible [B,N,S]."""
    buckets = attention_buckets(k.shape[1])
    if len(buckets) == 1:
        return reference_attention(q, k, v, lengths, tree_mask, visible)
    branches = [
        lambda q, k, v, vis, size=size: reference_attention(
            q, k[:, :size], v[:, :size], lengths, tree_mask, vis[..., :size]
        )
        for size in buckets
    ]
    return jax.lax.switch(bucket, branches, q, k, v, visible)


def resolve_impl(impl: AttentionImpl) -> str:
    if impl not in ATTENTION_IMPLS:
        raise ValueError(
            f"unknown attention implementation {impl!r}; choose from {ATTENTION_IMPLS}"
        )
    if impl == "auto":
        return "reference" if jax.default_backend() == "cpu" else "pallas"
    return impl


def attend(q, k, v, lengths, tree_mask, impl: AttentionImpl = "auto", *, visible=None, bucket=None):
    """Tree attention through the chosen implementation; shapes as in reference_attention.

    visible [B,N,S] and bucket (scalar int, see bucket_index) are optional precomputations for
    the reference implementation: with a bucket it reads only that cache prefix."""
    impl = resolve_impl(impl)
    if impl == "reference":
        if bucket is not None:
            if visible is None:
                visible = block_visibility(lengths, tree_mask, k.shape[1])
            return bucketed_reference_attention(q, k, v, lengths, tree_mask, visible, bucket)
        return reference_attention(q, k, v, lengths, tree_mask, visible)
    from specjax.kernels.tree_attention import tree_attention

    return tree_attention(q, k, v, lengths, tree_mask, interpret=(impl == "interpret"))
