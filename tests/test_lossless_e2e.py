"""Sampling losslessness of the whole speculative path (drafter + tree + rule + KV commit).

A tiny random target with an 8-token vocabulary is drafted by an unrelated tiny random model (so
drafts are accepted often but far from always). The empirical
joint distribution of the first three generated tokens over many independent rows is compared
with the exact target distribution, computed by enumerating all 8^3 continuations.

Sample size and significance: 120,000 rows. A cell with probability p has standard error
sqrt(p (1 - p) / n) <= 0.0015, so a 2% absolute bias in any cell is > 13 standard errors; the test
fails if any cell deviates by more than 0.01 (6.9 standard errors at worst, so a correct rule fails
with probability < 1e-9 per cell) or if a chi-square test over cells with expected count >= 5
(the rest pooled) rejects at p < 1e-4. Seeds are fixed, so the result is deterministic.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import specjax
from specjax.config import ModelConfig, SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters.lm import LMDrafter
from specjax.sampling import apply_sampling

scipy_stats = pytest.importorskip("scipy.stats")

V = 8
CFG = ModelConfig(
    vocab_size=V,
    d_model=32,
    n_layers=3,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    ffn_dim=64,
    max_seq_len=64,
    tie_embeddings=False,
)
PROMPT = [1, 5, 2]
N_ROWS = 120_000
MAX_CELL_DEV = 0.01
CHI2_ALPHA = 1e-4


def sharpened(cfg, seed, scale):
    """A random model whose next-token distributions are far from uniform."""
    model = specjax.Llama(cfg, rngs=nnx.Rngs(seed))
    model.lm_head.set_value(model.lm_head[...] * scale)
    return model


@pytest.fixture(scope="module")
def target():
    return sharpened(CFG, 3, 3.0)


@pytest.fixture(scope="module")
def drafter():
    draft_cfg = ModelConfig(**{**CFG.__dict__, "n_layers": 1})
    return LMDrafter(sharpened(draft_cfg, 11, 2.0))


def exact_joint(target, sampling: SamplingConfig) -> np.ndarray:
    """P(x1, x2, x3 | PROMPT) after the sampling transform, shape [V, V, V], by enumeration."""
    from specjax.cache import init_cache
    from specjax.tree import causal_mask

    seqs = np.array([PROMPT + [a, b, c] for a in range(V) for b in range(V) for c in range(V)])
    t = seqs.shape[1]
    logits = target(
        jnp.asarray(seqs),
        positions=jnp.broadcast_to(jnp.arange(t), seqs.shape),
        cache=init_cache(CFG, len(seqs), t),
        tree_mask=causal_mask(len(seqs), t),
    ).logits
    probs = np.asarray(apply_sampling(logits, sampling))  # [V^3, T, V]
    k = len(PROMPT)
    joint = np.ones(len(seqs))
    for i in range(3):
        joint *= probs[np.arange(len(seqs)), k - 1 + i, seqs[:, k + i]]
    return joint.reshape(V, V, V)


def empirical_joint(tokens: np.ndarray) -> np.ndarray:
    idx = tokens[:, 0] * V * V + tokens[:, 1] * V + tokens[:, 2]
    return np.bincount(idx, minlength=V**3).reshape(V, V, V) / len(tokens)


def distribution_mismatch(emp: np.ndarray, exact: np.ndarray, n: int) -> str | None:
    """None if emp is consistent with exact, else a description of the failure."""
    dev = float(np.max(np.abs(emp - exact)))
    if dev > MAX_CELL_DEV:
        return f"max cell deviation {dev:.4f} > {MAX_CELL_DEV}"
    exp_counts, obs_counts = exact.ravel() * n, emp.ravel() * n
    big = exp_counts >= 5
    exp_c = np.append(exp_counts[big], exp_counts[~big].sum())
    obs_c = np.append(obs_counts[big], obs_counts[~big].sum())
    keep = exp_c > 0
    pvalue = scipy_stats.chisquare(
        obs_c[keep], exp_c[keep] * obs_c[keep].sum() / exp_c[keep].sum()
    ).pvalue
    if pvalue < CHI2_ALPHA:
        return f"chi-square p-value {pvalue:.2e} < {CHI2_ALPHA}"
    return None


def run_rows(target, drafter, config, sampling, seed=0):
    keys = jax.random.split(jax.random.key(seed), N_ROWS)
    out = specjax.speculative_generate(
        target,
        drafter,
        [PROMPT] * N_ROWS,
        max_new_tokens=3,
        config=config,
        sampling=sampling,
        key=keys,
    )
    assert (np.asarray(out.lengths) == 3).all()
    return np.asarray(out.tokens), out.stats


# Depth-2 drafts: three tokens need one step when everything is accepted and two or three steps
# otherwise, so the KV commit and the drafter's state after a rejection are exercised too.
CASES = {
    "chain": (TreeConfig.chain(2), SamplingConfig(temperature=1.0)),
    "hsd": (TreeConfig.chain(2), SamplingConfig(temperature=1.0)),
    "tree_onehot": (TreeConfig(branching=(2, 1)), SamplingConfig(temperature=1.0)),
    "tree_sampled": (TreeConfig(branching=(3, 1)), SamplingConfig(temperature=1.0)),
}


# The default run keeps the chain rule end to end (each rule alone is checked exactly in
# test_verify.py, and the one-hot tree rule end to end with the feature drafters); the other
# rules' end-to-end runs are under `slow`.
@pytest.mark.parametrize(
    "rule", ["chain"] + [pytest.param(r, marks=pytest.mark.slow) for r in CASES if r != "chain"]
)
def test_speculative_sampling_matches_target_distribution(target, drafter, rule, optimized_loop):
    tree, sampling = CASES[rule]
    tokens, stats = run_rows(target, drafter, SpecConfig(tree=tree, rule=rule), sampling)
    problem = distribution_mismatch(empirical_joint(tokens), exact_joint(target, sampling), N_ROWS)
    assert problem is None, problem
    # The test is only meaningful if drafts are sometimes accepted and sometimes rejected.
    hist = np.asarray(stats["accepted_hist"]).sum(0)
    assert hist[1:].sum() > 0.05 * hist.sum() and hist[:-1].sum() > 0.05 * hist.sum(), hist


def test_fallback_to_plain_steps_keeps_the_target_distribution(target, drafter, optimized_loop):
    """SpecConfig.fallback_tau: one speculative step (a one-hot tree), then plain decoding steps
    in the same loop for the rest: the joint distribution is still the target's."""
    config = SpecConfig(tree=TreeConfig(branching=(2, 1)), fallback_tau=10.0, fallback_after=1)
    tokens, stats = run_rows(target, drafter, config, SamplingConfig(temperature=1.0), seed=2)
    exact = exact_joint(target, SamplingConfig(temperature=1.0))
    problem = distribution_mismatch(empirical_joint(tokens), exact, N_ROWS)
    assert problem is None, problem
    calls, plain = np.asarray(stats["target_calls"]), np.asarray(stats["plain_steps"])
    np.testing.assert_array_equal(calls - plain, 1)  # the first step alone speculated
    # Both kinds of step emitted tokens: some rows needed plain steps, some finished in one.
    assert 0.05 < (plain > 0).mean() < 0.95, (plain > 0).mean()


