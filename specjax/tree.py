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
import numpy as np


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
    node_stats: [B, N, S] float32 or None  what the drafter knew about each node when it drafted
                               it (NODE_STATS, S = len(NODE_STATS); zeros for the root): the
                               pre-verifier's input (specjax.pre_verify). None: not recorded.
    node_hidden: [B, N, M] float32 or None  the drafter state the node's draft distribution was
                               read from (its parent's; zeros for the root), recorded only for
                               studies of what predicts acceptance (expand_topk's `hidden`).
    """

    tokens: jax.Array
    parents: jax.Array
    depth: jax.Array
    valid: jax.Array
    draft_prob: jax.Array
    draft_dist: jax.Array | None = None
    node_stats: jax.Array | None = None
    node_hidden: jax.Array | None = None

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


# Per-node drafting statistics (DraftTree.node_stats[..., i] = the i-th name), all computed from
# the draft distribution of the node's parent, the only thing every drafter has: log q(node),
# its cumulative log q over the path from the root, log q of the parent's most likely child, the
# entropy of the parent's distribution, the node's rank among the parent's children, its depth.
NODE_STATS = ("logq", "cum_logq", "parent_top1_logq", "parent_entropy", "rank", "depth")
LOGQ_FLOOR = -50.0


def distribution_stats(logq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log q of the most likely token [...], entropy [...]) of log-distributions logq [..., V]."""
    logq = logq.astype(jnp.float32)
    q = jnp.exp(logq)
    entropy = -jnp.sum(jnp.where(q > 0, q * logq, 0.0), axis=-1)
    return jnp.max(logq, axis=-1), entropy


def children_stats(child_logq, parent_cum, parent_logq, depth) -> jax.Array:
    """NODE_STATS of the children of some parents: child_logq [..., c] (log q of each child,
    children in rank order), parent_cum [...] (the parents' cumulative log q), parent_logq
    [..., V] (the parents' draft log-distribution), depth: the children's depth (int or [...]).
    Returns [..., c, len(NODE_STATS)]."""
    top1, entropy = distribution_stats(parent_logq)
    # Floored so that children of zero draft probability (top-k past a top-p cut) stay finite.
    child_logq = jnp.maximum(child_logq.astype(jnp.float32), LOGQ_FLOOR)
    top1 = jnp.maximum(top1, LOGQ_FLOOR)
    shape = child_logq.shape
    rank = jnp.broadcast_to(jnp.arange(shape[-1], dtype=jnp.float32), shape)
    columns = (
        child_logq,
        parent_cum[..., None] + child_logq,
        jnp.broadcast_to(top1[..., None], shape),
        jnp.broadcast_to(entropy[..., None], shape),
        rank,
        jnp.broadcast_to(jnp.asarray(depth, jnp.float32)[..., None], shape),
    )
    return jnp.stack(columns, axis=-1)


@flax.struct.dataclass
class Acceptance:
    """What an acceptance rule returns, per row.

    path:       [B, P] int32  accepted node indices from the root: path[:, 0] = 0, then the
                              accepted nodes in order; slots past n_accepted hold 0
                              (P = max depth + 1).
    n_accepted: [B] int32     number of accepted draft tokens (0..max depth); the root is not
                              counted.
    next_token: [B] int32     the extra token: correction at the first rejection, or bonus token.
    """

    path: jax.Array
    n_accepted: jax.Array
    next_token: jax.Array


def chain_tree(
    root_tokens: jax.Array,
    draft_tokens: jax.Array,
    draft_prob: jax.Array,
    draft_dist: jax.Array | None = None,
) -> DraftTree:
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
    return DraftTree(
        tokens=tokens,
        parents=parents,
        depth=depth,
        valid=valid,
        draft_prob=prob,
        draft_dist=draft_dist,
    )


# ---------------------------------------------------------------------------------------------
# Topology helpers. All are jittable with static shapes; `max_depth` (P = max_depth + 1) is a
# static Python int wherever it appears.
# ---------------------------------------------------------------------------------------------


def static_ancestor_mask(parents) -> np.ndarray:
    """[N, N] bool numpy mask of a fixed topology: mask[i, j] = node j is node i or one of its
    ancestors. parents: sequence of N ints in topological order (-1 for the root)."""
    n = len(parents)
    mask = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def ancestor_mask(parents: jax.Array) -> jax.Array:
    """[B, N, N] bool: mask[b, i, j] = node j is node i or an ancestor of node i.

    parents [B, N] int32 in topological order (parents[b, i] < i, -1 for the root). Invalid nodes
    are not special: they still see themselves and their ancestors, which keeps their attention
    rows non-empty (no NaN from an all-masked softmax).
    """
    n = parents.shape[1]
    eye = jnp.eye(n, dtype=bool)

    def one_row(par):  # par [N]
        def body(i, mask):
            pi = par[i]
            # parents[i] < i, so the parent's row is already final when node i is reached.
            inherited = jnp.where(pi >= 0, mask[jnp.maximum(pi, 0)], False)
            return mask.at[i].set(eye[i] | inherited)

        return jax.lax.fori_loop(1, n, body, eye)

    return jax.vmap(one_row)(parents)


def positions(tree: DraftTree, lengths: jax.Array) -> jax.Array:
    """[B, N] int32 cache positions of the tree nodes: lengths [B] + depth (the root sits at
    position lengths, its children at lengths + 1, ...)."""
    return (lengths[:, None] + tree.depth).astype(jnp.int32)


def causal_mask(batch: int, t: int) -> jax.Array:
    """[B, T, T] bool lower-triangular mask (a chain of T tokens: each sees itself and earlier)."""
    return jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (batch, t, t))


def _ancestor_chain(parents: jax.Array, nodes: jax.Array, max_depth: int) -> jax.Array:
    """[B, ..., P]: chain[..., s] = the s-th ancestor of `nodes` (s = 0: the node), -1 past the
    root. parents [B, N]; nodes [B, ...] int."""
    b = parents.shape[0]
    flat = nodes.reshape(b, -1)
    steps = [flat]
    cur = flat
    for _ in range(max_depth):
        up = jnp.take_along_axis(parents, jnp.maximum(cur, 0), axis=1)
        cur = jnp.where(cur >= 0, up, -1)
        steps.append(cur)
    return jnp.stack(steps, axis=-1).reshape(nodes.shape + (max_depth + 1,))


def _root_first(chain: jax.Array) -> jax.Array:
    """Reverse an ancestor chain [..., P] (node first, -1 padded) into a root-first path padded
    with 0 after the node."""
    p = chain.shape[-1]
    depth = jnp.sum(chain >= 0, axis=-1, keepdims=True) - 1  # [..., 1]
    slot = jnp.arange(p)
    src = jnp.clip(depth - slot, 0, p - 1)
    path = jnp.take_along_axis(chain, src, axis=-1)
    return jnp.where(slot <= depth, path, 0).astype(jnp.int32)


def node_paths(parents: jax.Array, max_depth: int) -> jax.Array:
    """[B, N, P] int32: paths[b, i] = root-to-node indices of node i (paths[b, i, 0] = 0,
    paths[b, i, depth(i)] = i), slots past depth(i) hold 0. Same layout as Acceptance.path.

    parents [B, N]; every node's depth must be <= max_depth (static).
    """
    b, n = parents.shape
    nodes = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
    return _root_first(_ancestor_chain(parents, nodes, max_depth))


def extract_path(parents: jax.Array, node: jax.Array, max_depth: int) -> jax.Array:
    """[B, P] int32 root-to-node path of one node per row, in Acceptance.path layout: path[:, 0]
    = 0, path[:, d] = the ancestor of node[b] at depth d for d <= depth(node), then 0.

    parents [B, N]; node [B] int. depth(node) (= the number of accepted tokens when `node` is the
    last accepted node) must be <= max_depth (static).
    """
    return _root_first(_ancestor_chain(parents, node, max_depth))


def expand_topk(
    step,
    root_state,
    root_tokens: jax.Array,
    *,
    depth: int,
    width: int,
    topk: int,
    num_nodes: int,
    stop=None,
    shared=None,
    hidden=None,
):
    """EAGLE-2 style dynamic tree with static shapes.

    Starting from the root, for `depth` levels: the W = `width` frontier nodes of the level are
    expanded by one drafter call, each proposes its `topk` most probable children, every child is
    scored by its cumulative draft log-probability (sum over its path), and the W best children
    become the next frontier. Finally the `num_nodes - 1` best of all proposed children (by
    cumulative log-probability) form the tree together with the root.

    Because a child's score is its parent's score plus a log-probability <= 0, and ties are broken
    toward the earlier (shallower) candidate, the chosen set is closed under taking parents.

    step(states, tokens) -> (logprobs [B, W, V], child_states):
        states: pytree with leading axes [B, W] (what each frontier node was given by its parent;
        at depth 0 the root state broadcast to all W slots), tokens [B, W] the frontier nodes'
        tokens. Returns the log-probabilities of each frontier node's children and the states to
        hand to those children (pytree with leading [B, W]); expand_topk gathers them along the
        W axis for the next frontier, so per-slot histories (e.g. a small KV cache) follow their
        node. Called `depth` times (traced once inside a lax.scan).
        With `shared` given, step(states, tokens, shared, level) -> (logprobs, child_states,
        shared): `shared` is a per-row pytree (leading axis [B]) threaded through the levels,
        and `level` the traced depth of the frontier being expanded (0 at the root). A drafter
        keeps there what it computes once per level rather than per node (the mdc chain), so
        that levels an early stop never reaches are never computed.
    root_state: pytree with leading axis [B]; root_tokens [B] int.
    stop: None, or (node_logp, threshold_logp, block) for drafting that stops early (PACER):
        node_logp(stats [B, X, len(NODE_STATS)]) -> [B, X] predicted log P(node accepted |
        parent accepted). After every `block` levels a row whose frontier holds no node with
        predicted path log-probability >= threshold_logp stops (its deeper children get score
        -inf), and the levels loop (a lax.while_loop) ends when every row has stopped. Whether
        a row stops depends only on the drafter's outputs, never on the target's.

    hidden: None, or hidden(child_states) -> [B, W, H], the state each frontier node's children
        were read from: then the tree records it per node (DraftTree.node_hidden). Not with
        `stop` (recording runs without a pre-verifier).

    Returns (tree, scores, shared): a DraftTree of num_nodes nodes in level (BFS) order --
    parents before children, siblings in the order of their parents, then by decreasing score --
    with draft_prob = q_parent(token) (exp of the step's log-probability), draft_dist None (the
    children are deterministic: use the one-hot rule) and node_stats (NODE_STATS); scores [B, N]
    the cumulative log-probabilities (0 for the root); and `shared` after the last level run
    (None when not given). Slots that cannot be filled with a finite-score node are invalid
    (parent 0, depth 1) and come after all valid nodes.
    """
    b = root_tokens.shape[0]
    w, k, n = width, topk, num_nodes
    wk = w * k
    n_stats = len(NODE_STATS)
    if w < 1 or k < 1 or depth < 1 or n < 1:
        raise ValueError("expand_topk needs width, topk, depth, num_nodes >= 1")
    if hidden is not None and stop is not None:
        raise ValueError("expand_topk records node_hidden only without an early stop")

    states = jax.tree.map(lambda x: jnp.broadcast_to(x[:, None], (b, w) + x.shape[1:]), root_state)
    tokens = jnp.broadcast_to(root_tokens[:, None].astype(jnp.int32), (b, w))
    # Slot 0 holds the root; the other slots are dummies with score -inf, whose children are never
    # preferred over a real node (they only fill slots, marked invalid, when nothing else is left).
    scores = jnp.full((b, w), -jnp.inf, jnp.float32).at[:, 0].set(0.0)
    fpool = jnp.full((b, w), -1, jnp.int32)  # pool index of each frontier node; -1 = the root
    fpi = jnp.zeros((b, w), jnp.float32)  # predicted path log-probability (early stop only)

    def level(carry, d):
        states, tokens, scores, fpool, fpi, shared = carry
        if shared is None:
            logp, child_states = step(states, tokens)
        else:
            logp, child_states, shared = step(states, tokens, shared, d)
        logp = logp.astype(jnp.float32)
        vals, toks = jax.lax.top_k(logp, k)  # [B, W, k]
        c_stats = children_stats(vals, scores, logp, d + 1).reshape(b, wk, n_stats)
        c_scores = (scores[..., None] + vals).reshape(b, wk)
        c_tokens = toks.reshape(b, wk).astype(jnp.int32)
        c_parent = jnp.broadcast_to(fpool[..., None], (b, w, k)).reshape(b, wk)
        c_logp = vals.reshape(b, wk)
        _, idx = jax.lax.top_k(c_scores, w)
        # Keep the frontier in candidate (pool) order, so that pool order stays level order with
        # siblings grouped in the order of their parents.
        idx = jnp.sort(idx, axis=-1)
        slot = idx // k

        def gather(x):
            ix = slot.reshape(slot.shape + (1,) * (x.ndim - 2))
            return jnp.take_along_axis(x, ix, axis=1)

        c_pi = fpi if stop is None else (fpi[..., None] + stop[0](c_stats).reshape(b, w, k))
        new = (
            jax.tree.map(gather, child_states),
            jnp.take_along_axis(c_tokens, idx, axis=1),
            jnp.take_along_axis(c_scores, idx, axis=1),
            (d * wk + idx).astype(jnp.int32),
            fpi if stop is None else jnp.take_along_axis(c_pi.reshape(b, wk), idx, axis=1),
            shared,
        )
        out = (c_tokens, c_scores, c_parent, c_logp, c_stats)
        if hidden is not None:  # every child of a frontier node was read from its state
            h = hidden(child_states)
            out += (jnp.broadcast_to(h[:, :, None], (b, w, k, h.shape[-1])).reshape(b, wk, -1),)
        return new, out

    carry = (states, tokens, scores, fpool, fpi, shared)
    if stop is None:
        carry, pool = jax.lax.scan(level, carry, jnp.arange(depth, dtype=jnp.int32))
    else:
        carry, pool = _levels_until_stopped(level, carry, depth, b, wk, n_stats, stop)
    shared = carry[-1]
    # [D, B, W*k] -> [B, M] pool in level order, M = depth * W * k.
    p_tok, p_score, p_parent, p_logp = (
        jnp.moveaxis(x, 0, 1).reshape(b, depth * wk) for x in pool[:4]
    )
    p_stats = jnp.moveaxis(pool[4], 0, 1).reshape(b, depth * wk, n_stats)
    p_hidden = None if hidden is None else jnp.moveaxis(pool[5], 0, 1).reshape(b, depth * wk, -1)
    m = depth * wk
    p_depth = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32) // wk + 1, (b, m))
    if n - 1 > m:  # budget larger than the pool: pad with dummies that become invalid slots
        pad = n - 1 - m
        p_tok = jnp.pad(p_tok, ((0, 0), (0, pad)))
        p_score = jnp.pad(p_score, ((0, 0), (0, pad)), constant_values=-jnp.inf)
        p_parent = jnp.pad(p_parent, ((0, 0), (0, pad)), constant_values=-1)
        p_logp = jnp.pad(p_logp, ((0, 0), (0, pad)), constant_values=-jnp.inf)
        p_depth = jnp.pad(p_depth, ((0, 0), (0, pad)), constant_values=1)
        p_stats = jnp.pad(p_stats, ((0, 0), (0, pad), (0, 0)))
        if p_hidden is not None:
            p_hidden = jnp.pad(p_hidden, ((0, 0), (0, pad), (0, 0)))
        m = n - 1

    if n > 1:
        # lax.top_k breaks ties toward the lower index, i.e. toward parents (earlier in the pool).
        top_score, sel = jax.lax.top_k(p_score, n - 1)
        # Level order (-> topological order) for the real nodes; unfillable slots go last, so the
        # valid nodes always form a prefix of the tree.
        sel = jnp.sort(jnp.where(jnp.isfinite(top_score), sel, sel + m), axis=-1) % m
        rows = jnp.arange(b)[:, None]
        pool_to_tree = (
            jnp.zeros((b, m), jnp.int32).at[rows, sel].set(jnp.arange(1, n, dtype=jnp.int32))
        )
        s_score = jnp.take_along_axis(p_score, sel, axis=1)
        s_parent_pool = jnp.take_along_axis(p_parent, sel, axis=1)
        s_valid = jnp.isfinite(s_score)
        s_parent = jnp.where(
            s_parent_pool >= 0,
            jnp.take_along_axis(pool_to_tree, jnp.maximum(s_parent_pool, 0), axis=1),
            0,
        )
        s_parent = jnp.where(s_valid, s_parent, 0)
        s_depth = jnp.where(s_valid, jnp.take_along_axis(p_depth, sel, axis=1), 1)
        s_tok = jnp.where(s_valid, jnp.take_along_axis(p_tok, sel, axis=1), 0)
        s_prob = jnp.where(s_valid, jnp.exp(jnp.take_along_axis(p_logp, sel, axis=1)), 0.0)
        s_stats = jnp.take_along_axis(p_stats, sel[..., None], axis=1)
        s_stats = jnp.where(s_valid[..., None], s_stats, 0.0)
        if p_hidden is not None:
            s_hidden = jnp.take_along_axis(p_hidden, sel[..., None], axis=1)
            s_hidden = jnp.where(s_valid[..., None], s_hidden, 0.0)
    else:
        s_score = s_prob = jnp.zeros((b, 0), jnp.float32)
        s_parent = s_depth = s_tok = jnp.zeros((b, 0), jnp.int32)
        s_valid = jnp.zeros((b, 0), bool)
        s_stats = jnp.zeros((b, 0, n_stats), jnp.float32)
        if p_hidden is not None:
            s_hidden = p_hidden[:, :0]
    node_hidden = None
    if p_hidden is not None:  # the root's row is zeros: it has no parent state
        root_row = jnp.zeros((b, 1, p_hidden.shape[-1]), jnp.float32)
        node_hidden = jnp.concatenate([root_row, s_hidden.astype(jnp.float32)], axis=1)

    def with_root(root_value, rest):
        return jnp.concatenate([jnp.full((b, 1), root_value, rest.dtype), rest], axis=1)

    tree = DraftTree(
        tokens=jnp.concatenate([root_tokens[:, None].astype(jnp.int32), s_tok], axis=1),
        parents=with_root(-1, s_parent.astype(jnp.int32)),
        depth=with_root(0, s_depth.astype(jnp.int32)),
        valid=with_root(True, s_valid),
        draft_prob=with_root(1.0, s_prob.astype(jnp.float32)),
        draft_dist=None,
        node_stats=jnp.concatenate([jnp.zeros((b, 1, n_stats), jnp.float32), s_stats], axis=1),
        node_hidden=node_hidden,
    )
    scores = with_root(0.0, jnp.where(s_valid, s_score, -jnp.inf).astype(jnp.float32))
    return tree, scores, shared


