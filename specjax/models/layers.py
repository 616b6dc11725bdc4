"""Llama-family building blocks as pure functions over parameter arrays.

Axis letters: B batch, T query tokens in this call, S cache length, H query heads, K kv heads,
D head dim, M model dim, F ffn dim, V vocab, L layers.

The decoder stack keeps each weight stacked over layers ([L, ...]) so the forward pass is one
`lax.scan` (compile time independent of depth); these functions act on one layer's slice.

Weight matrices come in one of two layouts. Canonical: [in, out], the product is x @ w. out_in:
[out, in], the product is written with the weight on the left (`dense`). Why both: on XLA:CPU a
product of a few rows (a verification block of N tree nodes) by a weight on the right runs a
matrix-matrix routine that costs ~2x a one-row product already at N = 4, while the same product
with the weight leading (its out rows as the long side) stays within ~1.5x up to N = 8
(SmolLM2 on a 2-core AMD EPYC: NOTES.md, "Fifteenth session"); written as a multiply-and-sum
instead of a dot it grows less again (`weight_leading_product`). The target uses out_in on the
CPU backend (specjax.models.target.Layers), and a feature drafter bound to it follows
(FeatureDrafter.set_layout); every checkpoint keeps the canonical layout.

In the out_in layout the target also keeps each layer's matrices as separate buffers
(`PerLayer`): XLA:CPU's products cannot read a slice of a buffer, so a layer scan over stacked
matrices copied every layer's weights out of the stack on every forward: SmolLM2's layers at
N = 1 took 55-77 ms stacked and 38-41 ms per layer on a 2-core AMD EPYC
(experiments/results/layer_buffers_before.md, layer_buffers.md).

Where the CPU panel kernel builds (specjax.kernels.cpu_panels), the target's out_in matrices are
packed in panels instead and `dense` runs that kernel: a block of 2-8 rows then costs about what
one row does, where XLA's products cost ~1.3-2x (NOTES.md, "Thirty-eighth session").
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from specjax.attention import AttentionImpl, attend
from specjax.config import ModelConfig
from specjax.kernels import cpu_panels
from specjax.models import precision


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm computed in float32 (as Hugging Face and llama.cpp do), cast back to x.dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * scale.astype(jnp.float32)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class PerLayer:
    """One weight matrix per layer, each its own buffer, and the layer a scan step is at.

    `dense` runs the product inside `lax.switch(layer, ...)`, one branch per layer, so each
    branch reads its layer's buffer in place; indexing a stacked [L, ...] array instead makes
    XLA:CPU copy the layer's slice before the product reads it."""

    weights: tuple  # L arrays, each [I, O] or [O, I] (the layout `dense` is told), or panels
    layer: jax.Array  # int32 scalar, traced
    # Set when the weights are packed in panels [P, I, 32] (specjax.kernels.cpu_panels): the
    # product's output size O. The kernel takes the layer index as an operand, so no switch.
    out: int | None = None


# Row counts (tokens in a call) at which a float32 weight-leading product is written as a
# broadcast multiply and a sum over the input axis instead of a dot: see weight_leading_product.
FEW_ROWS = range(2, 33)
# Above PAD_ABOVE rows a sum runs over the rows padded to a multiple of ROW_PAD: on a 2-core AMD
# EPYC (AVX-512) SmolLM2's forward over 5-7 rows cost more than over 8, over 12 more than over
# 16, over 28 or 31 ~1.3x more than over 32 (NOTES.md, "Twenty-fifth session"); up to 4 rows
# padding costs more than it saves.
ROW_PAD = 8
PAD_ABOVE = 4
_few_row_sums = True
_pad_rows = True


def set_few_row_sums(enabled: bool) -> bool:
    """Functions traced from now on write few-row products as sums (True, the default) or as
    dots (False); returns the setting before. Read at trace time: call jax.clear_caches() after
    switching, or a function compiled with the other setting is reused
    (experiments/weight_layout.py compares the two)."""
    global _few_row_sums
    before, _few_row_sums = _few_row_sums, bool(enabled)
    return before


def set_row_padding(enabled: bool) -> bool:
    """Functions traced from now on pad a sum's rows to a multiple of ROW_PAD above PAD_ABOVE
    rows (True, the default) or not; returns the setting before. Read at trace time, as
    set_few_row_sums."""
    global _pad_rows
    before, _pad_rows = _pad_rows, bool(enabled)
    return before


