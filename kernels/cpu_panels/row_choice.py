"""A row's argmax and a draw from a row's distribution (the C++ kernels in row_choice.cc, built
with the panel kernel: see this package's docstring). Callers go through
specjax.token_choice, which falls back to jnp where the kernels do not run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from specjax.kernels.cpu_panels import ARGMAX_TARGET, DRAW_TARGET


def row_argmax(x: jax.Array) -> jax.Array:
    """x [..., V] float32 -> int32 [...]: the first index of each row's maximum, a NaN counting
    as the largest value (jnp.argmax(x, -1))."""
    call = jax.ffi.ffi_call(
        ARGMAX_TARGET, jax.ShapeDtypeStruct(x.shape[:-1], jnp.int32), vmap_method="broadcast_all"
    )
    return call(x.astype(jnp.float32))


def row_draw(probs: jax.Array, bits: jax.Array) -> jax.Array:
    """probs [..., V] (non-negative, any total), bits [..., 2] uint32 -> int32 [...]: the first
    index whose running sum (double precision) exceeds u * total, u = the 53-bit uniform in
    [0, 1) the row's bits make. Entries of 0 are never drawn; a row with nothing positive
    gives 0."""
    call = jax.ffi.ffi_call(
        DRAW_TARGET, jax.ShapeDtypeStruct(probs.shape[:-1], jnp.int32), vmap_method="broadcast_all"
    )
    return call(probs.astype(jnp.float32), bits.astype(jnp.uint32))