@pytest.mark.slow
def test_sampling_transform_is_applied_to_both_sides(target, drafter):
    sampling = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)
    tokens, _ = run_rows(
        target,
        drafter,
        SpecConfig(tree=TreeConfig(branching=(2, 2)), rule="tree_sampled"),
        sampling,
        seed=1,
    )
    problem = distribution_mismatch(empirical_joint(tokens), exact_joint(target, sampling), N_ROWS)
    assert problem is None, problem


def test_check_catches_a_biased_distribution(target):
    """The same check rejects samples from a distribution with one 2% shift between two cells."""
    sampling = SamplingConfig(temperature=1.0)
    exact = exact_joint(target, sampling)
    biased = exact.ravel().astype(np.float64)
    biased /= biased.sum()
    hi, lo = np.argsort(biased)[-1], np.argsort(biased)[-2]
    biased[hi] -= 0.02
    biased[lo] += 0.02
    rng = np.random.default_rng(0)
    draws = rng.choice(V**3, size=N_ROWS, p=biased)
    tokens = np.stack([draws // (V * V), (draws // V) % V, draws % V], axis=1)
    assert distribution_mismatch(empirical_joint(tokens), exact, N_ROWS) is not None


def biased_chain_rule(tree, p, key, max_depth):
    """Token-wise acceptance min(1, p/q), but the correction is drawn from p instead of the
    residual norm(max(p - q, 0)): the classic mistake, which over-weights the drafter's tokens."""
    from specjax.tree import Acceptance

    n = tree.tokens.shape[1]
    p_x = jnp.take_along_axis(p[:, :-1], tree.tokens[:, 1:, None], axis=-1)[..., 0]
    u = jax.vmap(lambda k: jax.random.uniform(k, (n - 1,)))(key)
    ok = u < p_x / tree.draft_prob[:, 1:]
    n_acc = jnp.argmin(jnp.concatenate([ok, jnp.zeros_like(ok[:, :1])], axis=1), axis=1)
    p_last = jnp.take_along_axis(p, n_acc[:, None, None], axis=1)[:, 0]
    nxt = jax.vmap(lambda k, q: jax.random.categorical(jax.random.fold_in(k, 1), jnp.log(q)))(
        key, p_last
    )
    slots = jnp.arange(max_depth + 1)[None, :]
    path = jnp.where(slots <= n_acc[:, None], slots, 0).astype(jnp.int32)
    return Acceptance(
        path=path, n_accepted=n_acc.astype(jnp.int32), next_token=nxt.astype(jnp.int32)
    )


@pytest.mark.slow
def test_end_to_end_check_catches_a_biased_rule(target, drafter, monkeypatch):
    from specjax import speculative, verify

    monkeypatch.setitem(verify.RULES, "chain", biased_chain_rule)
    speculative._speculative.clear_cache()  # the rule is looked up when the loop is traced
    try:
        tree, sampling = CASES["chain"]
        tokens, _ = run_rows(target, drafter, SpecConfig(tree=tree, rule="chain"), sampling)
    finally:
        speculative._speculative.clear_cache()
    problem = distribution_mismatch(empirical_joint(tokens), exact_joint(target, sampling), N_ROWS)
    assert problem is not None
