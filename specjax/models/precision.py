"""Products in bfloat16 with float32 accumulation, for training on CPUs that multiply bfloat16
fast.

A CPU with AMX (Intel Sapphire Rapids and later) runs XLA's bfloat16 products ~4-5x faster
than float32 ones ([4096, 576] x [576, 1536]: ~1.2 TFLOP/s against ~0.26 on 2 cores,
NOTES.md "Forty-first session"), while XLA:CPU ignores jax.default_matmul_precision: a float32
product stays float32. `products_in(jnp.bfloat16)` makes the products `dense` and the drafter
readout compute on plain (unpacked) weights take bfloat16 operands, accumulate in float32 and
return float32, forward and backward (`low_precision_matmul`). Decoding never uses it: the
target's products define the output distribution and stay float32.

The setting is read at trace time, like specjax.models.layers.set_few_row_sums: a function
traced inside the context keeps it.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp

_product_dtype: list = [None]  # None: products in their operands' dtype


@contextlib.contextmanager
def products_in(dtype):
    """Inside the context (at trace time), plain-weight products run with `dtype` operands
    (jnp.bfloat16) and float32 accumulation; dtype None or float32: as written."""
    dtype = None if dtype is None or jnp.dtype(dtype) == jnp.float32 else jnp.dtype(dtype)
    before, _product_dtype[0] = _product_dtype[0], dtype
    try:
        yield
    finally:
        _product_dtype[0] = before


def has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this host's CPU has AMX bfloat16 tiles (Linux cpuinfo; False elsewhere)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_bf16" in line.split(":", 1)[1].split()
    except OSError:
        pass
    return False


def training_products(choice: str = "auto") -> str:
    """The products a drafter trains with (TrainConfig.products): "auto" picks "bfloat16" on a
    CPU backend with AMX and "float32" elsewhere; "float32" / "bfloat16" are returned as given.
    Why: on a 2-core Xeon with AMX a SmolLM2 eagle step took 0.54x the float32 step's time, and
    800 steps of each reached greedy tau 1.707 and 1.723 on 40 MT-bench first turns (paired
    difference 0.016 +- 0.012, ~1%), where doubling a run's steps has gained ~0.1-0.15
    (NOTES.md, "Forty-first session"): at equal time bfloat16 trains further."""
    if choice != "auto":
        return choice
    return "bfloat16" if jax.default_backend() == "cpu" and has_amx() else "float32"


def product_dtype():
    """The operand dtype products_in set, or None."""
    return _product_dtype[0]


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., I] @ w [I, O]: in products_in's dtype where one is set, else as written."""
    dtype = _product_dtype[0]
    if dtype is None:
        return x @ w
    return low_precision_matmul(x, w, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def low_precision_matmul(x: jax.Array, w: jax.Array, dtype) -> jax.Array:
    """x [..., I] @ w [I, O] with dtype operands and float32 accumulation -> [..., O] float32.
    Its gradients are products of the same kind (the cotangent cast to dtype), so a training
    step's backward pass runs at the same speed as its forward."""
    return jnp.matmul(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


def _forward(x, w, dtype):
    low_x, low_w = x.astype(dtype), w.astype(dtype)
    out = jnp.matmul(low_x, low_w, preferred_element_type=jnp.float32)
    # Empty arrays carry the operands' dtypes (residuals must be arrays).
    return out, (low_x, low_w, jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype))


def _backward(dtype, residuals, g):
    low_x, low_w, x_like, w_like = residuals
    low_g = g.astype(dtype)
    dx = jnp.matmul(low_g, low_w.T, preferred_element_type=jnp.float32)
    dw = jnp.einsum("...i,...o->io", low_x, low_g, preferred_element_type=jnp.float32)
    return dx.astype(x_like.dtype), dw.astype(w_like.dtype)


low_precision_matmul.defvjp(_forward, _backward)
