"""Prefill: running the prompts into a fresh cache, without paying for padding in large batches.

Axis letters: B batch, T prompt tokens (padded), S cache length, V vocab, M model dim, R rows of
a group, C tokens of a chunk, L layers.

Prompts arrive right-padded to the longest one, so one block [B, T] runs B x T token positions
however short most prompts are (the first 32 MT-bench prompts: 3,156 tokens padded to 13,312).
For batches of at least PACKED_MIN_BATCH rows the prefill runs instead as a loop of work items
inside the jitted program: the rows are sorted by prompt length, taken in groups of R, and each
group runs the chunks [c*C, (c+1)*C) that its longest prompt reaches, one [R, C] forward per
item on the group's cache rows (gathered, then written back). A short prompt then costs its own
chunks, not the longest prompt's. Everything is static-shaped (one compiled forward of [R, C]);
only the number of loop iterations depends on the prompts.

Tokens past a row's prompt inside its last chunk are computed and written past its length like
the padding of the one-block prefill: never attended to, overwritten by the row's next tokens.
The last chunk of a prompt starts at min(c*C, T - C), so no item writes past position T (the
cache may be exactly T + 1 long); an overlapped position is recomputed from the same cache and
gets the same K/V.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.cache import KVCache
from specjax.sharding import active_mesh
from specjax.tree import causal_mask

PACKED_MIN_BATCH = 8  # smaller batches lose little to padding; one block is simpler there
PACKED_ROWS = 4  # rows per work item (R): measured best with C = 64 for SmolLM2 at B = 32
PACKED_CHUNK = 64  # prompt tokens per work item (C)


def prefill(
    model,
    ids: jax.Array,
    prompt_lens: jax.Array,
    cache: KVCache,
    attn_impl: str,
    return_hidden: tuple[int, ...] = (),
):
    """Run the padded prompts ids [B, T] (prompt_lens [B]) from position 0.

    Returns (logits at each row's last prompt token [B, V], cache with lengths = prompt_lens,
    {i: [B, T, M]} requested hidden states; positions past a row's prompt hold no meaning).
    Large batches (and no device mesh: the groups gather rows across the batch) take the packed
    path of the module docstring; the two paths agree to float rounding (tested)."""
    b, t = ids.shape
    if b >= PACKED_MIN_BATCH and t > PACKED_CHUNK and active_mesh() is None:
        return packed_prefill(model, ids, prompt_lens, cache, attn_impl, return_hidden)
    return block_prefill(model, ids, prompt_lens, cache, attn_impl, return_hidden)


def block_prefill(model, ids, prompt_lens, cache, attn_impl, return_hidden=()):
    """The prompts as one causal block [B, T] (see prefill)."""
    b, t = ids.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    out = model(
        ids,
        positions=positions,
        cache=cache,
        tree_mask=causal_mask(b, t),
        logits_index=(prompt_lens - 1)[:, None],
        return_hidden=return_hidden,
        attn_impl=attn_impl,
    )
    cache = out.cache.replace(lengths=prompt_lens)
    return out.logits[:, 0], cache, out.hidden


def packed_prefill(
    model,
    ids,
    prompt_lens,
    cache,
    attn_impl,
    return_hidden=(),
    *,
    rows: int = PACKED_ROWS,
    chunk: int = PACKED_CHUNK,
):
    """The prompts as a loop of [rows, chunk] work items over length-sorted groups (see the
    module docstring); chunk is capped at T."""
    b, t = ids.shape
    cfg = model.config
    last = cfg.n_layers
    rows = min(rows, b)
    chunk = min(chunk, t)
    n_groups = -(-b // rows)
    order = jnp.argsort(-prompt_lens, stable=True).astype(jnp.int32)  # longest first
    # Group g holds order[start_g : start_g + rows]; the last group overlaps its neighbour when
    # rows does not divide B (its shared rows are recomputed from the same inputs).
    group_start = jnp.minimum(jnp.arange(n_groups, dtype=jnp.int32) * rows, b - rows)
    group_len = prompt_lens[order[group_start]]  # the longest prompt of each group
    group_chunks = -(-group_len // chunk)
    wanted = tuple(sorted(set(return_hidden) | {last}))
    hidden = {i: jnp.zeros((b, t, cfg.d_model), jnp.dtype(cfg.dtype)) for i in return_hidden}
    last_hidden = jnp.zeros((b, cfg.d_model), jnp.dtype(cfg.dtype))

    def item(carry):
        g, c, k_all, v_all, hidden, last_hidden = carry
        members = jax.lax.dynamic_slice(order, (group_start[g],), (rows,))  # [R]
        start = jnp.minimum(c * chunk, t - chunk)
        tokens = jax.lax.dynamic_slice_in_dim(ids[members], start, chunk, axis=1)  # [R, C]
        sub = KVCache(
            k=k_all[:, members], v=v_all[:, members], lengths=jnp.full((rows,), start, jnp.int32)
        )
        positions = start + jnp.broadcast_to(jnp.arange(chunk, dtype=jnp.int32), (rows, chunk))
        out = model(
            tokens,
            positions=positions,
            cache=sub,
            tree_mask=causal_mask(rows, chunk),
            return_hidden=wanted,
            compute_logits=False,
            attn_impl=attn_impl,
        )
        k_all = k_all.at[:, members].set(out.cache.k)
        v_all = v_all.at[:, members].set(out.cache.v)
        hidden = {
            i: h.at[members].set(
                jax.lax.dynamic_update_slice_in_dim(
                    h[members], out.hidden[i].astype(h.dtype), start, axis=1
                )
            )
            for i, h in hidden.items()
        }
        # The last prompt token's output, for the rows whose prompt ends in this chunk.
        end = prompt_lens[members] - 1 - start  # [R] index inside the chunk
        inside = (end >= 0) & (end < chunk)
        at_end = jnp.take_along_axis(
            out.hidden[last], jnp.clip(end, 0, chunk - 1)[:, None, None], axis=1
        )[:, 0]
        last_hidden = last_hidden.at[members].set(
            jnp.where(inside[:, None], at_end.astype(last_hidden.dtype), last_hidden[members])
        )
        done_group = c + 1 >= group_chunks[g]
        g = jnp.where(done_group, g + 1, g)
        c = jnp.where(done_group, 0, c + 1)
        return g, c, k_all, v_all, hidden, last_hidden

    init = (jnp.int32(0), jnp.int32(0), cache.k, cache.v, hidden, last_hidden)
    _, _, k_all, v_all, hidden, last_hidden = jax.lax.while_loop(
        lambda s: s[0] < n_groups, item, init
    )
    logits = model.head(last_hidden)
    return logits, KVCache(k=k_all, v=v_all, lengths=prompt_lens), hidden
