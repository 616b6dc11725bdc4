"""Sampling losslessness of the whole speculative path (drafter + tree + rule + KV commit).

A tiny random target with an 8-token vocabulary is drafted by an unrelated tiny random model (so
drafts are accepted often but far from always). The empirical
joint distribution of the first depth + 2 generated tokens over many independent rows is compared
with the exact target distribution, computed by enumerating every continuation of that length
(8^4 for depth-2 drafts). depth + 2 because the first token comes from the prefill: a first step
that accepts its whole draft emits depth drafted tokens and then the bonus token, which the
target samples at the deepest node; fewer observed tokens would never look at that token.

Sample size and significance: 60,000 rows. A cell with probability p has standard error
sqrt(p (1 - p) / n) <= 0.00205, so a 2% absolute bias in any cell is > 9.7 standard errors; the
test fails if any cell deviates by more than 0.01 (4.9 standard errors at worst, so a correct rule
fails with probability < 1e-6 per cell) or if a chi-square test over cells with expected count
>= 5 (the rest pooled) rejects at p < 1e-4. test_check_catches_a_biased_distribution shows a 2%
shift caught at this size. Seeds are fixed, so the result is deterministic.
"""

import itertools

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
N_ROWS = 60_000
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


def observed_tokens(tree: TreeConfig) -> int:
    """Tokens a distribution check must observe to see the bonus token after a first step that
    accepts every drafted token: the prefill's token, max_depth drafts, the bonus."""
    return tree.max_depth + 2


def exact_joint(target, sampling: SamplingConfig, n_tokens: int = 3, prompt=PROMPT) -> np.ndarray:
    """P(x_1..x_n | prompt) after the sampling transform, flat [V**n] indexed by the base-V code
    of the sequence (x_1 most significant), by enumeration."""
    from specjax.cache import init_cache
    from specjax.tree import causal_mask

    seqs = np.array([list(prompt) + list(c) for c in itertools.product(range(V), repeat=n_tokens)])
    t = seqs.shape[1]
    logits = target(
        jnp.asarray(seqs),
        positions=jnp.broadcast_to(jnp.arange(t), seqs.shape),
        cache=init_cache(CFG, len(seqs), t),
        tree_mask=causal_mask(len(seqs), t),
    ).logits
    probs = np.asarray(apply_sampling(logits, sampling))  # [V^n, T, V]
    k = len(prompt)
    joint = np.ones(len(seqs))
    for i in range(n_tokens):
        joint *= probs[np.arange(len(seqs)), k - 1 + i, seqs[:, k + i]]
    return joint


def sequence_codes(tokens: np.ndarray) -> np.ndarray:
    """Base-V code of each row's tokens [rows, n] -> [rows] (the first token most significant)."""
    return tokens.astype(np.int64) @ (V ** np.arange(tokens.shape[1] - 1, -1, -1))


def empirical_joint(tokens: np.ndarray) -> np.ndarray:
    """Frequencies of the rows' sequences [rows, n] -> flat [V**n] (as exact_joint)."""
    counts = np.bincount(sequence_codes(tokens), minlength=V ** tokens.shape[1])
    return counts / len(tokens)


def distribution_mismatch(emp: np.ndarray, exact: np.ndarray, n: int) -> str | None:
    """None if emp is consistent with exact, else a description of the failure."""
    assert emp.shape == exact.shape, (emp.shape, exact.shape)
    leaked = float(emp[exact == 0].sum())
    if leaked > 0:  # the chi-square below drops these cells, so check them first
        return f"{leaked:.2e} of the rows emitted sequences the target gives probability 0"
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


def run_rows(target, drafter, config, sampling, seed=0, prompt=PROMPT):
    """N_ROWS sampled rows of observed_tokens(config.tree) tokens: (tokens [rows, n], stats)."""
    n_tokens = observed_tokens(config.tree)
    keys = jax.random.split(jax.random.key(seed), N_ROWS)
    out = specjax.speculative_generate(
        target,
        drafter,
        [list(prompt)] * N_ROWS,
        max_new_tokens=n_tokens,
        config=config,
        sampling=sampling,
        key=keys,
    )
    assert (np.asarray(out.lengths) == n_tokens).all()
    return np.asarray(out.tokens), out.stats


