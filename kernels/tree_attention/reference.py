"""Tree attention, the specification: plain jnp, materialised mask, softmax in float32.

Axis letters: B batch, N tree nodes (queries), S cache length, H query heads, K kv heads,
D head dim, G = H // K query heads per kv head.

The tree block's keys/values are already written into the cache at positions
[lengths[b], lengths[b] + N). Query i of row b sees key position j iff

    j < lengths[b]                                   (committed context), or
    j = lengths[b] + m and tree_mask[b, i, m]         (its ancestors-or-self in the tree).

Prefill is the special case lengths = 0 with a causal tree_mask, one-token decode is N = 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def visibility(lengths: jax.Array, tree_mask: jax.Array, cache_len: int) -> jax.Array:
    """Which cache positions each query may attend to.

    Args:
      lengths: [B] int32, committed length per row.
      tree_mask: [B, N, N] bool, tree_mask[b, i, m] = node m is node i or an ancestor of it.
      cache_len: S, the cache length.

    Returns:
      [B, N, S] bool.
    """
    n = tree_mask.shape[-1]
    pos = jnp.arange(cache_len, dtype=jnp.int32)[None, :]  # [1, S]
    offset = pos - lengths[:, None].astype(jnp.int32)  # [B, S]: position relative to the block
    in_block = (offset >= 0) & (offset < n)
    # tree_mask[b, i, offset] through a clipped gather; positions outside the block are masked
    # out by in_block afterwards, so the clipping never leaks.
    idx = jnp.broadcast_to(
        jnp.clip(offset, 0, n - 1)[:, None, :], tree_mask.shape[:2] + (cache_len,)
    )
    tree_vis = jnp.take_along_axis(tree_mask, idx, axis=2)  # [B, N, S]
    committed = (offset < 0)[:, None, :]
    return committed | (in_block[:, None, :] & tree_vis)


def tree_attention_reference(
    q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array, tree_mask: jax.Array
) -> jax.Array:
    """Tree attention in plain jnp (the kernels are tested against this).

    Args:
      q: [B, N, H, D] queries of the tree block.
      k: [B, S, K, D] key cache (tree block already written at [lengths[b], lengths[b] + N)).
      v: [B, S, K, D] value cache, same layout.
      lengths: [B] int32 committed length per row; lengths[b] + N <= S.
      tree_mask: [B, N, N] bool ancestors-or-self mask (diagonal true).

    Returns:
      [B, N, H, D] in q's dtype. Scores are scaled by 1/sqrt(D); query head h reads kv head
      h // G.
    """
    b, n, h, d = q.shape
    s, kh = k.shape[1], k.shape[2]
    g = h // kh
    q5 = q.reshape(b, n, kh, g, d).astype(jnp.float32)
    hi = jax.lax.Precision.HIGHEST  # a specification: no reduced-precision matmul passes
    scores = jnp.einsum("bnkgd,bskd->bkgns", q5, k.astype(jnp.float32), precision=hi)
    scores = scores / jnp.sqrt(jnp.float32(d))
    visible = visibility(lengths, tree_mask, s)[:, None, None]  # [B, 1, 1, N, S]
    scores = jnp.where(visible, scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgns,bskd->bnkgd", weights, v.astype(jnp.float32), precision=hi)
    return out.reshape(b, n, h, d).astype(q.dtype)
