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


def tree_reserve(num_nodes: int, max_depth: int) -> int:
    """Cache slots a speculative step may touch past a row's committed length: the verified
    block writes num_nodes slots at lengths, a commit writes max_depth + 1 path slots there (a
    dynamic tree's budget can be smaller than its depth), and one slot of margin (the root is
    node 0 of the block, already counted)."""
    return max(num_nodes, max_depth + 1) + 1


def commit_path(
    cache: KVCache,
    path: jax.Array,
    advance: jax.Array,
    *,
    num_nodes: int,
    is_chain: bool = False,
    layers: tuple[int, int] | None = None,
) -> KVCache:
    """Move the accepted tree nodes' K/V into contiguous positions and advance lengths.

    The verified tree block sits at scratch slots [lengths, lengths + N); node i at lengths + i.
    path [B, P] lists accepted node indices from the root (path[:, 0] = 0 = the root, the
    pending token at position lengths, not yet in the cache before this block wrote it; slots
    past the accepted nodes hold 0). After the commit, slot
    lengths + j holds node path[j] for every accepted j, and lengths += advance [B] (typically
    n_accepted + 1 for live rows, 0 for finished rows).

    num_nodes: N (static); every row needs lengths + max(N, P) <= S (see tree_reserve).
    is_chain: node i of a chain already sits at lengths + i, so nothing moves.
    layers: move only layers [lo, hi) (an early-exit verifier writes the layers above its exit
    in path order already); None: all.
    Rows are moved one at a time (a fori_loop of small slices updated in place): a batched
    gather-and-scatter compiles to copies and transposes of the whole [L, B, S, K, D] cache.
    """
    lengths = cache.lengths + advance
    if is_chain:
        return cache.replace(lengths=lengths)
    n_layers, b, _, kh, d = cache.k.shape
    lo, hi = layers or (0, n_layers)

    def move(x, row, start, row_path):
        window = jax.lax.dynamic_slice(x, (lo, row, start, 0, 0), (hi - lo, 1, num_nodes, kh, d))
        moved = jnp.take(window, row_path, axis=2)  # [hi - lo, 1, P, K, D]
        return jax.lax.dynamic_update_slice(x, moved, (lo, row, start, 0, 0))

    def one_row(row, kv):
        start, row_path = cache.lengths[row], path[row]
        return tuple(move(x, row, start, row_path) for x in kv)

    k, v = jax.lax.fori_loop(0, b, one_row, (cache.k, cache.v))
    return KVCache(k=k, v=v, lengths=lengths)
