"""Token-wise rejection sampling: chains (standard speculative sampling) and trees.

Axis letters: B batch, N tree nodes, V vocab, P = max_depth + 1 path slots, K = draft levels.

Conventions shared by all rules: p [B, N, V] holds the target's next-token distribution at every
node (after the sampling transform), tree.draft_dist [B, N, V] the drafter's distribution the
children of each node were drawn from. `key` is per-row PRNG keys [B] (typed or raw uint32
[B, 2]); a single key is split into B. Row b only ever consumes keys[b], so its result does not
depend on the other rows. Every rule returns Acceptance(path [B, P], n_accepted [B],
next_token [B]).

- verify_chain: standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023). Accept
  x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample from
  norm(max(p_i - q_i, 0)); if every valid draft is accepted sample the bonus token from p at the
  last node. Invalid nodes end the chain (they count as not drafted).
- verify_tree_onehot: deterministic children (top-k expansion, q one-hot). At node u keep a
  residual r = p_u; try the valid children of u in index order, accepting child c with
  probability r(token(c)); on rejection set r(token(c)) = 0 and renormalise; after the last child
  sample from r. Lossless because each candidate meets exactly the mass left for it.
- verify_tree_sampled: children drawn i.i.d. from q_u (SpecInfer's multi-step speculative
  sampling / recursive rejection sampling). r = p_u; for each child: accept with probability
  min(1, r(x) / q_u(x)), otherwise r = norm(max(r - q_u, 0)).

Both tree rules are one lax.fori_loop over node index j = 1..N-1 per row: since parents[j] < j,
accepting child j of the current node u moves u to j (r = p_j) and the scan simply continues;
later siblings of j no longer match parent == u and are skipped, while j's children come later.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.sampling import normalize, residual, row_keys, sample
from specjax.tree import Acceptance, DraftTree

# Floor for drafter probabilities in ratios: a drafted token has q > 0 in exact arithmetic, the
# floor only keeps a rounding-level zero from producing inf / NaN.
_TINY = 1e-30


def chain_path(n_accepted: jax.Array, max_depth: int) -> jax.Array:
    """[B, P] path of a chain tree (node i + 1 is the child of node i) after n accepted drafts:
    [0, 1, ..., n, 0, ..., 0]."""
    slot = jnp.arange(max_depth + 1, dtype=jnp.int32)[None, :]
    return jnp.where(slot <= n_accepted[:, None], slot, 0).astype(jnp.int32)


def chain_levels(tree: DraftTree, p: jax.Array, max_depth: int):
    """Per-level views of a chain tree for the chain rules (levels t = 1..K, K = min(N-1, P-1)).

    Returns (x [B, K] drafted tokens, p_lv [B, K, V] target distribution x_t is judged against
    (at node t - 1), q_lv [B, K, V] drafter distribution x_t was drawn from, drafted [B, K] bool:
    level t is part of the draft (all nodes 1..t valid)).
    """
    if tree.draft_dist is None:
        raise ValueError(
            "chain rules need tree.draft_dist (the drafter distribution q): use a drafter that "
            "samples its children, or the rule 'tree_onehot'"
        )
    k = min(tree.num_nodes - 1, max_depth)
    x = tree.tokens[:, 1 : k + 1]
    p_lv = p[:, :k].astype(jnp.float32)
    q_lv = tree.draft_dist[:, :k].astype(jnp.float32)
    return x, p_lv, q_lv, prefix_all(tree.valid[:, 1 : k + 1])


def prefix_all(x: jax.Array) -> jax.Array:
    """[B, K] bool -> [B, K] bool: out[:, t] = all(x[:, :t + 1]).

    A static loop of K ands rather than cumprod: XLA lowers cumprod to a reduce-window, which it
    constant-folds very slowly when the input is a constant (e.g. an all-valid chain)."""
    cols, run = [], jnp.ones(x.shape[:1], bool)
    for t in range(x.shape[1]):
        run = run & x[:, t]
        cols.append(run)
    return jnp.stack(cols, axis=1) if cols else x.astype(bool)


def _take(dist: jax.Array, tokens: jax.Array) -> jax.Array:
    """dist [B, K, V], tokens [B, K] -> dist[b, t, tokens[b, t]] [B, K]."""
    return jnp.take_along_axis(dist, tokens[..., None], axis=-1)[..., 0]


def verify_chain(tree: DraftTree, p: jax.Array, key: jax.Array, max_depth: int) -> Acceptance:
    """Standard speculative sampling on a chain tree.

    tree: chain of N nodes with draft_dist [B, N, V]; p [B, N, V]; key [B] per-row keys;
    max_depth static (levels beyond it are ignored).
    """
    b = tree.tokens.shape[0]
    x, p_lv, q_lv, drafted = chain_levels(tree, p, max_depth)
    k = x.shape[1]
    keys = row_keys(key, b)
    split = jax.vmap(lambda kk: jax.random.split(kk, 2))(keys)
    u = jax.vmap(lambda kk: jax.random.uniform(kk, (k,)))(split[:, 0])
    px, qx = _take(p_lv, x), _take(q_lv, x)
    # u < p/q written without the division; u is in [0, 1), so p >= q always accepts.
    ok = drafted & (u * qx < px)
    n_acc = jnp.sum(prefix_all(ok), axis=1).astype(jnp.int32)
    n_drafted = jnp.sum(drafted, axis=1).astype(jnp.int32)
    node = n_acc[:, None, None]
    p_n = jnp.take_along_axis(p.astype(jnp.float32), node, axis=1)[:, 0]
    q_n = jnp.take_along_axis(
        jnp.pad(q_lv, ((0, 0), (0, 1), (0, 0))), jnp.minimum(node, k), axis=1
    )[:, 0]
    dist = jnp.where((n_acc < n_drafted)[:, None], residual(p_n, q_n), p_n)
    nxt = jax.vmap(sample)(split[:, 1], dist)
    return Acceptance(path=chain_path(n_acc, max_depth), n_accepted=n_acc, next_token=nxt)


def _verify_tree(
    tree: DraftTree, p: jax.Array, key: jax.Array, max_depth: int, sampled: bool
) -> Acceptance:
    b, n = tree.tokens.shape
    keys = row_keys(key, b)
    q = tree.draft_dist if sampled else p  # q unused by the one-hot rule
    if q is None:
        raise ValueError(
            "verify_tree_sampled needs tree.draft_dist (the drafter distribution q): use a "
            "drafter that samples its children, or the rule 'tree_onehot'"
        )

    def one_row(tokens, parents, valid, p_row, q_row, kk):
        k_u, k_s = jax.random.split(kk)
        u = jax.random.uniform(k_u, (n,))  # one independent uniform per node

        def body(j, state):
            cur, r, n_acc, path = state
            x = tokens[j]
            # Children deeper than max_depth cannot be recorded in the path: treat as undrafted.
            child = valid[j] & (parents[j] == cur) & (n_acc < max_depth)
            if sampled:
                q_u = q_row[cur]
                accept = u[j] * q_u[x] < r[x]
                r_rej = normalize(jnp.maximum(r - q_u, 0.0), fallback=r)
            else:
                accept = u[j] < r[x]
                r_rej = normalize(r.at[x].set(0.0), fallback=r)
            acc = child & accept
            r = jnp.where(acc, p_row[j], jnp.where(child, r_rej, r))
            path = jnp.where(acc, path.at[n_acc + 1].set(j, mode="drop"), path)
            return (jnp.where(acc, j, cur), r, n_acc + acc.astype(jnp.int32), path)

        init = (jnp.int32(0), p_row[0], jnp.int32(0), jnp.zeros((max_depth + 1,), jnp.int32))
        _, r, n_acc, path = jax.lax.fori_loop(1, n, body, init)
        return path, n_acc, sample(k_s, r)

    path, n_acc, nxt = jax.vmap(one_row)(
        tree.tokens, tree.parents, tree.valid, p.astype(jnp.float32), q.astype(jnp.float32), keys
    )
    return Acceptance(path=path, n_accepted=n_acc, next_token=nxt)


def verify_tree_onehot(tree: DraftTree, p: jax.Array, key: jax.Array, max_depth: int) -> Acceptance:
    """Tree with deterministic children (q one-hot). tree: N nodes in topological order (siblings
    should carry distinct tokens to be useful); p [B, N, V]; key [B]; max_depth static."""
    return _verify_tree(tree, p, key, max_depth, sampled=False)


def verify_tree_sampled(
    tree: DraftTree, p: jax.Array, key: jax.Array, max_depth: int
) -> Acceptance:
    """Tree whose children of u were drawn i.i.d. from q_u = tree.draft_dist[:, u]. p [B, N, V];
    key [B]; max_depth static."""
    return _verify_tree(tree, p, key, max_depth, sampled=True)