def check_rows(tokens: np.ndarray, target, sampling: SamplingConfig, prompt=PROMPT) -> str | None:
    """distribution_mismatch of the rows' tokens [rows, n] against the target's exact joint."""
    exact = exact_joint(target, sampling, tokens.shape[1], prompt)
    return distribution_mismatch(empirical_joint(tokens), exact, len(tokens))


# Depth-2 drafts: four tokens need one step when everything is accepted (the last one is the
# bonus token) and two to four steps otherwise, so the KV commit and the drafter's state after
# a rejection are exercised too.
CASES = {
    "chain": (TreeConfig.chain(2), SamplingConfig(temperature=1.0)),
    "hsd": (TreeConfig.chain(2), SamplingConfig(temperature=1.0)),
    "tree_onehot": (TreeConfig(branching=(2, 1)), SamplingConfig(temperature=1.0)),
    # With the whole sampling transform, so that the default run checks it is applied to the
    # target and the drafter alike (temperature, top-k and top-p).
    "tree_sampled": (
        TreeConfig(branching=(3, 1)),
        SamplingConfig(temperature=0.7, top_k=5, top_p=0.9),
    ),
}


# The default run keeps the chain, HSD and sampled-tree rules end to end (each rule alone is
# checked exactly in test_verify.py, and the one-hot tree rule end to end with the feature
# drafters and the pre-verifier); the one-hot tree's run here is under `slow`.
@pytest.mark.parametrize(
    "rule",
    [r if r != "tree_onehot" else pytest.param(r, marks=pytest.mark.slow) for r in CASES],
)
def test_speculative_sampling_matches_target_distribution(target, drafter, rule, optimized_loop):
    tree, sampling = CASES[rule]
    tokens, stats = run_rows(target, drafter, SpecConfig(tree=tree, rule=rule), sampling)
    problem = check_rows(tokens, target, sampling)
    assert problem is None, problem
    # The test is only meaningful if drafts are sometimes accepted and sometimes rejected.
    hist = np.asarray(stats["accepted_hist"]).sum(0)
    assert hist[1:].sum() > 0.05 * hist.sum() and hist[:-1].sum() > 0.05 * hist.sum(), hist


def test_fallback_to_plain_steps_keeps_the_target_distribution(target, drafter, optimized_loop):
    """SpecConfig.fallback_tau: one speculative step (a one-hot tree), then plain decoding steps
    in the same loop for the rest: the joint distribution is still the target's."""
    config = SpecConfig(tree=TreeConfig(branching=(2, 1)), fallback_tau=10.0, fallback_after=1)
    tokens, stats = run_rows(target, drafter, config, SamplingConfig(temperature=1.0), seed=2)
    problem = check_rows(tokens, target, SamplingConfig(temperature=1.0))
    assert problem is None, problem
    calls, plain = np.asarray(stats["target_calls"]), np.asarray(stats["plain_steps"])
    np.testing.assert_array_equal(calls - plain, 1)  # the first step alone speculated
    # Both kinds of step emitted tokens: most rows needed plain steps, some (those that
    # accepted the whole draft, ~3%) finished in one.
    assert 0.01 < (plain > 0).mean() < 0.99, (plain > 0).mean()


# ~35 s on a 2-core CPU (twice the rows): under `slow`. The default run checks ragged batches
# for greedy equality (test_feature_drafter, test_cpu_attention, test_text_chain) and per-row
# keys in every sampled test here.
@pytest.mark.slow
def test_ragged_batch_rows_each_follow_their_own_prompt(target, drafter, optimized_loop):
    """Rows of two prompt lengths interleaved in one batch (left padding, per-row lengths and
    keys): each group's tokens follow the exact joint given its own prompt. Twice the module's
    rows, so that each group has N_ROWS and the same bounds."""
    tree = TreeConfig.chain(2)
    n_tokens = observed_tokens(tree)
    other = [4, 4, 1, 7, 3, 6]
    rows = 2 * N_ROWS
    prompts = [PROMPT if i % 2 == 0 else other for i in range(rows)]
    sampling = SamplingConfig(temperature=1.0)
    out = specjax.speculative_generate(
        target, drafter, prompts, max_new_tokens=n_tokens, sampling=sampling,
        config=SpecConfig(tree=tree, rule="chain"),
        key=jax.random.split(jax.random.key(4), rows),
    )  # fmt: skip
    tokens = np.asarray(out.tokens)
    for group, prompt in ((tokens[0::2], PROMPT), (tokens[1::2], other)):
        problem = check_rows(group, target, sampling, prompt)
        assert problem is None, (prompt, problem)
    # Control: rows decoded as if they had the other prompt would be caught.
    assert check_rows(tokens[0::2], target, sampling, other) is not None


