"""Acceptance rules: greedy against a Python reference, losslessness of every sampled rule by many
vectorised samples (and HSD also by exact enumeration), HSD's gain over token-wise verification,
row independence, and the sampling transform.

The tiny world: a "target" p(x_t | prefix) and a "drafter" q(x_t | prefix) over V = 4 tokens,
random tables indexed by the whole prefix (all prefixes up to length 4), so the exact target joint
of the first L emitted tokens is known by enumeration. Each check draws drafts from q (chains,
i.i.d. trees, or distinct top-k-like children), computes p at the nodes, runs the rule, takes the
emitted sequence (accepted tokens + extra token), extends it by sampling directly from the target
when it is shorter than L, and compares the empirical joint of the first L tokens with the exact
joint. L = K + 1, so the bonus token a rule draws after accepting the whole draft is part of what
is compared (a biased bonus is a negative control below).

Decision rule (fixed seeds, stated up front): a rule passes when the chi-square p-value is > 1e-4
(cells with expected count < 5 pooled) AND the largest absolute cell difference is < 0.005.
Sample size n = 2**18 = 262144: every cell frequency has standard error <= sqrt(0.25 / n) =
0.00098, so the 0.005 bound is > 5 standard errors (chance of a false alarm over 256 cells
~ 1e-4),
while an absolute bias of 0.02 (2%) in any cell is > 20 standard errors and fails both checks
(it alone adds n * 0.02**2 / pi >= 105 to the chi-square statistic, pi <= 1 the cell probability).
"""

from __future__ import annotations

import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.config import SamplingConfig, TreeConfig
from specjax.sampling import apply_sampling, normalize, residual, row_keys, sample
from specjax.tree import Acceptance, DraftTree, chain_tree
from specjax.verify import (
    RULES,
    hsd_levels,
    verify_chain,
    verify_greedy,
    verify_hsd,
)
from specjax.verify.rejection import chain_path, prefix_all

V = 4  # vocabulary of the tiny world
K = 3  # draft depth (chain length, tree depth)
L = K + 1  # compare the joint distribution of the first L emitted tokens (the bonus included)
N_SAMPLES = 2**18
P_VALUE_MIN = 1e-4
MAX_ABS_TOL = 0.005


# ---------------------------------------------------------------------------------------------
# The tiny world: exact tables over all prefixes.
# ---------------------------------------------------------------------------------------------


def _offsets(depth: int) -> list[int]:
    """Start of the block of prefixes of each length in a flat table (length 0 has 1 prefix)."""
    out, start = [], 0
    for ell in range(depth + 2):
        out.append(start)
        start += V**ell
    return out


OFFSETS = _offsets(K + 1)
N_PREFIX = OFFSETS[-1]


def prefix_id(code, length):
    """Flat table row of the prefix with base-V code `code` and static length `length`."""
    return OFFSETS[length] + code


