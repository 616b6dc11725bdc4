"""Static-budget draft trees.

Axis letters: B batch, N tree nodes (static budget), V vocab, P = max_depth + 1 path slots.

A tree is stored in topological order: node 0 is the root (the last committed token, not a
draft), and parents[b, i] < i for every other node. Shapes never change with the content: a row
that drafts fewer nodes marks the rest invalid. Invalid nodes are never accepted.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class DraftTree:
    """A batch of draft trees with a static node budget N.

    tokens:     [B, N] int32   token of each node; tokens[:, 0] = last committed token.
    parents:    [B, N] int32   parent index; parents[:, 0] = -1; parents[b, i] < i.
    depth:      [B, N] int32   0 for the root, depth(parent) + 1 otherwise.
    valid:      [B, N] bool    False for unused slots (and for nodes under an invalid parent).
    draft_prob: [B, N] float32 q_parent(token): drafter probability of the node's token given its
                               parent (1.0 for the root); after the sampling transform.
    draft_dist: [B, N, V] float32 or None  q_u: the drafter's distribution for the children of u
                               (after the sampling transform). Needed by rules whose children are
                               sampled from q (chain and tree-sampled, HSD); None for one-hot trees.
    """

    tokens: jax.Array
    parents: jax.Array
    depth: jax.Array
    valid: jax.Array
    draft_prob: jax.Array
    draft_dist: jax.Array | None = None

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


@flax.struct.dataclass
class Acceptance:
    """What an acceptance rule returns, per row.

    path:       [B, P] int32  accepted node indices from the root: path[:, 0] = 0, then the
                              accepted nodes in order; slots past n_accepted hold 0 (P = max depth + 1).
    n_accepted: [B] int32     number of accepted draft tokens (0..max depth); the root is not counted.
    next_token: [B] int32     the extra token: correction at the first rejection, or bonus token.
    """

    path: jax.Array
    n_accepted: jax.Array
    next_token: jax.Array


def chain_tree(root_tokens: jax.Array, draft_tokens: jax.Array, draft_prob: jax.Array,
               draft_dist: jax.Array | None = None) -> DraftTree:
    """A chain draft as a tree: node i + 1 is the child of node i.

    root_tokens [B], draft_tokens [B, k], draft_prob [B, k], draft_dist [B, k + 1, V] or None
    (draft_dist[:, i] is the distribution node i + 1 was drawn from; the last row is unused by
    rules and may be anything).
    """
    b, k = draft_tokens.shape
    n = k + 1
    tokens = jnp.concatenate([root_tokens[:, None], draft_tokens], axis=1).astype(jnp.int32)
    parents = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32) - 1, (b, n))
    depth = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
    valid = jnp.ones((b, n), bool)
    prob = jnp.concatenate([jnp.ones((b, 1), draft_prob.dtype), draft_prob], axis=1)
    return DraftTree(tokens=tokens, parents=parents, depth=depth, valid=valid, draft_prob=prob,
                     draft_dist=draft_dist)
