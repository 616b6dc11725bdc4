"""Logits -> probabilities (the sampling transform) and small sampling helpers.

Axis letters: B batch, N tree nodes, V vocab.

The same transform must be applied to the target and to the drafter: speculative decoding is
lossless with respect to the *transformed* target distribution. Everything is computed in float32
so that the target's and the drafter's probabilities go through identical arithmetic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax import token_choice
from specjax.config import SamplingConfig


def apply_sampling(logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """Probabilities [..., V] (float32) from logits [..., V].

    Greedy (temperature 0) gives the one-hot of the argmax. Otherwise: divide by the temperature,
    keep the top_k logits (0: all; ties at the k-th value are all kept, so the result does not
    depend on an arbitrary tie order), then keep the smallest set of most probable tokens whose
    mass reaches top_p (again keeping ties at the threshold), and renormalise.
    """
    logits = logits.astype(jnp.float32)
    v = logits.shape[-1]
    if sampling.greedy:
        return jax.nn.one_hot(token_choice.argmax(logits), v, dtype=jnp.float32)
    x = logits / jnp.float32(sampling.temperature)
    if 0 < sampling.top_k < v:
        kth = jax.lax.top_k(x, sampling.top_k)[0][..., -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    if sampling.top_p < 1.0:
        probs = jax.nn.softmax(x, axis=-1)
        sorted_p = -jnp.sort(-probs, axis=-1)
        mass_before = jnp.cumsum(sorted_p, axis=-1) - sorted_p
        # A token is kept when the mass of the strictly more probable tokens is below top_p; the
        # most probable token is always kept.
        keep = mass_before < sampling.top_p
        threshold = jnp.min(jnp.where(keep, sorted_p, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(probs < threshold, -jnp.inf, x)
    return jax.nn.softmax(x, axis=-1)


def normalize(x: jax.Array, fallback: jax.Array | None = None) -> jax.Array:
    """x / sum(x) over the last axis for non-negative x [..., V].

    Where the sum is 0 the result is `fallback` (normalised; broadcastable to x), or uniform when
    no fallback is given, so callers never see NaN. Rules only reach a zero residual through
    rounding (in exact arithmetic they accept with probability 1 there), so any proper
    distribution is a sound fallback; the target distribution is the natural one.
    """
    total = jnp.sum(x, axis=-1, keepdims=True)
    if fallback is None:
        fallback = jnp.ones_like(x)
    fallback = jnp.broadcast_to(fallback, x.shape).astype(x.dtype)
    fb_total = jnp.sum(fallback, axis=-1, keepdims=True)
    fb = fallback / jnp.where(fb_total > 0, fb_total, 1)
    return jnp.where(total > 0, x / jnp.where(total > 0, total, 1), fb)


def residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """norm(max(p - q, 0)) over the last axis, falling back to p where p == q. Shapes [..., V]."""
    return normalize(jnp.maximum(p - q, 0.0), fallback=p)


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """One token per distribution: probs [..., V] -> int32 [...], all from the single `key`.

    Zero-probability tokens are never drawn (specjax.token_choice.draw).
    """
    return token_choice.draw(key, probs)


def sample_rows(keys: jax.Array, probs: jax.Array) -> jax.Array:
    """Row-wise sampling: keys [B] (one PRNG key per row), probs [B, V] -> int32 [B]."""
    return jax.vmap(sample)(keys, probs)


def row_keys(key: jax.Array, batch: int) -> jax.Array:
    """Per-row keys [B] from either one key (split into `batch`) or already per-row keys.

    Accepts new-style typed keys (shape () or [B]) and raw uint32 keys (shape [2] or [B, 2]).
    """
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    single = key.ndim == 0 if typed else key.ndim == 1
    return jax.random.split(key, batch) if single else key
