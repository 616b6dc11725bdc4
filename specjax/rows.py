"""Selecting rows of a decoding loop's carry, for finished-row compaction.

A carry's arrays hold one row per batch element: KV caches [L, B, S, K, D] on axis 1 (their
lengths [B] on axis 0), every other array with a leading axis of the batch size on axis 0 (the
same convention specjax.sharding.constrain_rows shards by). Anything else (scalars, the EOS id)
is shared by all rows and kept as it is.
"""

from __future__ import annotations

import jax

from specjax.cache import KVCache


def _is_cache(x) -> bool:
    return isinstance(x, KVCache)


def take_rows(tree, idx: jax.Array, batch: int):
    """The carry on rows idx [R] (of `batch`): every per-row array gathered along its row axis."""

    def take(x):
        if isinstance(x, KVCache):
            return KVCache(k=x.k[:, idx], v=x.v[:, idx], lengths=x.lengths[idx])
        if hasattr(x, "shape") and x.ndim >= 1 and x.shape[0] == batch:
            return x[idx]
        return x

    return jax.tree.map(take, tree, is_leaf=_is_cache)


def put_rows(full, part, rows: jax.Array, batch: int):
    """`full` (a carry of `batch` rows) with rows [R] replaced by `part`'s R rows, for every
    array the two share (caches dropped from `full`, or from both, are left out: see
    without_caches)."""

    def put(f, p):
        if f is None or not hasattr(f, "shape") or f.ndim < 1 or f.shape[0] != batch:
            return f
        return f.at[rows].set(p)

    return jax.tree.map(put, full, part, is_leaf=lambda x: x is None)


def without_caches(tree):
    """The carry with its KV caches replaced by None: what is left to report once rows stop
    (token buffers, counters), small enough to keep for every row while fewer rows decode."""
    return jax.tree.map(lambda x: None if isinstance(x, KVCache) else x, tree, is_leaf=_is_cache)