def make_world(seed: int, mix: float = 0.5, sparse: bool = False):
    """(p_table, q_table) [N_PREFIX, V]. q = mix * p + (1 - mix) * noise, so drafts are accepted
    often enough to reach deep levels (where HSD's capping matters). sparse=True zeroes one target
    entry per row and one drafter entry per row (like top-k truncation): exercises p(x) = 0 and
    q(x) = 0 < p(x)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(V), size=N_PREFIX)
    noise = rng.dirichlet(np.ones(V), size=N_PREFIX)
    q = mix * p + (1 - mix) * noise
    if sparse:
        rows = np.arange(N_PREFIX)
        p[rows, rng.integers(0, V, N_PREFIX)] = 0.0
        q[rows, rng.integers(0, V, N_PREFIX)] = 0.0
        p /= p.sum(1, keepdims=True)
        q /= q.sum(1, keepdims=True)
    return jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)


def exact_joint(p_table, length: int = L) -> np.ndarray:
    """Exact target probability of every sequence of `length` tokens, [V**length] (base-V)."""
    pt = np.asarray(p_table, np.float64)
    out = np.zeros(V**length)
    for seq in itertools.product(range(V), repeat=length):
        prob, code = 1.0, 0
        for t, x in enumerate(seq):
            prob *= pt[prefix_id(code, t), x]
            code = code * V + x
        out[code] = prob
    return out


# ---------------------------------------------------------------------------------------------
# Drafts.
# ---------------------------------------------------------------------------------------------


def draft_chain(key, p_table, q_table, n: int):
    """n chains of K tokens drawn from q: (tree [n rows, K + 1 nodes], p [n, K + 1, V], codes)."""
    keys = jax.random.split(key, K)
    code = jnp.zeros((n,), jnp.int32)
    toks, dists, ps = [], [], []
    for t in range(K):
        row = prefix_id(code, t)
        dists.append(q_table[row])
        ps.append(p_table[row])
        x = sample(keys[t], q_table[row])
        toks.append(x)
        code = code * V + x
    row = prefix_id(code, K)
    ps.append(p_table[row])
    dists.append(q_table[row])
    draft = jnp.stack(toks, 1)
    q_dist = jnp.stack(dists, 1)
    q_prob = jnp.take_along_axis(q_dist[:, :K], draft[..., None], -1)[..., 0]
    tree = chain_tree(jnp.zeros((n,), jnp.int32), draft, q_prob, q_dist)
    return tree, jnp.stack(ps, 1)


def draft_tree(key, p_table, q_table, n: int, branching=(2, 2, 1), sampled: bool = True):
    """n trees of the static topology `branching` (depth K). sampled: children i.i.d. from
    q_parent (draft_dist set); otherwise distinct children drawn without replacement from
    q_parent by Gumbel top-k -- a random but target-independent stand-in for top-k expansion
    (the one-hot rule; draft_dist None). Returns (tree, p [n, N, V])."""
    cfg = TreeConfig(branching=branching)
    parents, depths, nn = cfg.parents(), cfg.depths(), cfg.num_nodes
    keys = jax.random.split(key, nn)
    child_rank = {}
    for i in range(1, nn):
        child_rank[i] = sum(1 for j in range(1, i) if parents[j] == parents[i])
    codes = [jnp.zeros((n,), jnp.int32)]
    tokens = [jnp.zeros((n,), jnp.int32)]
    order = {}
    for i in range(1, nn):
        u = parents[i]
        q_u = q_table[prefix_id(codes[u], depths[u])]
        if sampled:
            x = sample(keys[i], q_u)
        else:
            if u not in order:
                g = jax.random.gumbel(keys[u], q_u.shape)
                order[u] = jnp.argsort(-(jnp.log(q_u) + g), axis=-1).astype(jnp.int32)
            x = order[u][:, child_rank[i]]
        tokens.append(x)
        codes.append(codes[u] * V + x)
    rows = [prefix_id(codes[i], depths[i]) for i in range(nn)]
    p_nodes = jnp.stack([p_table[r] for r in rows], 1)
    q_nodes = jnp.stack([q_table[r] for r in rows], 1)
    tok = jnp.stack(tokens, 1)
    par = np.asarray(parents)
    q_of_token = jnp.take_along_axis(q_nodes[:, par[1:]], tok[:, 1:, None], -1)[..., 0]
    tree = DraftTree(
        tokens=tok,
        parents=jnp.broadcast_to(jnp.asarray(par, jnp.int32), (n, nn)),
        depth=jnp.broadcast_to(jnp.asarray(depths, jnp.int32), (n, nn)),
        valid=jnp.ones((n, nn), bool),
        draft_prob=jnp.concatenate([jnp.ones((n, 1)), q_of_token], axis=1),
        draft_dist=q_nodes if sampled else None,
    )
    return tree, p_nodes


def make_ragged(key, tree: DraftTree, keep_prob=0.8) -> DraftTree:
    """Invalidate random nodes (and, as the DraftTree contract requires, their descendants),
    independently of everything else: rows draft fewer tokens, chains end early."""
    n, nn = tree.tokens.shape
    keep = jax.random.bernoulli(key, keep_prob, (n, nn)).at[:, 0].set(True)
    valid = keep
    for _ in range(K):  # propagate invalidity down K levels
        valid = keep & jnp.take_along_axis(valid, jnp.maximum(tree.parents, 0), axis=1)
    return tree.replace(valid=valid)


def emitted_codes(acc: Acceptance, tokens, key, p_table, length: int = L):
    """Base-V code of the first `length` emitted tokens (accepted path, extra token, then the
    target itself when the emitted sequence is shorter). Shapes: tokens [n, N] -> [n]."""
    n, pp = acc.path.shape
    path_tok = jnp.take_along_axis(tokens, acc.path, axis=1)  # [n, P]; slot 0 is the root
    keys = jax.random.split(key, length)
    code = jnp.zeros((n,), jnp.int32)
    for i in range(length):
        drafted = path_tok[:, i + 1] if i + 1 < pp else jnp.zeros((n,), jnp.int32)
        direct = sample(keys[i], p_table[prefix_id(code, i)])
        tok = jnp.where(
            i < acc.n_accepted, drafted, jnp.where(i == acc.n_accepted, acc.next_token, direct)
        )
        code = code * V + tok
    return code


def lossless_stats(codes, p_table, length: int = L) -> tuple[float, float]:
    """(chi-square p-value, max |empirical - exact| over cells) for the first `length` tokens."""
    counts = np.bincount(np.asarray(codes), minlength=V**length).astype(np.float64)
    exact = exact_joint(p_table, length)
    n = counts.sum()
    max_abs = float(np.abs(counts / n - exact).max())
    if np.any(counts[exact == 0] > 0):  # an impossible sequence was emitted
        return 0.0, max_abs
    expected = n * exact
    small = (expected < 5) & (exact > 0)
    big = expected >= 5
    obs = np.concatenate([counts[big], [counts[small].sum()]]) if small.any() else counts[big]
    exp = np.concatenate([expected[big], [expected[small].sum()]]) if small.any() else expected[big]
    stat = float(np.sum((obs - exp) ** 2 / exp))
    df = len(obs) - 1
    p_value = float(jax.scipy.special.gammaincc(df / 2.0, stat / 2.0))
    return p_value, max_abs


def passes(p_value: float, max_abs: float) -> bool:
    return p_value > P_VALUE_MIN and max_abs < MAX_ABS_TOL


# ---------------------------------------------------------------------------------------------
# Simulation: many rows at once, one jitted call per configuration.
# ---------------------------------------------------------------------------------------------


def biased_chain(tree: DraftTree, p, key, max_depth: int) -> Acceptance:
    """Deliberately wrong: accepts with min(1, p/q) but resamples from p instead of the residual
    norm(max(p - q, 0)) after a rejection. Used to show the check has teeth."""
    b = tree.tokens.shape[0]
    k = min(tree.num_nodes - 1, max_depth)
    keys = row_keys(key, b)
    split = jax.vmap(lambda kk: jax.random.split(kk, 2))(keys)
    u = jax.vmap(lambda kk: jax.random.uniform(kk, (k,)))(split[:, 0])
    x = tree.tokens[:, 1 : k + 1]
    px = jnp.take_along_axis(p[:, :k], x[..., None], -1)[..., 0]
    qx = jnp.take_along_axis(tree.draft_dist[:, :k], x[..., None], -1)[..., 0]
    ok = tree.valid[:, 1 : k + 1] & (u * qx < px)
    n_acc = jnp.sum(prefix_all(ok), axis=1)
    dist = jnp.take_along_axis(p, n_acc[:, None, None], axis=1)[:, 0]
    nxt = jax.vmap(sample)(split[:, 1], dist)
    return Acceptance(path=chain_path(n_acc, max_depth), n_accepted=n_acc, next_token=nxt)


def biased_bonus_chain(tree: DraftTree, p, key, max_depth: int) -> Acceptance:
    """Deliberately wrong only after a fully accepted draft: the bonus token is drawn from the
    drafter's distribution at the deepest node instead of the target's. A check that observes
    fewer than K + 1 emitted tokens never sees that token."""
    acc = verify_chain(tree, p, key, max_depth)
    bonus_keys = jax.vmap(lambda kk: jax.random.fold_in(kk, 7))(key)
    wrong = jax.vmap(sample)(bonus_keys, tree.draft_dist[:, max_depth])
    full = acc.n_accepted == max_depth
    return acc.replace(next_token=jnp.where(full, wrong, acc.next_token))


DRAFT_KIND = {
    "chain": "chain",
    "hsd": "chain",
    "biased": "chain",
    "biased_bonus": "chain",
    "tree_sampled": "tree_sampled",
    "tree_onehot": "tree_onehot",
}
RULE_FN = dict(RULES, biased=biased_chain, biased_bonus=biased_bonus_chain)


def _simulate_impl(key, p_table, q_table, keep_prob, *, rule: str, n: int):
    k_draft, k_ragged, k_verify, k_extend = jax.random.split(key, 4)
    kind = DRAFT_KIND[rule]
    if kind == "chain":
        tree, p_nodes = draft_chain(k_draft, p_table, q_table, n)
    else:
        tree, p_nodes = draft_tree(k_draft, p_table, q_table, n, sampled=kind == "tree_sampled")
    # keep_prob is traced, so the full (1.0) and ragged variants share one compilation.
    tree = make_ragged(k_ragged, tree, keep_prob)
    acc = RULE_FN[rule](tree, p_nodes, jax.random.split(k_verify, n), K)
    return emitted_codes(acc, tree.tokens, k_extend, p_table), acc.n_accepted


_simulate_jit = jax.jit(_simulate_impl, static_argnames=("rule", "n"))


@functools.cache
def simulate(
    rule: str,
    world_seed: int,
    sparse: bool = False,
    ragged: bool = False,
    seed: int = 0,
    n: int = N_SAMPLES,
):
    """Run `rule` on n independent drafts of the tiny world; returns numpy (codes [n] of the
    first L emitted tokens, n_accepted [n]). Rules drafting the same kind of tree with the same
    seed see the same drafts (the chain rules and HSD are compared on identical chains)."""
    p_table, q_table = make_world(world_seed, sparse=sparse)
    keep_prob = jnp.float32(0.8 if ragged else 1.0)
    codes, n_acc = _simulate_jit(jax.random.key(seed), p_table, q_table, keep_prob, rule=rule, n=n)
    return np.asarray(codes), np.asarray(n_acc)


# ---------------------------------------------------------------------------------------------
# Losslessness by sampling.
# ---------------------------------------------------------------------------------------------

SAMPLED_RULES = ["chain", "tree_onehot", "tree_sampled", "hsd"]


@pytest.mark.parametrize("rule", SAMPLED_RULES)
@pytest.mark.parametrize("sparse_ragged", [False, True], ids=["dense", "sparse_ragged"])
def test_lossless_by_sampling(rule, sparse_ragged):
    codes, n_acc = simulate(rule, world_seed=1, sparse=sparse_ragged, ragged=sparse_ragged)
    p_table, _ = make_world(1, sparse=sparse_ragged)
    p_value, max_abs = lossless_stats(codes, p_table)
    assert passes(p_value, max_abs), (rule, p_value, max_abs)
    # The rule really speculates: some rows accept drafts, some reach the full depth.
    assert n_acc.mean() > 0.5 and (n_acc == K).any()


def test_biased_rule_fails_the_check():
    codes, _ = simulate("biased", world_seed=1)
    p_table, _ = make_world(1)
    p_value, max_abs = lossless_stats(codes, p_table)
    assert not passes(p_value, max_abs)
    assert p_value < 1e-12 and max_abs > MAX_ABS_TOL  # rejected by both criteria, not marginally


def test_biased_bonus_token_fails_the_check():
    """A rule that is right except for the bonus token after a fully accepted draft fails."""
    codes, n_acc = simulate("biased_bonus", world_seed=1)
    p_table, _ = make_world(1)
    p_value, max_abs = lossless_stats(codes, p_table)
    assert (n_acc == K).mean() > 0.1  # the wrong token is drawn in many rows
    assert p_value < 1e-12, (p_value, max_abs)


# ---------------------------------------------------------------------------------------------
# HSD: exact enumeration over all drafts, expected accepted length.
# ---------------------------------------------------------------------------------------------


def all_chain_drafts(p_table, q_table):
    """Every chain of K tokens as one batch: (tree, p [V**K, K + 1, V], Q(x) [V**K] numpy)."""
    drafts = np.array(list(itertools.product(range(V), repeat=K)), np.int32)
    m = len(drafts)
    code = np.zeros(m, np.int64)
    ps, qs, qx = [], [], np.ones(m)
    pt, qt = np.asarray(p_table), np.asarray(q_table)
    for t in range(K + 1):
        row = OFFSETS[t] + code
        ps.append(pt[row])
        qs.append(qt[row])
        if t < K:
            qx *= qt[row, drafts[:, t]]
            code = code * V + drafts[:, t]
    q_dist = jnp.asarray(np.stack(qs, 1))
    q_prob = jnp.asarray(np.stack([qs[t][np.arange(m), drafts[:, t]] for t in range(K)], 1))
    tree = chain_tree(jnp.zeros((m,), jnp.int32), jnp.asarray(drafts), q_prob, q_dist)
    return tree, jnp.asarray(np.stack(ps, 1)), drafts, qx


def _add_with_target(out, pt, prefix, mass, length):
    """out[code] += mass * target probability of each completion of `prefix` to `length`."""
    for ext in itertools.product(range(V), repeat=length - len(prefix)):
        prob, code = mass, 0
        for t, x in enumerate(tuple(prefix) + ext):
            if t >= len(prefix):
                prob *= pt[OFFSETS[t] + code, x]
            code = code * V + x
        out[code] += prob


def hsd_exact(p_table, q_table, capped: bool = True):
    """Exact output distribution of the first K + 1 emitted tokens of HSD (via hsd_levels), and
    its expected accepted length. capped=False swaps in the authors' uncapped whole-draft
    acceptance min(1, P_k / Q_k) (a negative control)."""
    tree, p_nodes, drafts, qx = all_chain_drafts(p_table, q_table)
    lv = jax.tree.map(np.asarray, hsd_levels(tree, p_nodes, K))
    pt = np.asarray(p_table, np.float64)
    pn = np.asarray(p_nodes, np.float64)
    out = np.zeros(V ** (K + 1))
    mean_len = 0.0
    for m, x in enumerate(drafts):
        if capped:
            a = float(lv.accept_prob[m])
        else:
            ratio = np.prod(
                [pn[m, t, x[t]] / np.asarray(tree.draft_dist)[m, t, x[t]] for t in range(K)]
            )
            a = min(1.0, ratio)
        for y in range(V):
            _add_with_target(out, pt, tuple(x) + (y,), qx[m] * a * pn[m, K, y], K + 1)
        mean_len += qx[m] * a * K
        s = lv.step_back[m].astype(np.float64)
        for t in range(1, K + 1):
            w = qx[m] * (1 - a) * (1 - s[t - 1]) * np.prod(s[t:])
            mean_len += w * (t - 1)
            for y in range(V):
                _add_with_target(
                    out, pt, tuple(x[: t - 1]) + (y,), w * lv.residual[m, t - 1, y], K + 1
                )
    return out, mean_len


def chain_expected_length(p_table, q_table) -> float:
    """Exact expected number of accepted drafts of token-wise speculative sampling."""
    tree, p_nodes, drafts, qx = all_chain_drafts(p_table, q_table)
    pn, qd = np.asarray(p_nodes), np.asarray(tree.draft_dist)
    m = np.arange(len(drafts))[:, None]
    rho = pn[m, np.arange(K), drafts] / qd[m, np.arange(K), drafts]
    return float(np.sum(qx * np.cumprod(np.minimum(rho, 1.0), axis=1).sum(1)))


@pytest.mark.parametrize("world_seed", [1, 2, 3])
def test_hsd_exact_enumeration(world_seed):
    p_table, q_table = make_world(world_seed)
    exact = exact_joint(p_table, K + 1)
    out, _ = hsd_exact(p_table, q_table)
    np.testing.assert_allclose(out.sum(), 1.0, atol=1e-5)
    np.testing.assert_allclose(out, exact, atol=2e-6)
    # Negative control: the authors' uncapped whole-draft acceptance is biased.
    out_uncapped, _ = hsd_exact(p_table, q_table, capped=False)
    assert np.abs(out_uncapped - exact).max() > 1e-3


def test_hsd_exact_enumeration_sparse():
    """p(x) = 0 for some drafted tokens (log ratio -inf) and q(x) = 0 < p(x) for others."""
    p_table, q_table = make_world(4, sparse=True)
    out, _ = hsd_exact(p_table, q_table)
    np.testing.assert_allclose(out, exact_joint(p_table, K + 1), atol=2e-6)


@pytest.mark.parametrize("world_seed", [1, 2, 3])
def test_hsd_accepts_more_than_tokenwise_exact(world_seed):
    p_table, q_table = make_world(world_seed)
    _, hsd_len = hsd_exact(p_table, q_table)
    assert hsd_len > chain_expected_length(p_table, q_table) + 1e-3


def test_hsd_accepts_more_than_tokenwise_sampled():
    """Same drafts for both rules (same seed): the empirical means match the exact expectations
    within 5 standard errors and HSD's mean is larger by more than 5 standard errors."""
    p_table, q_table = make_world(1)
    _, n_hsd = simulate("hsd", world_seed=1)
    _, n_chain = simulate("chain", world_seed=1)
    _, hsd_len = hsd_exact(p_table, q_table)
    chain_len = chain_expected_length(p_table, q_table)
    se = np.sqrt(n_hsd.var() / n_hsd.size), np.sqrt(n_chain.var() / n_chain.size)
    assert abs(n_hsd.mean() - hsd_len) < 5 * se[0]
    assert abs(n_chain.mean() - chain_len) < 5 * se[1]
    diff = (n_hsd - n_chain).astype(np.float64)  # paired: same drafts
    assert diff.mean() > 5 * np.sqrt(diff.var() / diff.size)