def test_sampling_at_the_end_of_the_cache(optimized_loop):
    """The same check where a row's last step writes the cache's last slots: prompt + new
    tokens + the tree's reserved slots = max_seq_len (the module's models with a 12-slot cache,
    so that the rows fit in memory)."""
    from specjax.cache import tree_reserve

    short = ModelConfig(**{**CFG.__dict__, "max_seq_len": 12})
    target = sharpened(short, 3, 3.0)
    drafter = LMDrafter(sharpened(ModelConfig(**{**short.__dict__, "n_layers": 1}), 11, 2.0))
    tree = TreeConfig.chain(2)
    width = short.max_seq_len - observed_tokens(tree) - tree_reserve(tree.num_nodes, tree.max_depth)
    prompt = PROMPT + [(3 * i + 1) % V for i in range(width - len(PROMPT))]
    sampling = SamplingConfig(temperature=1.0)
    config = SpecConfig(tree=tree, rule="chain")
    tokens, _ = run_rows(target, drafter, config, sampling, seed=3, prompt=prompt)
    problem = check_rows(tokens, target, sampling, prompt)
    assert problem is None, problem
    with pytest.raises(ValueError, match="prompt too long for the cache"):  # one token more
        specjax.speculative_generate(
            target, drafter, [prompt + [1]], max_new_tokens=observed_tokens(tree), config=config
        )


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
    problem = check_rows(tokens, target, sampling)
    assert problem is None, problem


def test_check_catches_a_biased_distribution(target):
    """The same check rejects samples from a distribution with one 2% shift between two cells
    (four tokens, as the depth-2 cases observe), and passes samples of the exact one."""
    sampling = SamplingConfig(temperature=1.0)
    n_tokens = 4
    exact = exact_joint(target, sampling, n_tokens)
    digits = V ** np.arange(n_tokens - 1, -1, -1)
    rng = np.random.default_rng(0)

    def rows_from(dist):
        draws = rng.choice(V**n_tokens, size=N_ROWS, p=dist / dist.sum())
        return (draws[:, None] // digits) % V

    assert distribution_mismatch(empirical_joint(rows_from(exact)), exact, N_ROWS) is None
    biased = exact.astype(np.float64) / exact.sum()
    hi, lo = np.argsort(biased)[-1], np.argsort(biased)[-2]
    biased[hi] -= 0.02
    biased[lo] += 0.02
    assert distribution_mismatch(empirical_joint(rows_from(biased)), exact, N_ROWS) is not None
    # Mass on a sequence the target never emits is caught however small it is.
    leaky = exact.copy()
    leaky[np.argmin(exact)] = 0.0
    rows = rows_from(exact)
    rows[0] = (np.argmin(exact) // digits) % V
    assert "probability 0" in distribution_mismatch(empirical_joint(rows), leaky, N_ROWS)


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


# In the default run: the only check there that a biased rule inside the engine reaches the
# distribution check (the other biased controls are synthetic, rule-level or `slow`).
def test_end_to_end_check_catches_a_biased_rule(target, drafter, monkeypatch):
    from specjax import speculative, verify

    monkeypatch.setitem(verify.RULES, "chain", biased_chain_rule)
    speculative._speculative.clear_cache()  # the rule is looked up when the loop is traced
    try:
        tree, sampling = CASES["chain"]
        tokens, _ = run_rows(target, drafter, SpecConfig(tree=tree, rule="chain"), sampling)
    finally:
        speculative._speculative.clear_cache()
    assert check_rows(tokens, target, sampling) is not None
