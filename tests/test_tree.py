"""Tree helpers: ancestor masks, paths, positions, masks, and EAGLE-2 style expand_topk."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.config import TreeConfig
from specjax.tree import (
    DraftTree,
    ancestor_mask,
    causal_mask,
    chain_tree,
    expand_topk,
    extract_path,
    node_paths,
    positions,
)


def random_parents(rng, b: int, n: int) -> np.ndarray:
    parents = np.full((b, n), -1, np.int32)
    for i in range(1, n):
        parents[:, i] = rng.integers(0, i, b)
    return parents


def depths_of(parents: np.ndarray) -> np.ndarray:
    depth = np.zeros_like(parents)
    for i in range(1, parents.shape[1]):
        depth[:, i] = depth[np.arange(parents.shape[0]), parents[:, i]] + 1
    return depth


def python_path(par_row, i):
    path = [i]
    while par_row[path[-1]] >= 0:
        path.append(int(par_row[path[-1]]))
    return path[::-1]


@pytest.mark.parametrize("n", [1, 2, 9, 24])
def test_ancestor_mask_and_paths_match_python(n):
    rng = np.random.default_rng(n)
    parents = random_parents(rng, 6, n)
    max_depth = int(depths_of(parents).max())
    mask = np.asarray(jax.jit(ancestor_mask)(jnp.asarray(parents)))
    paths = np.asarray(jax.jit(node_paths, static_argnums=1)(jnp.asarray(parents), max_depth))
    assert mask.shape == (6, n, n) and paths.shape == (6, n, max_depth + 1)
    for b in range(6):
        for i in range(n):
            ref = python_path(parents[b], i)
            expected = np.zeros(n, bool)
            expected[ref] = True
            np.testing.assert_array_equal(mask[b, i], expected)
            np.testing.assert_array_equal(paths[b, i], ref + [0] * (max_depth + 1 - len(ref)))


def test_ancestor_mask_of_static_topology():
    cfg = TreeConfig(branching=(3, 2, 1))
    parents = jnp.asarray([cfg.parents()], jnp.int32)
    mask = np.asarray(ancestor_mask(parents))[0]
    assert np.all(np.diag(mask)) and np.all(mask[:, 0])  # everyone sees itself and the root
    assert np.all(np.triu(mask, 1) == 0)  # topological order: ancestors have smaller indices
    np.testing.assert_array_equal(mask.sum(1), np.asarray(cfg.depths()) + 1)


def test_extract_path_matches_node_paths_and_acceptance_layout():
    rng = np.random.default_rng(0)
    parents = jnp.asarray(random_parents(rng, 8, 15))
    max_depth = int(depths_of(np.asarray(parents)).max())
    nodes = jnp.asarray(rng.integers(0, 15, 8), jnp.int32)
    path = np.asarray(extract_path(parents, nodes, max_depth))
    all_paths = np.asarray(node_paths(parents, max_depth))
    np.testing.assert_array_equal(path, all_paths[np.arange(8), np.asarray(nodes)])
    # Acceptance.path layout: slot 0 is the root, slot depth(node) is the node, zeros after.
    depth = depths_of(np.asarray(parents))[np.arange(8), np.asarray(nodes)]
    assert np.all(path[:, 0] == 0)
    np.testing.assert_array_equal(path[np.arange(8), depth], np.asarray(nodes))
    assert np.all(path[np.arange(max_depth + 1)[None, :] > depth[:, None]] == 0)


def test_positions_and_causal_mask():
    cfg = TreeConfig(branching=(2, 2))
    b, n = 3, cfg.num_nodes
    tree = DraftTree(
        tokens=jnp.zeros((b, n), jnp.int32),
        parents=jnp.broadcast_to(jnp.asarray(cfg.parents()), (b, n)),
        depth=jnp.broadcast_to(jnp.asarray(cfg.depths()), (b, n)),
        valid=jnp.ones((b, n), bool),
        draft_prob=jnp.ones((b, n)),
    )
    lengths = jnp.asarray([0, 5, 17])
    pos = np.asarray(positions(tree, lengths))
    np.testing.assert_array_equal(pos, np.asarray(lengths)[:, None] + np.asarray(cfg.depths()))
    assert pos.dtype == np.int32
    cm = np.asarray(causal_mask(2, 4))
    assert cm.shape == (2, 4, 4)
    np.testing.assert_array_equal(cm[1], np.tril(np.ones((4, 4), bool)))
    # A chain's ancestor mask is the causal mask.
    chain = chain_tree(jnp.zeros((2,), jnp.int32), jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3)))
    np.testing.assert_array_equal(np.asarray(ancestor_mask(chain.parents)), cm)


# ---------------------------------------------------------------------------------------------
# expand_topk
# ---------------------------------------------------------------------------------------------

VOCAB = 6


def toy_logprobs(code):
    """Deterministic 'drafter': child log-probs of the node whose path code is `code`."""
    code = jnp.asarray(code, jnp.float32)
    logits = 3.0 * jnp.sin(code[..., None] * 1.37 + jnp.arange(VOCAB) * 2.11)
    return jax.nn.log_softmax(logits, axis=-1)


def toy_step(states, tokens):
    """states [B, W] int codes of the parent's path; returns (log-probs [B, W, V], codes)."""
    code = states * (VOCAB + 1) + tokens + 1  # unique code of the node's own path
    return toy_logprobs(code), code