@functools.partial(jax.jit, static_argnames=("n",))
def _identical_models(key, p_table, *, n: int):
    tree, p_nodes = draft_chain(key, p_table, p_table, n)
    keys = jax.random.split(jax.random.fold_in(key, 1), n)
    return verify_hsd(tree, p_nodes, keys, K).n_accepted, verify_chain(
        tree, p_nodes, keys, K
    ).n_accepted


def test_hsd_identical_models_accept_everything():
    """p == q: the whole draft is accepted with probability 1 (no rounding-level rejections)."""
    p_table, _ = make_world(5)
    n_hsd, n_chain = _identical_models(jax.random.key(0), p_table, n=4096)
    assert np.all(np.asarray(n_hsd) == K) and np.all(np.asarray(n_chain) == K)


@jax.jit
def _long_chain(key):
    b, k, v = 8, 64, 16
    kp, kq, kx, kv = jax.random.split(key, 4)
    p = jax.nn.softmax(3 * jax.random.normal(kp, (b, k + 1, v)), -1)
    q = jax.nn.softmax(3 * jax.random.normal(kq, (b, k + 1, v)), -1)
    x = jax.random.categorical(kx, jnp.log(q[:, :k])).astype(jnp.int32)
    tree = chain_tree(
        jnp.zeros((b,), jnp.int32), x, jnp.take_along_axis(q[:, :k], x[..., None], -1)[..., 0], q
    )
    return hsd_levels(tree, p, k), verify_hsd(tree, p, jax.random.split(kv, b), k)


