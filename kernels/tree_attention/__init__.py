"""Tree attention: a flash-style Pallas kernel (Triton/GPU, Mosaic/TPU, interpret on CPU).

Axis letters: B batch, N tree nodes, S cache length, H query heads, K kv heads, D head dim.

    tree_attention(q [B,N,H,D], k [B,S,K,D], v [B,S,K,D], lengths [B] int32,
                   tree_mask [B,N,N] bool) -> [B,N,H,D]

``tree_attention_reference`` is the plain-jnp specification it is tested against.
"""

from specjax.kernels.tree_attention.ops import compiled_supports, tree_attention, validate_inputs
from specjax.kernels.tree_attention.reference import tree_attention_reference, visibility

__all__ = [
    "compiled_supports",
    "tree_attention",
    "tree_attention_reference",
    "validate_inputs",
    "visibility",
]
