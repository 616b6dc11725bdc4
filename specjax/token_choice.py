"""The token a row picks: its argmax (greedy) or a draw from its distribution (sampling).

On the CPU backend, where the CPU kernels build (specjax.kernels.cpu_panels), both run as the
row_choice kernel: XLA:CPU's jnp.argmax reduces (value, index) pairs one element at a time (~1.2
ms over the [8, 49152] logits of an 8-node SmolLM2 verification, against ~0.26 ms), and
jax.random.categorical draws a Gumbel variate per vocabulary entry (~1.9 ms a row, against ~0.1
ms): experiments/results/row_choice_time.md. Elsewhere,
and under a mesh (XLA's partitioner cannot split a custom call), jnp.argmax and
jax.random.categorical.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.sharding import active_mesh


def _kernel_runs() -> bool:
    if jax.default_backend() != "cpu" or active_mesh() is not None:
        return False
    from specjax.kernels import cpu_panels

    return cpu_panels.available()


def argmax(x: jax.Array) -> jax.Array:
    """x [..., V] -> int32 [...]: jnp.argmax(x, axis=-1) (the first index of the maximum; a NaN
    counts as the maximum)."""
    if _kernel_runs() and x.dtype == jnp.float32:
        from specjax.kernels.cpu_panels.row_choice import row_argmax

        return row_argmax(x)
    return jnp.argmax(x, axis=-1).astype(jnp.int32)


def draw(key: jax.Array, probs: jax.Array) -> jax.Array:
    """One token per distribution: probs [..., V] (non-negative; normalised or not) -> int32
    [...], all from the single `key`. Entries of 0 are never drawn. The CPU kernel draws by the
    inverse CDF from 53 random bits a row, summing in double precision; elsewhere the Gumbel-max
    trick (jax.random.categorical on log probs)."""
    if _kernel_runs():
        from specjax.kernels.cpu_panels.row_choice import row_draw

        bits = jax.random.bits(key, (*probs.shape[:-1], 2), jnp.uint32)
        return row_draw(probs, bits)
    return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)