def test_hsd_long_chain_no_underflow():
    """A 64-token chain whose prefix products (~1e-60) underflow float32 still gives finite,
    valid quantities: everything is computed in log space."""
    lv, acc = jax.tree.map(np.asarray, _long_chain(jax.random.key(7)))
    for leaf in jax.tree.leaves(lv):
        assert np.all(np.isfinite(leaf))
    np.testing.assert_allclose(lv.residual.sum(-1), 1.0, atol=1e-5)
    assert np.all((lv.step_back >= 0) & (lv.step_back <= 1))
    assert np.all((acc.n_accepted >= 0) & (acc.n_accepted <= 64))


# ---------------------------------------------------------------------------------------------
# Row independence and keys.
# ---------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("rule", "n"))
def _batch_for(rule: str, key, n: int):
    """A ragged batch of n drafts of the kind `rule` verifies, with target probabilities."""
    p_table, q_table = make_world(6)
    kind = DRAFT_KIND.get(rule, "tree_sampled")
    if kind == "chain":
        tree, p_nodes = draft_chain(key, p_table, q_table, n)
    else:
        tree, p_nodes = draft_tree(key, p_table, q_table, n, sampled=kind != "tree_onehot")
    return make_ragged(jax.random.fold_in(key, 1), tree), p_nodes


