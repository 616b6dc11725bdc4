"""Flash-style tree attention kernels in Pallas: a Triton-shaped variant and a Mosaic (TPU) one.

Axis letters: B batch, N tree nodes, S cache length, H query heads, K kv heads, D head dim,
G = H // K query heads per kv head, R = N * G rows of a query tile, P kv splits, W = 32-bit words
of the packed tree mask.

Both variants compute, per (b, kv head), the same thing as ``reference.tree_attention_reference``
with an online softmax (float32 statistics and accumulator), in two phases:

1. committed phase: the cache positions [0, lengths[b]) in blocks of ``block_k`` keys. Blocks at
   or past lengths[b] are never touched (dynamic loop bound on GPU, clamped block index plus
   ``pl.when`` on TPU), so a short row costs only its own length. Only the final, partial block
   needs a mask.
2. tree phase: the N tree keys/values, handed to the kernel as a separate small [N_pad, D] array
   per (b, kv head) (``ops.py`` gathers them from [lengths[b], lengths[b] + N) of the cache). With
   the tree at a fixed offset the ancestor mask becomes a static-shaped [rows, block_t] lookup
   into a bit-packed tree mask: no dynamic gathers and no unaligned dynamic slices, which keeps
   the same code valid for Triton, Mosaic and interpret mode.

Grouped-query attention without repeating K/V: one program serves all G query heads of a kv head,
stacked node-major into the rows of its query tile (row r = node r // G, head r % G), so every
K/V block is read once for G * N queries.

Masked scores use a large finite negative value instead of -inf: a row that is entirely masked
within one block then contributes exp(0) = 1 garbage terms, which are wiped exactly (factor
exp(MASK - m) = 0) as soon as the row meets a visible key, and every real row sees at least its
own node. Padded rows (rows_pad > R) are finite and dropped by the wrapper.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# Statistics scratch on TPU is kept lane-dense ([rows, 128]) like the upstream TPU kernels, which
# avoids relayouts of [rows, 1] columns in VMEM.
_TPU_LANES = 128


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Static tiling of one call. All fields are Python ints/floats (hashable, jit-static).

    Attributes:
      seq_len: S, cache length as the kernel sees it.
      n_nodes: N, real tree nodes.
      group: G = H // K.
      block_q: rows of a query tile.
      rows_pad: R = N * G rounded up to a multiple of block_q.
      block_k: keys per committed-phase block.
      block_t: tree nodes per tree-phase chunk.
      nodes_pad: N rounded up to a multiple of block_t (the tree K/V and mask are zero-padded).
      num_splits: P, committed-phase splits (flash-decoding); Triton variant only.
      scale: softmax scale, 1 / sqrt(D).
      precision: matmul precision (HIGHEST for float32 inputs, else DEFAULT).
    """

    seq_len: int
    n_nodes: int
    group: int
    block_q: int
    rows_pad: int
    block_k: int
    block_t: int
    nodes_pad: int
    num_splits: int
    scale: float
    precision: Any

    @property
    def n_q_blocks(self) -> int:
        return self.rows_pad // self.block_q

    @property
    def n_chunks(self) -> int:
        return self.nodes_pad // self.block_t

    @property
    def n_words(self) -> int:
        return -(-self.nodes_pad // 32)


# ---------------------------------------------------------------------------------------------
# Shared kernel pieces (traced inside both variants).
# ---------------------------------------------------------------------------------------------


def _scores(q: jax.Array, k: jax.Array, geo: Geometry) -> jax.Array:
    """q [rows, D] . k [keys, D]^T -> [rows, keys] float32, scaled."""
    s = lax.dot_general(
        q,
        k,
        (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=geo.precision,
    )
    return s * geo.scale


def _online_update(m_prev, l_prev, acc_prev, s, v, geo: Geometry):
    """One online-softmax step.

    Args:
      m_prev, l_prev: [rows, 1] float32 running max / normaliser.
      acc_prev: [rows, D] float32 unnormalised output.
      s: [rows, keys] float32 masked scores.
      v: [keys, D] values in the input dtype.
    """
    m_cur = jnp.max(s, axis=1, keepdims=True)
    m_next = jnp.maximum(m_prev, m_cur)
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - m_next)
    l_next = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
    # p is cast to the value dtype so bf16 inputs use the bf16 tensor-core/MXU path (standard
    # flash-attention practice); accumulation stays float32.
    pv = lax.dot_general(
        p.astype(v.dtype),
        v,
        (((1,), (0,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=geo.precision,
    )
    return m_next, l_next, alpha * acc_prev + pv


def _tree_visible(bits_ref, chunk: int, rows: int, geo: Geometry) -> jax.Array:
    """Ancestor mask of tree chunk ``chunk`` for the rows of this query tile: bool [rows, block_t].

    bits_ref is [rows, W] int32, bit (m % 32) of word m // 32 = "node m is visible to this row".
    A chunk either lies inside one word (block_t <= 32) or covers whole words, so the word of
    each column is selected with a short static chain of selects (no gather).
    """
    bt = geo.block_t
    node = lax.broadcasted_iota(jnp.int32, (rows, bt), 1) + chunk * bt
    first, last = (chunk * bt) // 32, ((chunk + 1) * bt - 1) // 32
    word = bits_ref[:, first : first + 1]  # [rows, 1]
    for w in range(first + 1, last + 1):
        word = jnp.where(lax.shift_right_logical(node, 5) == w, bits_ref[:, w : w + 1], word)
    bit = lax.shift_right_logical(word, node & 31) & 1
    return bit != 0


def _last_node(q_block, geo: Geometry):
    """Largest tree node index among the rows of query tile ``q_block`` (rows are node-major).

    Nodes only see ancestors (smaller indices), so tree chunks past this node are skipped:
    prefill with a causal mask does half the tree-phase work.
    """
    last_row = (q_block + 1) * geo.block_q - 1
    return jnp.minimum(lax.div(last_row, geo.group), geo.n_nodes - 1)


# ---------------------------------------------------------------------------------------------
# Triton-shaped variant (GPU; also what CPU interpret mode runs).
# ---------------------------------------------------------------------------------------------


def _triton_kernel(lengths_ref, q_ref, k_ref, v_ref, kt_ref, vt_ref, bits_ref, *out_refs, geo):
    """One program = (b, kv head, query tile[, split]).

    Refs: lengths [B]; q [bq, D]; k, v [S, D] (a strided view of this kv head: never copied, loads
    happen block by block inside the loop); kt, vt [N_pad, D]; bits [bq, W]. Outputs: o [bq, D]
    (normalised, P == 1) or o [bq, D] f32, m [bq, 1], l [bq, 1] (unnormalised partials, P > 1).
    """
    b, q_block = pl.program_id(0), pl.program_id(2)
    bk, s_len = geo.block_k, geo.seq_len
    length = lengths_ref[b]
    q = q_ref[...]
    rows, d = q.shape
    carry = (
        jnp.full((rows, 1), MASK_VALUE, jnp.float32),
        jnp.zeros((rows, 1), jnp.float32),
        jnp.zeros((rows, d), jnp.float32),
    )

    # Committed phase over blocks [lo, hi) of [0, lengths[b]); nothing past lengths[b] is read
    # except inside the one partial block. Full blocks need no mask at all.
    n_full = lax.div(length, bk)
    n_blocks = lax.div(length + (bk - 1), bk)
    if geo.num_splits > 1:
        split = pl.program_id(3)
        per_split = lax.div(n_blocks + (geo.num_splits - 1), geo.num_splits)
        lo = split * per_split
        hi = jnp.minimum(lo + per_split, n_blocks)
    else:
        lo, hi = 0, n_blocks

    def full_block(j, carry):
        start = j * bk
        s = _scores(q, k_ref[pl.ds(start, bk), :], geo)
        return _online_update(*carry, s, v_ref[pl.ds(start, bk), :], geo)

    def tail_block(carry):
        nominal = n_full * bk
        # The partial block may run past S (S need not be a multiple of bk): shift it back inside
        # the cache and mask the keys the previous block already covered (pos < nominal).
        start = jnp.minimum(nominal, s_len - bk)
        s = _scores(q, k_ref[pl.ds(start, bk), :], geo)
        pos = start + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        s = jnp.where((pos >= nominal) & (pos < length), s, MASK_VALUE)
        # Cache rows past lengths[b] may hold anything (stale or uninitialised, even NaN), and
        # 0 * NaN = NaN in the p @ v product, so masked rows of V are zeroed as well.
        v = v_ref[pl.ds(start, bk), :]
        v_pos = start + lax.broadcasted_iota(jnp.int32, (bk, 1), 0)
        v = jnp.where((v_pos >= nominal) & (v_pos < length), v, jnp.zeros_like(v))
        return _online_update(*carry, s, v, geo)

    carry = lax.fori_loop(lo, jnp.minimum(hi, n_full), full_block, carry)
    # The partial block (if any) is block n_full; it belongs to the split whose range holds it.
    owns_tail = (n_full < hi) & (n_full >= lo)
    carry = lax.cond(owns_tail, tail_block, lambda c: c, carry)

    # Tree phase: static chunks of the gathered tree K/V, skipped past the tile's last node.
    def tree_phase(carry):
        last = _last_node(q_block, geo)
        bt = geo.block_t
        for t in range(geo.n_chunks):

            def chunk(carry, t=t):
                s = _scores(q, kt_ref[t * bt : (t + 1) * bt, :], geo)
                s = jnp.where(_tree_visible(bits_ref, t, rows, geo), s, MASK_VALUE)
                return _online_update(*carry, s, vt_ref[t * bt : (t + 1) * bt, :], geo)

            if t == 0:
                carry = chunk(carry)
            else:
                carry = lax.cond(t * bt <= last, chunk, lambda c: c, carry)
        return carry

    if geo.num_splits > 1:
        carry = lax.cond(pl.program_id(3) == 0, tree_phase, lambda c: c, carry)
    else:
        carry = tree_phase(carry)

    m, l, acc = carry
    if geo.num_splits > 1:
        o_ref, m_ref, l_ref = out_refs
        o_ref[...] = acc
        m_ref[...] = m
        l_ref[...] = l
    else:
        (o_ref,) = out_refs
        o_ref[...] = (acc / l).astype(o_ref.dtype)


def triton_tree_attention(
    q_t,
    k,
    v,
    kt,
    vt,
    bits,
    lengths,
    geo: Geometry,
    *,
    interpret: bool,
    num_warps: int,
    num_stages: int,
):
    """Run the Triton-shaped kernel.

    Args:
      q_t: [B, K, R_pad, D] query tiles (node-major rows).
      k, v: [B, S, K, D] caches (read in place).
      kt, vt: [B, N_pad, K, D] tree keys/values (zero-padded).
      bits: [B, R_pad, W] int32 packed ancestor mask per row.
      lengths: [B] int32.

    Returns:
      [B, K, R_pad, D] in q's dtype when P == 1, else the partials
      (o [B, K, P, R_pad, D] f32, m [B, K, P, R_pad, 1] f32, l [B, K, P, R_pad, 1] f32).
    """
    b_, kh, r_pad, d = q_t.shape
    s_len, n_pad, bq, p = k.shape[1], kt.shape[1], geo.block_q, geo.num_splits
    grid = (b_, kh, geo.n_q_blocks) + ((p,) if p > 1 else ())
    in_specs = [
        pl.BlockSpec((b_,), lambda *_: (0,)),
        pl.BlockSpec((None, None, bq, d), lambda b, h, i, *_: (b, h, i, 0)),
        pl.BlockSpec((None, s_len, None, d), lambda b, h, *_: (b, 0, h, 0)),
        pl.BlockSpec((None, s_len, None, d), lambda b, h, *_: (b, 0, h, 0)),
        pl.BlockSpec((None, n_pad, None, d), lambda b, h, *_: (b, 0, h, 0)),
        pl.BlockSpec((None, n_pad, None, d), lambda b, h, *_: (b, 0, h, 0)),
        pl.BlockSpec((None, bq, geo.n_words), lambda b, h, i, *_: (b, i, 0)),
    ]
    if p == 1:
        out_shape = jax.ShapeDtypeStruct((b_, kh, r_pad, d), q_t.dtype)
        out_specs = pl.BlockSpec((None, None, bq, d), lambda b, h, i: (b, h, i, 0))
    else:
        out_shape = (
            jax.ShapeDtypeStruct((b_, kh, p, r_pad, d), jnp.float32),
            jax.ShapeDtypeStruct((b_, kh, p, r_pad, 1), jnp.float32),
            jax.ShapeDtypeStruct((b_, kh, p, r_pad, 1), jnp.float32),
        )
        out_specs = (
            pl.BlockSpec((None, None, None, bq, d), lambda b, h, i, s: (b, h, s, i, 0)),
            pl.BlockSpec((None, None, None, bq, 1), lambda b, h, i, s: (b, h, s, i, 0)),
            pl.BlockSpec((None, None, None, bq, 1), lambda b, h, i, s: (b, h, s, i, 0)),
        )
    return pl.pallas_call(
        functools.partial(_triton_kernel, geo=geo),
        out_shape=out_shape,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="tree_attention_triton",
    )(lengths, q_t, k, v, kt, vt, bits)


def combine_splits(o, m, l):
    """Merge flash-decoding partials over the split axis.

    Args:
      o: [B, K, P, R, D] f32 unnormalised outputs; m, l: [B, K, P, R, 1] f32 max / normaliser.

    Returns:
      [B, K, R, D] float32.
    """
    m_all = jnp.max(m, axis=2, keepdims=True)
    w = jnp.exp(m - m_all)  # splits that saw nothing carry m = MASK_VALUE -> weight 0
    l_all = jnp.sum(w * l, axis=2)
    # Only padded rows can end with l_all == 0; keep them finite (they are dropped).
    l_all = jnp.where(l_all == 0.0, 1.0, l_all)
    return jnp.sum(w * o, axis=2) / l_all


# ---------------------------------------------------------------------------------------------
# Mosaic (TPU) variant: the kv-block loop is a grid axis, blocks are DMA'd by the pipeline.
# ---------------------------------------------------------------------------------------------


def _mosaic_kernel(
    lengths_ref,
    q_ref,
    k_ref,
    v_ref,
    kt_ref,
    vt_ref,
    bits_ref,
    o_ref,
    m_scr,
    l_scr,
    acc_scr,
    *,
    geo,
):
    """One grid step = (b, kv head, query tile, kv block j); j is the sequential axis.

    Refs: lengths [B] (SMEM, scalar prefetch); q [bq, D]; k, v [bk, D] (block j, its index clamped
    to the row's last needed block so skipped steps trigger no DMA); kt, vt [N_pad, D];
    bits [bq, W]; o [bq, D]. Scratch: m, l [bq, 128] f32 (lane-replicated), acc [bq, D] f32.
    """
    b, q_block, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    bk = geo.block_k
    length = lengths_ref[b]

    @pl.when(j == 0)
    def _init():
        m_scr[...] = jnp.full(m_scr.shape, MASK_VALUE, jnp.float32)
        l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    def step(s, v):
        m, l, acc = _online_update(m_scr[:, :1], l_scr[:, :1], acc_scr[...], s, v, geo)
        m_scr[...] = jnp.broadcast_to(m, m_scr.shape)
        l_scr[...] = jnp.broadcast_to(l, l_scr.shape)
        acc_scr[...] = acc

    n_full = lax.div(length, bk)
    n_blocks = lax.div(length + (bk - 1), bk)

    @pl.when(j < n_full)
    def _full_block():  # entirely inside [0, lengths[b]): no mask
        step(_scores(q_ref[...], k_ref[...], geo), v_ref[...])

    @pl.when((j >= n_full) & (j < n_blocks))
    def _tail_block():
        # The partial last block: mask keys >= lengths[b]. Rows past S of an edge block hold
        # undefined data (possibly NaN), so V is zeroed there too, not only the scores.
        s = _scores(q_ref[...], k_ref[...], geo)
        pos = j * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        s = jnp.where(pos < length, s, MASK_VALUE)
        v = v_ref[...]
        v_pos = j * bk + lax.broadcasted_iota(jnp.int32, v.shape, 0)
        step(s, jnp.where(v_pos < length, v, jnp.zeros_like(v)))

    @pl.when(j == pl.num_programs(3) - 1)
    def _tree_and_finish():
        q = q_ref[...]
        rows, bt = q.shape[0], geo.block_t
        last = _last_node(q_block, geo)
        for t in range(geo.n_chunks):

            def chunk(t=t):
                s = _scores(q, kt_ref[t * bt : (t + 1) * bt, :], geo)
                s = jnp.where(_tree_visible(bits_ref, t, rows, geo), s, MASK_VALUE)
                step(s, vt_ref[t * bt : (t + 1) * bt, :])

            if t == 0:
                chunk()
            else:
                pl.when(t * bt <= last)(chunk)
        o_ref[...] = (acc_scr[...] / l_scr[:, :1]).astype(o_ref.dtype)


def mosaic_tree_attention(
    q_t, k, v, kt, vt, bits, lengths, geo: Geometry, *, heads_major: bool, interpret: bool
):
    """Run the Mosaic (TPU) kernel.

    Args:
      q_t: [B, K, R_pad, D] query tiles.
      k, v: [B, S, K * D] (free reshape of the cache; needs D % 128 == 0 so a head's columns form
        a lane-aligned block) or, with heads_major, [B, K, S, D] (a transposed copy, the fallback
        for other D).
      kt, vt: [B, N_pad, K * D] or, with heads_major, [B, K, N_pad, D].
      bits: [B, R_pad, W] int32.
      lengths: [B] int32 (scalar-prefetched into SMEM, also drives the index maps).
      interpret: run in TPU interpret mode (``pltpu.InterpretParams``) on CPU.

    Returns:
      [B, K, R_pad, D] in q's dtype.
    """
    b_, kh, r_pad, d = q_t.shape
    bq, bk = geo.block_q, geo.block_k
    n_kv = -(-geo.seq_len // bk)
    n_pad = kt.shape[2] if heads_major else kt.shape[1]

    def kv_block(b, j, lengths_ref):
        # Clamp to the last block holding committed keys: when the block index does not change
        # between consecutive steps the pipeline skips the copy, so blocks past lengths[b] cost
        # neither bandwidth nor (thanks to pl.when) compute.
        last = jnp.maximum(lax.div(lengths_ref[b] + (bk - 1), bk) - 1, 0)
        return jnp.minimum(j, last)

    if heads_major:
        kv_spec = pl.BlockSpec(
            (None, None, bk, d), lambda b, h, i, j, lens: (b, h, kv_block(b, j, lens), 0)
        )
        tree_spec = pl.BlockSpec((None, None, n_pad, d), lambda b, h, i, j, lens: (b, h, 0, 0))
    else:
        kv_spec = pl.BlockSpec((None, bk, d), lambda b, h, i, j, lens: (b, kv_block(b, j, lens), h))
        tree_spec = pl.BlockSpec((None, n_pad, d), lambda b, h, i, j, lens: (b, 0, h))
    q_spec = pl.BlockSpec((None, None, bq, d), lambda b, h, i, j, lens: (b, h, i, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(b_, kh, geo.n_q_blocks, n_kv),
        in_specs=[
            q_spec,
            kv_spec,
            kv_spec,
            tree_spec,
            tree_spec,
            pl.BlockSpec((None, bq, geo.n_words), lambda b, h, i, j, lens: (b, i, 0)),
        ],
        out_specs=q_spec,
        scratch_shapes=[
            pltpu.VMEM((bq, _TPU_LANES), jnp.float32),
            pltpu.VMEM((bq, _TPU_LANES), jnp.float32),
            pltpu.VMEM((bq, d), jnp.float32),
        ],
    )
    return pl.pallas_call(
        functools.partial(_mosaic_kernel, geo=geo),
        out_shape=jax.ShapeDtypeStruct((b_, kh, r_pad, d), q_t.dtype),
        grid_spec=grid_spec,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="tree_attention_mosaic",
    )(lengths, q_t, k, v, kt, vt, bits)
