"""Greedy verification (temperature 0).

Axis letters: B batch, N tree nodes, V vocab, P = max_depth + 1 path slots.

A child c of node u is accepted iff it is valid, u is accepted (the root always is) and
token(c) == argmax p_u. The accepted path ends at the deepest accepted node; equally deep
candidates are broken toward the lowest node index. The extra token is argmax p at that node, so
the emitted tokens are exactly what target-only greedy decoding would produce.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax import token_choice
from specjax.tree import Acceptance, DraftTree, extract_path


def accepted_nodes(tree: DraftTree, target_tokens: jax.Array, max_depth: int) -> jax.Array:
    """[B, N] bool: node reachable from the root through children whose token equals the target
    token of their parent. target_tokens [B, N] int: the target's choice at every node."""
    parent = jnp.maximum(tree.parents, 0)
    match = tree.valid & (tree.tokens == jnp.take_along_axis(target_tokens, parent, axis=1))
    is_root = jnp.arange(tree.num_nodes)[None, :] == 0
    acc = is_root | jnp.zeros_like(match)
    # One pass per depth level propagates acceptance from the root down to depth max_depth.
    for _ in range(max_depth):
        acc = is_root | (match & jnp.take_along_axis(acc, parent, axis=1))
    return acc


def verify_greedy(tree: DraftTree, p: jax.Array, key, max_depth: int) -> Acceptance:
    """Greedy acceptance. tree: N nodes; p [B, N, V] target logits or probabilities (only the
    argmax is used, so callers pass raw logits: no softmax); key unused (the common rule
    signature); max_depth static. Returns Acceptance(path [B, P], n_accepted [B],
    next_token [B])."""
    del key
    n = tree.num_nodes
    target_tokens = token_choice.argmax(p)
    acc = accepted_nodes(tree, target_tokens, max_depth)
    # Deepest accepted node, lowest index among equals: maximise depth * N - index.
    key = jnp.where(acc, tree.depth * n + (n - 1 - jnp.arange(n)[None, :]), -1)
    last = jnp.argmax(key, axis=1).astype(jnp.int32)
    n_acc = jnp.take_along_axis(tree.depth, last[:, None], axis=1)[:, 0].astype(jnp.int32)
    path = extract_path(tree.parents, last, max_depth)
    nxt = jnp.take_along_axis(target_tokens, last[:, None], axis=1)[:, 0]
    return Acceptance(path=path, n_accepted=n_acc, next_token=nxt)