@functools.partial(jax.jit, static_argnames=("rule",))
def _call(rule, tree, p, keys):
    return RULES[rule](tree, p, keys, K)


@pytest.mark.parametrize("rule", ["greedy", *SAMPLED_RULES])
def test_row_independence(rule):
    n = 16
    tree1, p1 = _batch_for(rule, jax.random.key(10), n)
    tree2, p2 = _batch_for(rule, jax.random.key(11), n)
    keys1 = jax.random.split(jax.random.key(12), n)
    keys2 = jax.random.split(jax.random.key(13), n)
    keep = np.zeros(n, bool)
    keep[[0, 3, 7, 15]] = True

    def mix(a, b):
        shape = (n,) + (1,) * (a.ndim - 1)
        return jnp.where(jnp.asarray(keep).reshape(shape), a, b)

    tree_mixed = jax.tree.map(mix, tree1, tree2)
    keys_mixed = jax.random.wrap_key_data(
        mix(jax.random.key_data(keys1), jax.random.key_data(keys2))
    )
    out1 = jax.tree.map(np.asarray, _call(rule, tree1, p1, keys1))
    out_mixed = jax.tree.map(np.asarray, _call(rule, tree_mixed, mix(p1, p2), keys_mixed))
    for a, b in zip(jax.tree.leaves(out1), jax.tree.leaves(out_mixed), strict=True):
        np.testing.assert_array_equal(a[keep], b[keep])
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(out1), jax.tree.leaves(out_mixed), strict=True)
    )