def reference_expand(root_state, root_token, depth, width, topk, num_nodes):
    """Plain-Python EAGLE-2 expansion: returns {token path: cumulative score} of the best
    num_nodes - 1 proposed nodes."""
    frontier = [(0.0, root_state, root_token, ())]
    pool = []
    for _ in range(depth):
        cands = []
        for score, state, tok, path in frontier:
            code = state * (VOCAB + 1) + tok + 1
            lp = np.asarray(toy_logprobs(code))
            for x in np.argsort(-lp, kind="stable")[:topk]:
                cands.append((np.float32(score) + lp[x], code, int(x), path + (int(x),)))
        pool += cands
        frontier = sorted(cands, key=lambda c: -c[0])[:width]
    best = sorted(pool, key=lambda c: -c[0])[: num_nodes - 1]
    return {c[3]: float(c[0]) for c in best}


def tree_paths(tree: DraftTree, scores, b: int):
    tokens, parents, valid = (np.asarray(a)[b] for a in (tree.tokens, tree.parents, tree.valid))
    out = {}
    for i in range(1, tokens.shape[0]):
        if valid[i]:
            out[tuple(int(tokens[j]) for j in python_path(parents, i)[1:])] = float(
                np.asarray(scores)[b, i]
            )
    return out


@functools.partial(jax.jit, static_argnames=("depth", "width", "topk", "num_nodes"))
def run_expand(root_state, root_tokens, *, depth, width, topk, num_nodes):
    return expand_topk(
        toy_step, root_state, root_tokens, depth=depth, width=width, topk=topk, num_nodes=num_nodes
    )


@pytest.mark.parametrize(
    "depth,width,topk,num_nodes",
    [(4, 3, 3, 16), (3, 4, 2, 12), (2, 2, 3, 40), (1, 1, 1, 2), (3, 2, 2, 1)],
    ids=["eagle2", "width>topk", "budget>pool", "tiny", "root_only"],
)
def test_expand_topk(depth, width, topk, num_nodes):
    b = 4
    root_state = jnp.arange(b, dtype=jnp.int32) * 3
    root_tokens = jnp.asarray([1, 4, 0, 5], jnp.int32)
    tree, scores, _ = run_expand(
        root_state, root_tokens, depth=depth, width=width, topk=topk, num_nodes=num_nodes
    )
    tok, par, dep, val, prob = (
        np.asarray(a) for a in (tree.tokens, tree.parents, tree.depth, tree.valid, tree.draft_prob)
    )
    sc = np.asarray(scores)
    n = num_nodes
    assert tok.shape == par.shape == dep.shape == val.shape == sc.shape == (b, n)  # budget
    assert tree.draft_dist is None
    np.testing.assert_array_equal(tok[:, 0], np.asarray(root_tokens))
    assert np.all(par[:, 0] == -1) and np.all(dep[:, 0] == 0) and np.all(val[:, 0])
    idx = np.arange(1, n)
    rows = np.arange(b)[:, None]
    # Topological, depths consistent, children of valid parents only.
    assert np.all((par[:, 1:] >= 0) & (par[:, 1:] < idx[None, :]))
    np.testing.assert_array_equal(dep[:, 1:][val[:, 1:]], (dep[rows, par[:, 1:]] + 1)[val[:, 1:]])
    assert np.all(val[rows, par[:, 1:]][val[:, 1:]])
    assert np.all(dep[:, 1:][val[:, 1:]] <= depth)
    # Level (BFS) order: depth non-decreasing over valid nodes, then parents non-decreasing,
    # siblings by decreasing score.
    for r in range(b):
        v = np.flatnonzero(val[r])
        order = list(zip(dep[r, v], np.where(v > 0, par[r, v], -1), -sc[r, v], strict=True))
        assert order == sorted(order)
        # Invalid slots come last.
        assert np.all(val[r, : len(v)])
    # draft_prob = q_parent(token) = exp(score - parent score).
    np.testing.assert_allclose(
        prob[:, 1:][val[:, 1:]], np.exp(sc[:, 1:] - sc[rows, par[:, 1:]])[val[:, 1:]], rtol=1e-4
    )
    # The chosen nodes are exactly the best ones of the reference expansion.
    for r in range(b):
        ref = (
            reference_expand(int(root_state[r]), int(root_tokens[r]), depth, width, topk, num_nodes)
            if n > 1
            else {}
        )
        got = tree_paths(tree, scores, r)
        assert set(got) == set(ref)
        for path, s in ref.items():
            np.testing.assert_allclose(got[path], s, rtol=1e-5, atol=1e-5)
        assert val[r].sum() == 1 + len(ref)


