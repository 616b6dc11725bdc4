"""Plain-jnp tree attention under specjax.attention's contract (query i of row b sees key
position j iff j < lengths[b] or j = lengths[b] + m with tree_mask[b, i, m]). A module of its own
below specjax.attention, so that the kernels, whose gradients run through it, need not import the
dispatch that imports them.

Axis letters: B batch, N query (tree) nodes, S cache length, H query heads, K kv heads, D head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
    """Plain-jnp tree attention. q [B,N,H,D], k/v [B,S,K,D], lengths [B], tree_mask [B,N,M]
    (M block keys at lengths .. lengths + M - 1, usually M = N);
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