@pytest.mark.parametrize("rule", ["chain", "tree_sampled"])  # both key-handling code paths
def test_raw_and_typed_keys_agree(rule):
    n = 16
    tree, p = _batch_for(rule, jax.random.key(20), n)
    raw = jax.random.split(jax.random.PRNGKey(3), n)  # uint32 [n, 2]
    a = _call(rule, tree, p, raw)
    b = _call(rule, tree, p, jax.random.wrap_key_data(raw))
    chex.assert_trees_all_equal(a, b)
    chex.assert_shape(a.path, (n, K + 1))
    chex.assert_shape([a.n_accepted, a.next_token], (n,))
    assert a.path.dtype == a.n_accepted.dtype == a.next_token.dtype == jnp.int32


@pytest.mark.parametrize("rule", ["greedy", *SAMPLED_RULES])
def test_acceptance_is_a_valid_path(rule):
    """path[0] = 0, then valid nodes each the child of the previous one, zeros after
    n_accepted; the extra token is a real token."""
    n = 16
    tree, p = _batch_for(rule, jax.random.key(30), n)
    acc = jax.tree.map(np.asarray, _call(rule, tree, p, jax.random.split(jax.random.key(1), n)))
    par, valid = np.asarray(tree.parents), np.asarray(tree.valid)
    slot = np.arange(K + 1)[None, :]
    inside = slot <= acc.n_accepted[:, None]
    assert np.all(acc.path[:, 0] == 0) and np.all(acc.path[~inside] == 0)
    rows = np.arange(n)[:, None]
    step = inside[:, 1:]
    assert np.all(valid[rows, acc.path][:, 1:][step])
    assert np.all((par[rows, acc.path[:, 1:]] == acc.path[:, :-1])[step])
    assert np.all((acc.next_token >= 0) & (acc.next_token < V))


