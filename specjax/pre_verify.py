"""Pre-verification inside the speculative step (PACER): keep the drafted nodes a trained
pre-verifier expects the target to accept, and verify them on the smallest of a few static node
counts.

Axis letters: B batch, N tree nodes (the configured budget), n a bucket's node count,
P = max_depth + 1 path slots, M model dim.

Why this stays lossless: which nodes are kept depends only on the drafter's outputs
(DraftTree.node_stats), never on the target's, and the kept set is closed under parents, so the
verified tree is just a smaller draft tree. For deterministic (top-k) children any such subset
is verified exactly by the same rules. Children sampled from q are different: dropping a
sampled child because of its own token would bias the output (the rule assumes it is a draw
from q), so the engine pre-verifies only trees whose children are deterministic (greedy
decoding, and feature drafters at any temperature; see speculative.pruning_pre_verifier).

Static shapes: the kept nodes are moved to the front of the tree (in topological order), the
batch's largest kept count picks a bucket, and `branching.switch_in_place` runs the verifier on
the first n nodes of that bucket; its outputs are padded back to N nodes. The acceptance comes
back in the compacted indices (what the verifier's commit needs) and is mapped back to the
drafter's own node indices for the drafter's commit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.branching import switch_in_place
from specjax.tree import NODE_STATS, Acceptance, DraftTree, ancestor_mask


def default_buckets(num_nodes: int) -> tuple[int, ...]:
    """Node counts verification may run on: 1 (the root alone: a plain decoding step), the
    powers of two from 4 below N, and N. (2 is left out: on a CPU a 2-token forward costs about
    as much as a 4-token one, see experiments/results/bench.md's t(N).)"""
    sizes = {1, num_nodes}
    n = 4
    while n < num_nodes:
        sizes.add(n)
        n *= 2
    return tuple(sorted(sizes))


def valid_mask(tree: DraftTree, live: jax.Array) -> jax.Array:
    """[B, N] the nodes to verify when nothing is pruned: the valid ones and the root; rows no
    longer live keep only the root."""
    root = jnp.arange(tree.num_nodes)[None, :] == 0
    return jnp.where(live[:, None], tree.valid | root, root)


def path_logp(node_logp: jax.Array, parents: jax.Array, max_depth: int) -> jax.Array:
    """[B, N] log of the predicted probability that the whole path from the root to each node is
    accepted: the sum of node_logp [B, N] over the node and its ancestors (the root's is 0).
    parents [B, N] in topological order; max_depth static (that many sweeps settle every node)."""
    node_logp = node_logp.at[:, 0].set(0.0)
    pi = node_logp
    parent = jnp.maximum(parents, 0)
    for _ in range(max_depth):
        pi = node_logp + jnp.where(parents >= 0, jnp.take_along_axis(pi, parent, axis=1), 0.0)
    return pi


def keep_mask(
    tree: DraftTree,
    pv,
    live: jax.Array,
    max_depth: int,
    buckets: tuple[int, ...] = (),
    text_nodes: int = 0,
) -> jax.Array:
    """[B, N] nodes to verify: valid nodes whose predicted path probability reaches the
    pre-verifier's threshold, and the root; rows no longer live keep only the root. With the
    pre-verifier's measured costs, only the nodes of the bucket with the most expected tokens
    per second (bucket_by_cost) are kept. text_nodes (static): the last nodes are a text
    chain's, predicted by the match they were drafted from (with_chain_evidence)."""
    node_logp = pv.node_logp(tree.node_stats)
    if text_nodes:
        node_logp = with_chain_evidence(tree, node_logp, text_nodes, max_depth)
    pi = path_logp(node_logp, tree.parents, max_depth)
    keep = tree.valid & (pi >= pv.keep_logp(tree.num_nodes))
    root = jnp.arange(tree.num_nodes)[None, :] == 0
    keep = jnp.where(live[:, None], keep | root, root)
    if pv.shape.costs and len(buckets) > 1:
        keep = bucket_by_cost(keep, pi, live, buckets, pv.shape.costs)
    return keep


def with_chain_evidence(tree: DraftTree, node_logp, text_nodes: int, max_depth: int):
    """node_logp [B, N] (log P(node accepted | parent accepted)) with the last text_nodes nodes,
    a text chain's, read from the match each was drafted from (their recorded logq) instead of
    the network, which never saw them. Where the chain spells a path of the drafter's tree
    (drafters.feature.with_text_chain hangs the chain's first valid node from its end), each
    node of that path is given at least the path probability the chain's own match puts on it
    (the recorded cum_logq of the chain node it stands in for): the text agreeing with the
    drafter is no weaker evidence than the text alone. Returned as conditional probabilities,
    so that path probabilities still never grow from parent to child."""
    n = tree.num_nodes
    first_text = n - text_nodes
    from_text = jnp.arange(n)[None, :] >= first_text
    stats = tree.node_stats
    node_logp = jnp.where(from_text, stats[..., NODE_STATS.index("logq")], node_logp)
    chain_cum = stats[:, first_text:, NODE_STATS.index("cum_logq")]  # [B, K], from the root
    hangs = from_text & tree.valid & (tree.parents < first_text)
    at = jnp.max(jnp.where(hangs, tree.parents, 0), axis=1)  # [B]: the path's end (0: none)
    pi = path_logp(node_logp, tree.parents, max_depth)
    node = jnp.arange(n)[None, :]
    raised, on_path = pi, jnp.zeros(pi.shape, bool)
    for _ in range(max_depth):  # up the path, one node a sweep
        here = (node == at[:, None]) & (at[:, None] > 0)
        depth = jnp.take_along_axis(tree.depth, at[:, None], axis=1)
        own = jnp.take_along_axis(chain_cum, jnp.clip(depth - 1, 0, text_nodes - 1), axis=1)
        raised = jnp.where(here, jnp.maximum(raised, own), raised)
        on_path = on_path | here
        at = jnp.maximum(jnp.take_along_axis(tree.parents, at[:, None], axis=1)[:, 0], 0)
    parent_pi = jnp.take_along_axis(raised, jnp.maximum(tree.parents, 0), axis=1)
    return jnp.where(on_path, raised - parent_pi, node_logp)


def bucket_seconds(costs, buckets) -> np.ndarray:
    """t(n) for each bucket n from measured ((n, seconds), ...): interpolated between measured
    counts and extrapolated along the last two past them (as VerifyCosts.t_verify does; held
    flat, a 56-node bucket would be priced at the 32-node cost and win whenever it adds any
    expected tokens)."""
    xs, ys = (np.asarray(v, float) for v in zip(*sorted(costs), strict=True))
    n = np.asarray(buckets, float)
    seconds = np.interp(n, xs, ys)
    if len(xs) > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        seconds = np.where(n > xs[-1], ys[-1] + (n - xs[-1]) * max(slope, 0.0), seconds)
    return seconds


def bucket_by_cost(keep, pi, live, buckets: tuple[int, ...], costs) -> jax.Array:
    """Keep the n - 1 most probable kept nodes of every row (and the root), n the bucket that
    maximizes sum over live rows of E[tokens | n] / t(n): E = 1 + the sum of the top n - 1 path
    probabilities (the expected tokens of a tree whose siblings are distinct: each node adds its
    probability of being on the accepted path). The most probable nodes are closed under
    parents (a child is never more probable than its parent; ties go to the lower index, the
    parent). keep [B, N] bool, pi [B, N] log path probabilities, costs ((n, seconds), ...)."""
    n_nodes = keep.shape[1]
    not_root = jnp.arange(n_nodes)[None, :] > 0
    prob = jnp.where(keep & not_root, jnp.exp(pi), 0.0)
    top, order = jax.lax.top_k(prob, n_nodes - 1)  # [B, N - 1], descending
    expected = 1.0 + jnp.concatenate([jnp.zeros_like(top[:, :1]), jnp.cumsum(top, axis=1)], 1)
    seconds = bucket_seconds(costs, buckets)  # static: one cost per bucket
    per_bucket = expected[:, np.asarray(buckets) - 1]  # [B, K]
    score = jnp.sum(jnp.where(live[:, None], per_bucket, 0.0), axis=0) / jnp.asarray(seconds)
    n_best = jnp.asarray(buckets)[jnp.argmax(score)]
    rows = jnp.arange(keep.shape[0])[:, None]
    rank = (
        jnp.full(keep.shape, n_nodes, jnp.int32)
        .at[rows, order]
        .set(jnp.arange(n_nodes - 1, dtype=jnp.int32)[None, :])
    )
    return ~not_root | (keep & (rank < n_best - 1))


def compact(tree: DraftTree, keep: jax.Array) -> tuple[DraftTree, jax.Array]:
    """Move the kept nodes to the front, each group in its original (topological) order.

    Returns (tree, order): order [B, N] original index of each compacted node; nodes not kept
    are invalid. Parents stay before children: kept parents precede every dropped node, and
    dropped nodes keep their relative order."""
    order = jnp.argsort(~keep, axis=1, stable=True).astype(jnp.int32)
    inverse = jnp.argsort(order, axis=1).astype(jnp.int32)

    def take(x):
        ix = order.reshape(order.shape + (1,) * (x.ndim - 2))
        return jnp.take_along_axis(x, ix, axis=1)

    parents = take(tree.parents)
    parents = jnp.where(
        parents >= 0, jnp.take_along_axis(inverse, jnp.maximum(parents, 0), axis=1), -1
    )
    # Every per-node field moves with its node (None fields stay None); then the kept mask
    # and the parents renumbered to the compacted order.
    compacted = jax.tree.map(take, tree).replace(valid=take(keep), parents=parents)
    return compacted, order


def bucket_index(n_kept: jax.Array, buckets: tuple[int, ...]) -> jax.Array:
    """Index of the smallest bucket holding max(n_kept [B]) nodes."""
    return jnp.sum(jnp.asarray(buckets) < jnp.max(n_kept))


def first_nodes(tree: DraftTree, n: int) -> DraftTree:
    """The tree's first n nodes (a parent-closed prefix of a topological order)."""
    return jax.tree.map(lambda x: x[:, :n], tree)


def pad_nodes(x: jax.Array, num_nodes: int) -> jax.Array:
    """[B, n, ...] -> [B, N, ...] with zeros after the first n nodes."""
    pad = [(0, 0), (0, num_nodes - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, pad)


def verify_in_buckets(verifier, state, target, tree: DraftTree, keys, buckets, **kwargs):
    """verifier.verify on the first `bucket` nodes of the compacted tree, the bucket chosen
    from the batch's kept counts; the Verification's hidden states are padded back to N.
    The verifier state (the target's cache) is updated in place (branching.switch_in_place:
    a lax.switch copied the whole cache on every step)."""
    n_full = tree.num_nodes
    index = bucket_index(jnp.sum(tree.valid, axis=1), buckets)

    def branch(n):
        def run(state, tree, keys):
            sub = first_nodes(tree, n)
            v = verifier.verify(state, target, sub, ancestor_mask(sub.parents), keys, **kwargs)
            v = v.replace(hidden={i: pad_nodes(h, n_full) for i, h in v.hidden.items()})
            return v.state, v.replace(state=None)

        return run

    new_state, verification = switch_in_place(
        index, [branch(n) for n in buckets], state, tree, keys
    )
    return verification.replace(state=new_state), jnp.asarray(buckets, jnp.int32)[index]


def to_drafter_indices(acceptance: Acceptance, order: jax.Array) -> Acceptance:
    """The acceptance path in the drafter's node indices (order from compact)."""
    return acceptance.replace(path=jnp.take_along_axis(order, acceptance.path, axis=1))


def hidden_to_drafter_order(hidden: dict, order: jax.Array) -> dict:
    """Verification hidden states {i: [B, N, M]} in compacted order -> the drafter's order."""
    inverse = jnp.argsort(order, axis=1)
    return {i: jnp.take_along_axis(h, inverse[:, :, None], axis=1) for i, h in hidden.items()}