def test_expand_topk_shared_carry_runs_only_the_levels_expanded():
    """A per-row carry threaded through the levels sees each level index once, in order, and
    an early stop ends it at the last level run; the tree is the one the plain step gives."""
    depth, b = 5, 3

    def step(states, tokens, seen, level):
        logp, codes = toy_step(states, tokens)
        return logp, codes, seen.at[:, level].add(1)

    root_state = jnp.arange(b, dtype=jnp.int32)
    root_tokens = jnp.zeros((b,), jnp.int32)
    kw = dict(depth=depth, width=2, topk=2, num_nodes=9)
    plain, _, none = expand_topk(toy_step, root_state, root_tokens, **kw)
    assert none is None
    seen0 = jnp.zeros((b, depth), jnp.int32)
    tree, _, seen = expand_topk(step, root_state, root_tokens, shared=seen0, **kw)
    np.testing.assert_array_equal(np.asarray(tree.tokens), np.asarray(plain.tokens))
    np.testing.assert_array_equal(np.asarray(seen), 1)
    # Every node predicted at log 0.5 against a threshold of log 0.3: the path probability
    # falls below it at depth 2, so the levels stop after level 1 (0 and 1 run).
    stop = (lambda stats: jnp.full(stats.shape[:2], jnp.log(0.5)), jnp.log(0.3), 1)
    _, _, seen = expand_topk(step, root_state, root_tokens, shared=seen0, stop=stop, **kw)
    np.testing.assert_array_equal(np.asarray(seen), np.asarray([[1, 1, 0, 0, 0]] * b))


def test_expand_topk_state_pytree_follows_its_node():
    """A per-slot history in the state (here: the token path so far) is gathered along W with
    its node, so each frontier node's state describes exactly its own path."""
    depth, width, topk = 3, 3, 2

    def step(states, tokens):
        hist, code = states
        new_code = code * (VOCAB + 1) + tokens + 1
        d = jnp.sum(hist >= 0, axis=-1, keepdims=True)  # current length of the history
        slot = jnp.arange(hist.shape[-1])
        hist = jnp.where(slot == d, tokens[..., None], hist)
        # Log-probs depend on the history only: a mismatch between history and code would
        # change the tree compared with the code-driven toy drafter.
        h = jnp.sum(jnp.where(hist >= 0, (hist + 1) * (VOCAB + 1) ** slot, 0), -1)
        return toy_logprobs(h), (hist, new_code)

    b = 2
    hist0 = jnp.full((b, depth + 1), -1, jnp.int32)
    root_tokens = jnp.asarray([2, 3], jnp.int32)
    tree, _, _ = expand_topk(
        step,
        (hist0, jnp.zeros((b,), jnp.int32)),
        root_tokens,
        depth=depth,
        width=width,
        topk=topk,
        num_nodes=10,
    )

    def hist_code(path):
        return sum((x + 1) * (VOCAB + 1) ** i for i, x in enumerate(path))

    # Recompute every valid node's distribution from its own token path: the chosen children
    # must be among the top-k of that distribution.
    tok, par, val = (np.asarray(a) for a in (tree.tokens, tree.parents, tree.valid))
    for r in range(b):
        for i in range(1, 10):
            if not val[r, i]:
                continue
            path = [int(tok[r, j]) for j in python_path(par[r], int(par[r, i]))]
            lp = np.asarray(toy_logprobs(hist_code(path)))
            assert tok[r, i] in np.argsort(-lp)[:topk]