# ---------------------------------------------------------------------------------------------
# Greedy against a straightforward Python reference.
# ---------------------------------------------------------------------------------------------


def random_trees(rng, b: int, nn: int, v: int):
    parents = np.full((b, nn), -1, np.int32)
    depth = np.zeros((b, nn), np.int32)
    for i in range(1, nn):
        parents[:, i] = rng.integers(0, i, b)
        depth[:, i] = depth[np.arange(b), parents[:, i]] + 1
    valid = rng.random((b, nn)) > 0.15
    valid[:, 0] = True
    for i in range(1, nn):
        valid[:, i] &= valid[np.arange(b), parents[:, i]]
    logits = rng.normal(size=(b, nn, v)).astype(np.float32)
    target = logits.argmax(-1)
    tokens = rng.integers(0, v, (b, nn)).astype(np.int32)
    hit = rng.random((b, nn)) < 0.6  # make matches (and duplicate matching siblings) common
    tokens = np.where(hit, np.take_along_axis(target, np.maximum(parents, 0), 1), tokens)
    tree = DraftTree(
        tokens=jnp.asarray(tokens),
        parents=jnp.asarray(parents),
        depth=jnp.asarray(depth),
        valid=jnp.asarray(valid),
        draft_prob=jnp.ones((b, nn), jnp.float32),
    )
    return tree, logits


def greedy_reference(tree: DraftTree, logits):
    tokens, parents, depth, valid = (
        np.asarray(a) for a in (tree.tokens, tree.parents, tree.depth, tree.valid)
    )
    out = []
    for b in range(tokens.shape[0]):
        target = logits[b].argmax(-1)
        accepted = [True]
        for i in range(1, tokens.shape[1]):
            u = parents[b, i]
            accepted.append(bool(valid[b, i] and accepted[u] and tokens[b, i] == target[u]))
        best = 0
        for i in range(tokens.shape[1]):  # deepest, lowest index among equals
            if accepted[i] and depth[b, i] > depth[b, best]:
                best = i
        path = [best]
        while path[-1] != 0:
            path.append(parents[b, path[-1]])
        out.append((path[::-1], int(depth[b, best]), int(target[best])))
    return out


@pytest.mark.parametrize("nn,v", [(12, 3), (30, 2), (1, 5)])
def test_greedy_matches_reference(nn, v):
    rng = np.random.default_rng(nn)
    tree, logits = random_trees(rng, 256, nn, v)
    max_depth = int(np.asarray(tree.depth).max())
    acc = jax.jit(verify_greedy, static_argnums=3)(tree, jnp.asarray(logits), None, max_depth)
    acc = jax.tree.map(np.asarray, acc)
    for b, (path, n_acc, nxt) in enumerate(greedy_reference(tree, logits)):
        assert acc.n_accepted[b] == n_acc
        assert acc.next_token[b] == nxt
        np.testing.assert_array_equal(acc.path[b], path + [0] * (max_depth + 1 - len(path)))
    # Probabilities (one-hot after the greedy transform) give the same answer as logits.
    probs = apply_sampling(jnp.asarray(logits), SamplingConfig(temperature=0.0))
    chex.assert_trees_all_equal(
        verify_greedy(tree, probs, None, max_depth),
        verify_greedy(tree, jnp.asarray(logits), None, max_depth),
    )