def _levels_until_stopped(level, carry, depth: int, b: int, wk: int, n_stats: int, stop):
    """expand_topk's levels in a lax.while_loop that ends once every row has stopped (see
    expand_topk's `stop`). Returns the carry after the last level run and the pool [D, B, W*k]
    (x4) and [D, B, W*k, S] like the scan's; levels never reached hold score -inf (they become
    invalid slots)."""
    node_logp, threshold_logp, block = stop
    del node_logp  # used inside `level`
    pool = (
        jnp.zeros((depth, b, wk), jnp.int32),
        jnp.full((depth, b, wk), -jnp.inf, jnp.float32),
        jnp.full((depth, b, wk), -1, jnp.int32),
        jnp.full((depth, b, wk), -jnp.inf, jnp.float32),
        jnp.zeros((depth, b, wk, n_stats), jnp.float32),
    )
    drafting = jnp.ones((b,), bool)

    def cond(c):
        d, _, _, drafting = c
        return (d < depth) & jnp.any(drafting)

    def body(c):
        d, carry, pool, drafting = c
        new, out = level(carry, d)
        states, tokens, scores, fpool, fpi, shared = new
        # Rows that stopped earlier add nothing at this level.
        out = (
            out[0],
            jnp.where(drafting[:, None], out[1], -jnp.inf),
            out[2],
            out[3],
            out[4],
        )
        pool = tuple(p.at[d].set(o) for p, o in zip(pool, out, strict=True))
        hopeful = jnp.any((fpi >= threshold_logp) & jnp.isfinite(scores), axis=1)
        checked = (d + 1) % block == 0
        drafting = drafting & jnp.where(checked, hopeful, True)
        scores = jnp.where(drafting[:, None], scores, -jnp.inf)
        return d + 1, (states, tokens, scores, fpool, fpi, shared), pool, drafting

    _, carry, pool, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), carry, pool, drafting))
    return carry, pool
