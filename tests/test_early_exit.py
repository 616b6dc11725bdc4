"""EarlyExitVerifier (HiSpec's intermediate verification over a draft tree) is lossless: greedy
output equals `generate` across trees, exit layers, batch sizes and cache boundaries, and the
sampled output matches the target's exact distribution (test_lossless_e2e's enumeration check:
60,000 rows, a 2% bias in any cell is > 9.7 standard errors), with a biased control caught."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from lively_models import lively_llama
from test_lossless_e2e import (
    CFG,
    N_ROWS,
    PROMPT,
    biased_chain_rule,
    check_rows,
    observed_tokens,
    sharpened,
)

import specjax
from specjax.config import TINY, SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters.lm import LMDrafter
from specjax.models.exit_head import ExitHead
from specjax.verifiers.early_exit import EarlyExitVerifier

RAGGED = [[1, 5, 7], [1, 2, 3, 4, 5, 6, 7, 8], [3], [9, 9, 2, 11, 4]]
# A random target with varied greedy output (weights x3; at initialisation scale it repeats one
# token), 4 layers so the exit can sit at 1, 2 or 3.
LIVELY = dataclasses.replace(TINY, n_layers=4, vocab_size=64, max_seq_len=128)


def random_exit(cfg, layer, *, seed=1, shift=0.05, vocab=None):
    """An untrained exit head with non-zero residual weights (so its block is exercised)."""
    vocab = np.arange(cfg.vocab_size) if vocab is None else vocab
    head = ExitHead(cfg.d_model, layer=layer, kind="mlp", vocab=vocab, eps=cfg.norm_eps,
                    rngs=nnx.Rngs(seed))  # fmt: skip
    params = nnx.state(head, nnx.Param)
    nnx.update(head, jax.tree.map(lambda x: x + shift, params))
    return head


@pytest.fixture(scope="module")
def lively():
    return lively_llama(LIVELY, 0)


@pytest.mark.parametrize(
    "tree,layer,batch",
    [
        # The default run keeps test_three_levels_greedy_equals_generate for this path.
        pytest.param(TreeConfig.chain(4), 2, 4, marks=pytest.mark.slow),
        pytest.param(TreeConfig(branching=(2, 2, 2, 1)), 3, 3, marks=pytest.mark.slow),
        pytest.param(TreeConfig(branching=(3, 2, 1)), 2, 4, marks=pytest.mark.slow),
        pytest.param(TreeConfig(branching=(3, 2, 1)), 1, 1, marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_greedy_equals_generate(lively, tree, layer, batch):
    """The exit vocabulary leaves out 16 of 64 ids, so the exit cannot propose some target
    tokens; max_new_tokens runs the longest row to the last slots the cache allows."""
    verifier = EarlyExitVerifier(random_exit(LIVELY, layer, vocab=np.arange(48)), lively)
    prompts = RAGGED[:batch]
    config = SpecConfig(tree=tree)
    room = LIVELY.max_seq_len - max(map(len, prompts)) - tree.num_nodes - tree.max_depth - 1
    ref = specjax.generate(lively, prompts, max_new_tokens=room)
    drafter = LMDrafter.self_draft(2)
    out = specjax.speculative_generate(
        lively, drafter, prompts, max_new_tokens=room, config=config, verifier=verifier
    )
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    hist = np.asarray(out.stats["accepted_hist"]).sum(0)
    assert hist[0] > 0 and hist[1:].sum() > 0, hist  # rejections and acceptances both
    accepted = (np.asarray(out.stats["accepted_hist"]) * np.arange(hist.size)).sum(1)
    # The target accepts a prefix of what the exit accepted (minus rows' last steps).
    assert (np.asarray(out.stats["exit_accepted"]) + tree.max_depth >= accepted).all()
    # The exit's steps are the rows' steps less the one that finished each row.
    calls, steps = np.asarray(out.stats["target_calls"]), np.asarray(out.stats["exit_steps"])
    assert (steps >= calls - 1).all() and (steps <= calls).all(), (steps, calls)


def test_exit_layer_is_checked(lively):
    with pytest.raises(ValueError, match="exit layer 4 must lie in"):
        EarlyExitVerifier(random_exit(LIVELY, 4), lively)
    # An exit built for another target is refused before anything compiles, saying what to do.
    verifier = EarlyExitVerifier(random_exit(LIVELY, 3), lively)
    for other, named in (
        (dataclasses.replace(LIVELY, n_layers=2), "past this target's 2 layers"),
        (dataclasses.replace(LIVELY, vocab_size=96), "this target has 96"),
    ):
        with pytest.raises(ValueError, match=named) as raised:
            specjax.speculative_generate(
                specjax.Llama(other, rngs=nnx.Rngs(0)), LMDrafter.self_draft(1), [[1, 2]],
                max_new_tokens=4, config=SpecConfig(tree=TreeConfig.chain(1)), verifier=verifier,
            )  # fmt: skip
        assert "load the exit heads for this target" in str(raised.value)


@pytest.fixture(scope="module")
def target():
    return sharpened(CFG, 3, 3.0)


def run_rows(target, verifier, config, sampling, seed=0):
    draft_cfg = dataclasses.replace(CFG, n_layers=1)
    drafter = LMDrafter(sharpened(draft_cfg, 11, 2.0))
    keys = jax.random.split(jax.random.key(seed), N_ROWS)
    n_tokens = observed_tokens(config.tree)
    out = specjax.speculative_generate(target, drafter, [PROMPT] * N_ROWS,
                                       max_new_tokens=n_tokens, config=config,
                                       sampling=sampling, key=keys, verifier=verifier)  # fmt: skip
    assert (np.asarray(out.lengths) == n_tokens).all()
    return np.asarray(out.tokens), out.stats


def sampled_verifier(target):
    # A sharp exit head at layer 1 of 3: the exit accepts drafts often but not always, and the
    # target accepts the exit's tokens often but not always.
    head = random_exit(CFG, 1, seed=4, shift=0.0)
    nnx.update(head, jax.tree.map(lambda x: x * 3.0, nnx.state(head, nnx.Param)))
    return EarlyExitVerifier(head, target)


# The default run keeps the chain (~30 s on 2 cores); the sampled tree is under `slow`.
@pytest.mark.parametrize(
    "rule,tree",
    [
        ("chain", TreeConfig.chain(2)),
        pytest.param("tree_sampled", TreeConfig(branching=(3, 1)), marks=pytest.mark.slow),
    ],
)
def test_sampled_distribution_matches_target(target, rule, tree, optimized_loop):
    sampling = SamplingConfig(temperature=1.0)
    config = SpecConfig(tree=tree, rule=rule)
    tokens, stats = run_rows(target, sampled_verifier(target), config, sampling)
    problem = check_rows(tokens, target, sampling)
    assert problem is None, problem
    hist = np.asarray(stats["accepted_hist"]).sum(0)
    assert hist[1:].sum() > 0.05 * hist.sum() and hist[:-1].sum() > 0.05 * hist.sum(), hist


@pytest.mark.slow
def test_check_catches_a_biased_final_rule(target, monkeypatch):
    """The same check fails when the chain rule draws corrections from p instead of the
    residual (both levels use it): the harness sees bias through the early-exit path."""
    from specjax import speculative, verify

    monkeypatch.setitem(verify.RULES, "chain", biased_chain_rule)
    speculative._speculative.clear_cache()
    try:
        sampling = SamplingConfig(temperature=1.0)
        config = SpecConfig(tree=TreeConfig.chain(2), rule="chain")
        tokens, _ = run_rows(target, sampled_verifier(target), config, sampling)
    finally:
        speculative._speculative.clear_cache()
    assert check_rows(tokens, target, sampling) is not None


def test_three_levels_greedy_equals_generate(lively):
    """HiSpec's three levels: the draft exit (layer 1) drafts a tree, the verify exit (layer 3)
    screens it, the target checks the exit's path; the longest row runs to the last slots the
    cache allows, and each level both accepts and rejects."""
    drafter = LMDrafter.self_draft_exit(random_exit(LIVELY, 1, seed=5), lively)
    verifier = EarlyExitVerifier(random_exit(LIVELY, 3, seed=6), lively)
    tree = TreeConfig(branching=(2, 2, 1))
    config = SpecConfig(tree=tree)
    room = LIVELY.max_seq_len - max(map(len, RAGGED)) - tree.num_nodes - tree.max_depth - 1
    ref = specjax.generate(lively, RAGGED, max_new_tokens=room)
    out = specjax.speculative_generate(
        lively, drafter, RAGGED, max_new_tokens=room, config=config, verifier=verifier
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    hist = np.asarray(out.stats["accepted_hist"]).sum(0)
    assert hist[0] > 0 and hist[1:].sum() > 0, hist  # the target accepts and rejects
    exit_accepted = int(np.asarray(out.stats["exit_accepted"]).sum())
    exit_steps = int(np.asarray(out.stats["exit_steps"]).sum())
    assert 0 < exit_accepted < tree.max_depth * exit_steps  # and so does the verify exit
    with pytest.raises(ValueError, match="exit layer 4 must lie in"):
        LMDrafter.self_draft_exit(random_exit(LIVELY, 4), lively)
