"""Static-shape KV cache.

Axis letters: L layers, B batch, S cache length (static), K kv heads, D head dim, N tree nodes,
P accepted-path slots.

k, v: [L, B, S, K, D]; lengths [B] = number of committed positions per row. A forward pass writes
its block at [lengths, lengths + T) without changing lengths; committing decides what stays.
Positions at or past lengths are scratch: they are overwritten by the next block, so rejected
draft tokens need no rollback.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from specjax.config import ModelConfig


@flax.struct.dataclass
class KVCache:
    k: jax.Array  # [L, B, S, K, D]
    v: jax.Array  # [L, B, S, K, D]
    lengths: jax.Array  # [B] int32

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache for `batch` rows of `max_len` positions."""
    dtype = dtype or jnp.dtype(cfg.dtype)
    shape = (cfg.n_layers, batch, max_len, cfg.n_kv_heads, cfg.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), lengths=jnp.zeros((batch,), jnp.int32)
    )


def commit_path(cache: KVCache, path: jax.Array, advance: jax.Array) -> KVCache:
    """Move the accepted tree nodes' K/V into contiguous positions and advance lengths.

    The verified tree block sits at scratch slots [lengths, lengths + N); node i at lengths + i.
    path [B, P] lists accepted node indices from the root (path[:, 0] = 0 = the root, which is the
    last committed token fed again; slots past the accepted nodes hold 0). After the commit, slot
    lengths + j holds node path[j] for every accepted j, and lengths += advance [B] (typically
    n_accepted + 1 for live rows, 0 for finished rows).
    """

    def one_row(kv_row, start, row_path):
        # kv_row [L, S, K, D]; gather the P path slots then write them back contiguously.
        src = start + row_path  # [P]
        gathered = jnp.take(kv_row, src, axis=1)  # [L, P, K, D]
        return jax.lax.dynamic_update_slice(kv_row, gathered, (0, start, 0, 0))

    def commit(kv):
        # Only the accepted slots matter; the copies past them land in scratch slots anyway.
        return jax.vmap(one_row, in_axes=(1, 0, 0), out_axes=1)(kv, cache.lengths, path)

    return KVCache(k=commit(cache.k), v=commit(cache.v), lengths=cache.lengths + advance)
