"""Public entry point: validation, backend selection, layout plumbing around the Pallas kernels.

Axis letters: B batch, N tree nodes, S cache length, H query heads, K kv heads, D head dim,
G = H // K, R = N * G query rows per kv head.

Backends:
  * GPU: the Triton-shaped kernel compiled through Pallas' Triton lowering.
  * TPU: the Mosaic kernel (scalar-prefetched lengths, kv blocks as a grid axis).
  * CPU: interpret mode. ``variant="triton"`` (the default off-TPU) runs the Triton-shaped kernel
    in the generic Pallas interpreter; ``variant="mosaic"`` runs the TPU kernel in TPU interpret
    mode (``pltpu.InterpretParams``), which simulates VMEM/DMA/scalar prefetch on CPU.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from specjax.kernels.tree_attention import pallas as tk

Variant = Literal["triton", "mosaic"]
VARIANTS = ("triton", "mosaic")

# Defaults. Triton: a [64, D] query tile with 64-key blocks keeps the f32 accumulator and the
# score tile in registers at 4 warps. Mosaic: 512-key blocks amortise the per-grid-step overhead.
TRITON_BLOCK_K = 64
TRITON_BLOCK_Q = 64
MOSAIC_BLOCK_K = 512
MOSAIC_BLOCK_Q = 256
# Triton dots need every tile dimension >= 16.
_TRITON_MIN = 16
_SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _prev_pow2(x: int) -> int:
    return 1 << (x.bit_length() - 1)


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


# ---------------------------------------------------------------------------------------------
# Validation (runs on shapes/dtypes only, before anything is traced).
# ---------------------------------------------------------------------------------------------


def _shape_dtype(name: str, x):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{name} must be an array, got {type(x).__name__}")
    return tuple(x.shape), np.dtype(x.dtype)


def validate_inputs(q, k, v, lengths, tree_mask) -> None:
    """Raise ValueError unless the arguments form a valid tree-attention call.

    q [B, N, H, D]; k, v [B, S, K, D] with k/v dtype == q dtype (float32, bfloat16 or float16);
    H % K == 0; lengths [B] int32; tree_mask [B, N, N] bool; 1 <= N <= S.
    """
    q_shape, q_dtype = _shape_dtype("q", q)
    k_shape, k_dtype = _shape_dtype("k", k)
    v_shape, v_dtype = _shape_dtype("v", v)
    l_shape, l_dtype = _shape_dtype("lengths", lengths)
    m_shape, m_dtype = _shape_dtype("tree_mask", tree_mask)
    if len(q_shape) != 4:
        raise ValueError(f"q must be [B, N, H, D], got shape {q_shape}")
    if len(k_shape) != 4:
        raise ValueError(f"k must be [B, S, K, D], got shape {k_shape}")
    if v_shape != k_shape:
        raise ValueError(f"v must have k's shape {k_shape}, got {v_shape}")
    b, n, h, d = q_shape
    if min(q_shape) < 1 or min(k_shape) < 1:
        raise ValueError(f"empty dimension in q {q_shape} or k {k_shape}")
    if k_shape[0] != b:
        raise ValueError(f"k batch {k_shape[0]} != q batch {b}")
    if k_shape[3] != d:
        raise ValueError(f"k head dim {k_shape[3]} != q head dim {d}")
    kh = k_shape[2]
    if h % kh != 0:
        raise ValueError(f"query heads H={h} must be a multiple of kv heads K={kh}")
    if n > k_shape[1]:
        raise ValueError(f"tree size N={n} exceeds cache length S={k_shape[1]}")
    if q_dtype not in [np.dtype(t) for t in _SUPPORTED_DTYPES]:
        raise ValueError(f"q dtype must be float32, bfloat16 or float16, got {q_dtype}")
    if k_dtype != q_dtype or v_dtype != q_dtype:
        raise ValueError(f"k/v dtypes ({k_dtype}, {v_dtype}) must equal q dtype {q_dtype}")
    if l_shape != (b,):
        raise ValueError(f"lengths must be [B]=({b},), got shape {l_shape}")
    if l_dtype != np.dtype(np.int32):
        raise ValueError(f"lengths must be int32, got {l_dtype}")
    if m_shape != (b, n, n):
        raise ValueError(f"tree_mask must be [B, N, N]=({b}, {n}, {n}), got shape {m_shape}")
    if m_dtype != np.dtype(np.bool_):
        raise ValueError(f"tree_mask must be bool, got {m_dtype}")


def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def compiled_supports(head_dim: int, backend: str | None = None) -> bool:
    """Whether the compiled kernel of `backend` (default: JAX's default backend) takes this head
    dim: the Triton (GPU) kernel needs a power of two >= 16 (tl.dot's minimum tile); the Mosaic
    (TPU) kernel has no head-dim limit (D % 128 != 0 takes its heads-major path)."""
    backend = jax.default_backend() if backend is None else backend
    if backend == "gpu":
        return _is_pow2(head_dim) and head_dim >= _TRITON_MIN
    return backend == "tpu"


def _resolve_config(q, k, variant, interpret, block_k, block_q, num_splits):
    """Fill in defaults and check the static options against the variant and backend."""
    backend = jax.default_backend()
    if variant is None:
        variant = "mosaic" if backend == "tpu" else "triton"
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS} or None, got {variant!r}")
    if interpret is None:
        interpret = backend == "cpu"
    if not isinstance(interpret, bool):
        raise ValueError(f"interpret must be a bool or None, got {interpret!r}")
    if not interpret:
        wanted = "tpu" if variant == "mosaic" else "gpu"
        if backend != wanted:
            raise ValueError(
                f"the compiled {variant} kernel needs a {wanted.upper()} backend, but JAX's "
                f"default backend is {backend!r}; pass interpret=True to run it interpreted"
            )

    b, n, h, d = q.shape
    if variant == "triton":
        block_k = _check_int("block_k", TRITON_BLOCK_K if block_k is None else block_k)
        block_q = _check_int("block_q", TRITON_BLOCK_Q if block_q is None else block_q)
        for name, val in (("block_k", block_k), ("block_q", block_q)):
            if not _is_pow2(val) or val < _TRITON_MIN:
                raise ValueError(f"triton {name} must be a power of two >= 16, got {val}")
        if not interpret and (not _is_pow2(d) or d < _TRITON_MIN):
            raise ValueError(f"the Triton kernel needs a power-of-two head dim >= 16, got D={d}")
        if num_splits is None:
            num_splits = 1 if interpret else _default_num_splits(q.shape, k.shape, block_q, block_k)
        num_splits = _check_int("num_splits", num_splits)
    else:
        sublanes = 16 if np.dtype(q.dtype).itemsize == 2 else 8
        block_k = _check_int("block_k", MOSAIC_BLOCK_K if block_k is None else block_k)
        block_q = _check_int("block_q", MOSAIC_BLOCK_Q if block_q is None else block_q)
        if block_k % 128:
            raise ValueError(f"mosaic block_k must be a multiple of 128, got {block_k}")
        if block_q % sublanes:
            raise ValueError(
                f"mosaic block_q must be a multiple of {sublanes} for {np.dtype(q.dtype)}, "
                f"got {block_q}"
            )
        if num_splits not in (None, 1):
            raise ValueError("num_splits is a Triton-variant option (the TPU grid is sequential)")
        num_splits = 1
    return variant, interpret, block_k, block_q, num_splits


def _default_num_splits(q_shape, k_shape, block_q: int, block_k: int) -> int:
    """Flash-decoding split count for the compiled GPU kernel.

    Decode-sized calls have only B * K * (query tiles) programs, far fewer than a GPU's cores, so
    the committed range is split to reach ~2 programs per core, keeping >= 4 kv blocks a split.
    """
    b, n, h, _ = q_shape
    s, kh = k_shape[1], k_shape[2]
    rows = n * (h // kh)
    n_q_blocks = _cdiv(rows, min(block_q, _next_pow2(max(rows, _TRITON_MIN))))
    try:
        cores = int(getattr(jax.devices()[0], "core_count", 0) or 0) or 132
    except RuntimeError:  # no device: any sensible number will do
        cores = 132
    wanted = _cdiv(2 * cores, b * kh * n_q_blocks)
    return max(1, min(wanted, _cdiv(s, 4 * block_k)))


# ---------------------------------------------------------------------------------------------
# The jitted entry.
# ---------------------------------------------------------------------------------------------


def tree_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    lengths: jax.Array,
    tree_mask: jax.Array,
    *,
    interpret: bool | None = None,
    variant: Variant | None = None,
    block_k: int | None = None,
    block_q: int | None = None,
    num_splits: int | None = None,
) -> jax.Array:
    """Tree attention over a KV cache with a Pallas flash-style kernel.

    Query i of row b sees key positions j < lengths[b] and j = lengths[b] + m iff
    tree_mask[b, i, m]; scores are scaled by 1/sqrt(D) and query head h reads kv head h // G.
    The same call serves prefill (lengths 0, causal tree_mask) and decode (N = 1).

    Args:
      q: [B, N, H, D] float32/bfloat16/float16.
      k, v: [B, S, K, D] caches, q's dtype, the tree block already written at
        [lengths[b], lengths[b] + N). Precondition (not checkable under jit): lengths[b] + N <= S.
      lengths: [B] int32 committed length per row.
      tree_mask: [B, N, N] bool, ancestors-or-self (diagonal true), so lower-triangular: node
        i's ancestors come before it (parents[i] < i, as every DraftTree orders them). The
        kernel relies on it: a query tile skips block chunks past its last node, so a mask
        letting node i see a later node would silently differ from the reference.
      interpret: run in interpret mode; None = interpret iff JAX's default backend is CPU.
      variant: "triton" (GPU kernel) or "mosaic" (TPU kernel); None = "mosaic" on TPU, else
        "triton". Interpreted, "mosaic" uses TPU interpret mode.
      block_k: keys per kv block (Triton: power of two >= 16, default 64; Mosaic: multiple of
        128, default 512).
      block_q: max rows of a query tile (Triton: power of two >= 16, default 64; Mosaic: multiple
        of 8 (16 for 16-bit dtypes), default 256).
      num_splits: Triton only: split the committed range over this many programs per tile
        (flash-decoding) and merge in XLA; default 1 interpreted, occupancy-based on GPU.

    Returns:
      [B, N, H, D] in q's dtype.

    Raises:
      ValueError: on inconsistent shapes/dtypes or options, before tracing.
    """
    validate_inputs(q, k, v, lengths, tree_mask)
    variant, interpret, block_k, block_q, num_splits = _resolve_config(
        q, k, variant, interpret, block_k, block_q, num_splits
    )
    return _tree_attention_jit(
        q,
        k,
        v,
        lengths,
        tree_mask,
        variant=variant,
        interpret=interpret,
        block_k=block_k,
        block_q=block_q,
        num_splits=num_splits,
    )


def geometry(
    q_shape, k_shape, dtype, *, variant: str, block_k: int, block_q: int, num_splits: int
) -> tk.Geometry:
    """Static tiling for one call (see ``pallas.Geometry``)."""
    b, n, h, d = q_shape
    s, kh = k_shape[1], k_shape[2]
    g = h // kh
    rows = n * g
    precision = lax.Precision.HIGHEST if np.dtype(dtype) == np.float32 else None
    if variant == "triton":
        s_eff = max(s, _TRITON_MIN)  # tiny caches are zero-padded to one 16-key block
        bk = min(block_k, _prev_pow2(s_eff))
        bq = min(block_q, _next_pow2(max(rows, _TRITON_MIN)))
        # Tree chunk: power of two >= 16, at most block_k keys, and at most 8 (unrolled) chunks.
        bt = min(_next_pow2(max(n, _TRITON_MIN)), max(block_k, _next_pow2(_cdiv(n, 8))))
        splits = min(num_splits, _cdiv(s_eff, bk))  # more splits than kv blocks would idle
    else:
        s_eff = s
        sublanes = 16 if np.dtype(dtype).itemsize == 2 else 8
        bk = block_k if s >= block_k else s  # a block equal to the full dim is always legal
        bq = min(block_q, _round_up(rows, sublanes))
        bt = 128 * max(1, _cdiv(_cdiv(n, 128), 8))  # lane-aligned, at most 8 chunks
        splits = 1
    return tk.Geometry(
        seq_len=s_eff,
        n_nodes=n,
        group=g,
        block_q=bq,
        rows_pad=_round_up(rows, bq),
        block_k=bk,
        block_t=bt,
        nodes_pad=_round_up(n, bt),
        num_splits=splits,
        scale=1.0 / math.sqrt(d),
        precision=precision,
    )


def pack_tree_mask(tree_mask: jax.Array, geo: tk.Geometry) -> jax.Array:
    """[B, N, N] bool -> [B, R_pad, W] int32: bit m % 32 of word m // 32 = node m visible.

    Row r of a kv head's query tile is node r // G (node-major), so each node's words are repeated
    G times; padded rows/nodes are all-zero (never visible).
    """
    b, n, _ = tree_mask.shape
    words = geo.n_words
    m = jnp.pad(tree_mask, ((0, 0), (0, 0), (0, words * 32 - n)))
    m = m.reshape(b, n, words, 32).astype(jnp.uint32)
    bits = jnp.sum(m << jnp.arange(32, dtype=jnp.uint32), axis=-1, dtype=jnp.uint32)
    bits = lax.bitcast_convert_type(bits, jnp.int32)  # distinct powers of two: sum == OR
    bits = jnp.repeat(bits, geo.group, axis=1)  # [B, R, W]
    return jnp.pad(bits, ((0, 0), (0, geo.rows_pad - n * geo.group), (0, 0)))


def gather_tree_kv(x: jax.Array, lengths: jax.Array, geo: tk.Geometry) -> jax.Array:
    """[B, S, K, D] cache -> [B, N_pad, K, D]: rows [lengths[b], lengths[b] + N), zero-padded.

    A B*N*K*D copy (small next to the B*S*K*D cache); it lets the kernels address the tree block
    with static offsets.
    """
    n = geo.n_nodes
    tree = jax.vmap(lambda xb, lb: lax.dynamic_slice_in_dim(xb, lb, n, axis=0))(x, lengths)
    return jnp.pad(tree, ((0, 0), (0, geo.nodes_pad - n), (0, 0), (0, 0)))


@functools.partial(
    jax.jit, static_argnames=("variant", "interpret", "block_k", "block_q", "num_splits")
)
def _tree_attention_jit(
    q, k, v, lengths, tree_mask, *, variant, interpret, block_k, block_q, num_splits
):
    b, n, h, d = q.shape
    s, kh = k.shape[1], k.shape[2]
    g = h // kh
    geo = geometry(
        q.shape,
        k.shape,
        q.dtype,
        variant=variant,
        block_k=block_k,
        block_q=block_q,
        num_splits=num_splits,
    )
    rows = n * g
    # [B, N, K, G, D] -> [B, K, N*G, D]: the G heads of a kv head become extra rows of its tile.
    q_t = q.reshape(b, n, kh, g, d).transpose(0, 2, 1, 3, 4).reshape(b, kh, rows, d)
    q_t = jnp.pad(q_t, ((0, 0), (0, 0), (0, geo.rows_pad - rows), (0, 0)))
    kt = gather_tree_kv(k, lengths, geo)
    vt = gather_tree_kv(v, lengths, geo)
    bits = pack_tree_mask(tree_mask, geo)

    if variant == "triton":
        if geo.seq_len > s:  # only for S < 16; padded keys sit past lengths[b] + N: invisible
            pad = ((0, 0), (0, geo.seq_len - s), (0, 0), (0, 0))
            k, v = jnp.pad(k, pad), jnp.pad(v, pad)
        out = tk.triton_tree_attention(
            q_t,
            k,
            v,
            kt,
            vt,
            bits,
            lengths,
            geo,
            interpret=interpret,
            num_warps=4 if geo.block_q * d <= 64 * 128 else 8,
            num_stages=2,
        )
        if geo.num_splits > 1:
            out = tk.combine_splits(*out).astype(q.dtype)
    else:
        # A kv head's D columns of the [B, S, K*D] view form a lane-aligned block iff D % 128 == 0
        # (or K == 1); otherwise fall back to a heads-major copy of the cache.
        heads_major = d % 128 != 0 and kh > 1
        if heads_major:
            k_, v_ = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
            kt_, vt_ = kt.transpose(0, 2, 1, 3), vt.transpose(0, 2, 1, 3)
        else:
            k_, v_ = k.reshape(b, s, kh * d), v.reshape(b, s, kh * d)
            kt_, vt_ = kt.reshape(b, -1, kh * d), vt.reshape(b, -1, kh * d)
        out = tk.mosaic_tree_attention(
            q_t,
            k_,
            v_,
            kt_,
            vt_,
            bits,
            lengths,
            geo,
            heads_major=heads_major,
            interpret=interpret,
        )

    out = out[:, :, :rows].reshape(b, kh, n, g, d).transpose(0, 2, 1, 3, 4)
    return out.reshape(b, n, h, d)