def summed_rows(rows: int) -> int:
    """How many rows a few-row sum of `rows` rows runs over (padding included)."""
    if not _pad_rows or rows <= PAD_ABOVE:
        return rows
    return -(-rows // ROW_PAD) * ROW_PAD


def weight_leading_product(w: jax.Array, x: jax.Array) -> jax.Array:
    """w [O, I] times x [..., I] -> [O, ...], the product of the out_in layout.

    For 2-32 rows of float32 it is a broadcast multiply summed over I, not a dot: XLA:CPU runs
    a dot of a few rows as a matrix-matrix routine that costs 2-3.4x the one-row product of the
    same weight, the sum ~1.3-1.9x (it reads each weight row once for all the rows). SmolLM2's
    verification over N = 2 / 4 / 8 nodes fell from 1.46 / 1.47 / 1.75x a one-token forward to
    1.21 / 1.22 / 1.41x on a 2-core AMD EPYC with AVX-512 (experiments/results/weight_layout.md).
    Above PAD_ABOVE rows the sum runs over zero rows up to a multiple of ROW_PAD (summed_rows),
    which costs less than the odd counts themselves. One row stays a dot (the matrix-vector
    routine is the fastest there: the sum is ~20x slower); so do other dtypes (a bfloat16 sum
    would also accumulate in bfloat16)."""
    rows = math.prod(x.shape[:-1])
    if _few_row_sums and rows in FEW_ROWS and w.dtype == x.dtype == jnp.float32:
        flat = x.reshape(rows, x.shape[-1])
        padded = summed_rows(rows)
        if padded > rows:
            flat = jnp.pad(flat, ((0, padded - rows), (0, 0)))
        out = jnp.sum(w[:, None, :] * flat[None], axis=-1)[:, :rows]
        return out.reshape(w.shape[0], *x.shape[:-1])
    return jnp.einsum("oi,...i->o...", w, x)


def dense(x: jax.Array, w, out_in: bool = False) -> jax.Array:
    """x [..., I] times the weight matrix w: [I, O] (canonical) or [O, I] (out_in) -> [..., O].

    w may be a `PerLayer` (the target's decoder stack): the product of the scan step's layer,
    with few rows as sums (weight_leading_product)."""
    if isinstance(w, PerLayer) and w.out is not None:
        return cpu_panels.panel_product(x, w.layer, w.weights, w.out)
    if isinstance(w, PerLayer):
        # Only the product is in the branches (the transpose of an out_in product follows
        # the switch): every branch is compiled on its own, so less in them compiles faster.
        branches = [lambda x, wk=wk: weight_leading_product(wk, x) if out_in else x @ wk
                    for wk in w.weights]  # fmt: skip
        out = jax.lax.switch(w.layer, branches, x)
        return jnp.moveaxis(out, 0, -1) if out_in else out
    if not out_in:
        return precision.matmul(x, w)  # bfloat16 products inside precision.products_in
    # A plain array (a feature drafter's matrices) keeps the dot at every row count: written as
    # sums there, the eagle drafter's products made a speculative step slower (SmolLM2, tree
    # (7,3,4): 54 against 64 tokens/s), where the target's per-layer products inside the
    # switch gain (72 tokens/s with the drafter's dots): NOTES.md, "Twenty-fourth session".
    return jnp.moveaxis(jnp.einsum("oi,...i->o...", w, x), 0, -1)


def rope_angles(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin of shape [B, T, D/2] for integer positions [B, T]."""
    inv_freq = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, layout: str) -> jax.Array:
    """Rotate x [B, T, H, D] by the angles.

    layout "interleaved" rotates pairs (2i, 2i+1); "half" rotates pairs (i, i + D/2).
    """
    x32 = x.astype(jnp.float32)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    if layout == "interleaved":
        x1, x2 = x32[..., 0::2], x32[..., 1::2]
        out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)
    else:
        half = x.shape[-1] // 2
        x1, x2 = x32[..., :half], x32[..., half:]
        out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.astype(x.dtype)


def write_block(cache_layer: jax.Array, block: jax.Array, lengths: jax.Array) -> jax.Array:
    """Write block [B, T, K, D] into cache_layer [B, S, K, D] at rows' offsets lengths [B].

    Callers guarantee lengths + T <= S (dynamic_update_slice would otherwise clamp the start).
    """

    def one_row(c, blk, start):
        return jax.lax.dynamic_update_slice(c, blk.astype(c.dtype), (start, 0, 0))

    return jax.vmap(one_row)(cache_layer, block, lengths)


def project_qkv(p: dict, x: jax.Array, cos, sin, cfg: ModelConfig, out_in: bool = False):
    """Queries, keys and values of the block x [B, T, M] (RoPE applied): q [B, T, H, D],
    k and v [B, T, K, D]. out_in: the weight matrices are [out, in] (see `dense`)."""
    b, t, _ = x.shape
    h, kh, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q = dense(x, p["wq"], out_in)
    k = dense(x, p["wk"], out_in)
    v = dense(x, p["wv"], out_in)
    if cfg.qkv_bias:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    q = apply_rope(q.reshape(b, t, h, d), cos, sin, cfg.rope_layout)
    k = apply_rope(k.reshape(b, t, kh, d), cos, sin, cfg.rope_layout)
    return q, k, v.reshape(b, t, kh, d)


def swiglu(p: dict, x: jax.Array, out_in: bool = False) -> jax.Array:
    """SwiGLU feed-forward: down(silu(gate x) * up x)."""
    gated = jax.nn.silu(dense(x, p["w_gate"], out_in)) * dense(x, p["w_up"], out_in)
    return dense(gated, p["w_down"], out_in)


def finish_layer(
    p: dict, x: jax.Array, attn: jax.Array, cfg: ModelConfig, out_in: bool = False
) -> jax.Array:
    """The rest of a pre-norm layer once attention is done: residual + output projection of the
    heads attn [B, T, H, D], then residual + SwiGLU. x [B, T, M] -> [B, T, M]."""
    b, t = x.shape[:2]
    x = x + dense(attn.reshape(b, t, -1), p["wo"], out_in)
    return x + swiglu(p, rms_norm(x, p["mlp_norm"], cfg.norm_eps), out_in)


def decoder_layer(
    p: dict,
    x: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
    tree_mask: jax.Array,
    cfg: ModelConfig,
    impl: AttentionImpl,
    out_in: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One pre-norm decoder layer over the block x [B, T, M]: writes the block's K/V at
    [lengths, lengths + T) of this layer's cache, then attends over the cache plus the block.
    Returns (x [B, T, M], k_cache, v_cache). out_in: the weight matrices are [out, in]."""
    q, k, v = project_qkv(p, rms_norm(x, p["attn_norm"], cfg.norm_eps), cos, sin, cfg, out_in)
    k_cache = write_block(k_cache, k, lengths)
    v_cache = write_block(v_cache, v, lengths)
    attn = attend(q, k_cache, v_cache, lengths, tree_mask, impl)
    return finish_layer(p, x, attn, cfg, out_in), k_cache, v_cache
