"""Attention of a small query block over one layer of the KV cache, read in place (the C++
kernel in cache_attention.cc, built with the panel kernel: see this package's docstring).

Why: XLA's attention over a static cache computes all S positions and copies the layer's slice
out of the [L, B, S, K, D] cache, so a CPU decoding step costs more the larger the cache is made
(the call's prompt width plus max_new_tokens), whatever the context; the kernel touches only
the positions each query sees. Same contract as specjax.attention.reference_attention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from specjax.kernels.cpu_panels import ATTENTION_TARGET

from specjax.attention_reference import reference_attention


def cache_attention(q, k_all, v_all, layer, lengths, tree_mask):
    """q [B, N, H, D] over layer `layer` of k_all / v_all [L, B, S, K, D] (float32), lengths [B],
    tree_mask [B, N, M] -> [B, N, H, D] in q's dtype: query i of row b sees positions
    j < lengths[b] and lengths[b] + m where tree_mask[b, i, m] (M = N for a block's own tokens;
    M may differ when the block's keys were written before, as a drafter's tree levels do).
    Differentiable in q, k_all and v_all (through the plain-jnp attention)."""
    out = _attention(
        q.astype(jnp.float32), k_all, v_all, jnp.asarray(layer, jnp.int32).reshape(()),
        lengths.astype(jnp.int32), tree_mask.astype(bool),
    )  # fmt: skip
    return out.astype(q.dtype)


@jax.custom_vjp
def _attention(q, k_all, v_all, layer, lengths, tree_mask):
    call = jax.ffi.ffi_call(
        ATTENTION_TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential"
    )
    return call(q, k_all, v_all, layer, lengths, tree_mask)


def _attention_fwd(q, k_all, v_all, layer, lengths, tree_mask):
    return _attention(q, k_all, v_all, layer, lengths, tree_mask), (
        q, k_all, v_all, layer, lengths, tree_mask,
    )  # fmt: skip


def _attention_bwd(residuals, g):
    q, k_all, v_all, layer, lengths, tree_mask = residuals
    k_layer = jax.lax.dynamic_index_in_dim(k_all, layer, 0, keepdims=False)
    v_layer = jax.lax.dynamic_index_in_dim(v_all, layer, 0, keepdims=False)
    _, vjp = jax.vjp(
        lambda q, k, v: reference_attention(q, k, v, lengths, tree_mask), q, k_layer, v_layer
    )
    gq, gk, gv = vjp(g)

    def into_layer(all_layers, grad):
        return jax.lax.dynamic_update_index_in_dim(jnp.zeros_like(all_layers), grad, layer, 0)

    return gq, into_layer(k_all, gk), into_layer(v_all, gv), None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)