def test_greedy_chain_equals_target_greedy_decoding():
    """Chain of the target's own greedy tokens: everything accepted, bonus = next greedy token."""
    p_table, _ = make_world(8)
    pt = np.asarray(p_table)
    code, toks = 0, []
    for t in range(K + 1):
        toks.append(int(pt[OFFSETS[t] + code].argmax()))
        code = code * V + toks[-1]
    tree, p_nodes = draft_chain(jax.random.key(0), p_table, p_table, 1)
    tree = tree.replace(tokens=jnp.asarray([[0] + toks[:K]], jnp.int32))
    rows = [OFFSETS[t] + int(np.dot(toks[:t], V ** np.arange(t)[::-1])) for t in range(K + 1)]
    acc = verify_greedy(tree, p_table[jnp.asarray(rows)][None], None, K)
    assert int(acc.n_accepted[0]) == K and int(acc.next_token[0]) == toks[K]


# ---------------------------------------------------------------------------------------------
# Sampling transform and helpers.
# ---------------------------------------------------------------------------------------------


def test_apply_sampling():
    logits = jax.random.normal(jax.random.key(0), (3, 5, 50)) * 3
    greedy = apply_sampling(logits, SamplingConfig(temperature=0.0))
    np.testing.assert_array_equal(np.asarray(greedy).argmax(-1), np.asarray(logits).argmax(-1))
    assert np.all(np.asarray(greedy).sum(-1) == 1) and np.all(np.asarray(greedy).max(-1) == 1)

    t = apply_sampling(logits, SamplingConfig(temperature=0.7))
    np.testing.assert_allclose(t, jax.nn.softmax(logits / 0.7, -1), rtol=1e-5, atol=1e-7)

    k = apply_sampling(logits, SamplingConfig(temperature=1.0, top_k=7))
    assert np.all((np.asarray(k) > 0).sum(-1) == 7)
    top = np.argsort(-np.asarray(logits), -1)[..., :7]
    ref = np.take_along_axis(np.asarray(jax.nn.softmax(logits, -1)), top, -1)
    np.testing.assert_allclose(
        np.take_along_axis(np.asarray(k), top, -1), ref / ref.sum(-1, keepdims=True), rtol=1e-5
    )

    for top_p in (0.3, 0.9):
        pp = np.asarray(apply_sampling(logits, SamplingConfig(temperature=1.0, top_p=top_p)))
        full = np.asarray(jax.nn.softmax(logits, -1))
        srt = -np.sort(-full, -1)
        n_keep = (np.cumsum(srt, -1) - srt < top_p).sum(-1)  # smallest prefix reaching top_p
        assert np.all((pp > 0).sum(-1) == n_keep)
        np.testing.assert_allclose(pp.sum(-1), 1.0, rtol=1e-5)
        kept = pp > 0
        np.testing.assert_allclose(
            pp[kept], (full / np.where(kept, full, 0).sum(-1, keepdims=True))[kept], rtol=1e-4
        )


def test_normalize_residual_and_sample():
    x = jnp.asarray([[0.0, 0.0, 0.0], [1.0, 3.0, 0.0]])
    np.testing.assert_allclose(normalize(x), [[1 / 3] * 3, [0.25, 0.75, 0.0]])
    np.testing.assert_allclose(
        normalize(x, fallback=jnp.asarray([0.0, 2.0, 2.0])), [[0.0, 0.5, 0.5], [0.25, 0.75, 0.0]]
    )
    p = jnp.asarray([0.5, 0.3, 0.2])
    np.testing.assert_allclose(residual(p, p), p)  # p == q: falls back to p, no NaN
    np.testing.assert_allclose(residual(p, jnp.asarray([0.2, 0.3, 0.5])), [1.0, 0.0, 0.0])
    draws = sample(
        jax.random.key(0), jnp.broadcast_to(jnp.asarray([0.0, 0.5, 0.0, 0.5]), (10000, 4))
    )
    assert set(np.unique(np.asarray(draws))) == {1, 3}


def test_row_keys():
    assert row_keys(jax.random.key(0), 5).shape == (5,)
    assert row_keys(jax.random.PRNGKey(0), 5).shape == (5, 2)
    ks = jax.random.split(jax.random.key(0), 5)
    assert row_keys(ks, 5) is ks
