"""HiSpec's three-level loop (specjax.hispec) is lossless: greedy output equals `generate` across
draft lengths, buffer sizes, exit layers, batch sizes, EOS and the cache boundary; a row's output
does not depend on the other rows; the sampled output matches the target's exact distribution
(test_lossless_e2e's enumeration check, with a biased control caught)."""

import chex
import jax
import numpy as np
import pytest
from flax import nnx
from lively_models import lively_llama
from test_early_exit import LIVELY, RAGGED, random_exit
from test_lossless_e2e import (
    CFG,
    N_ROWS,
    PROMPT,
    biased_chain_rule,
    check_rows,
    sharpened,
)

import specjax
from specjax.config import SamplingConfig, SpecConfig, TreeConfig
from specjax.hispec import HiSpec

# The three-level loop itself: the default call would first time it against plain decoding
# (specjax.hispec_choice) and might decode plainly.
ALWAYS = SpecConfig.auto(allow_autoregressive=False)


@pytest.fixture(scope="module")
def lively():
    return lively_llama(LIVELY, 0)


def lively_hispec(lively, draft_layer=1, verify_layer=3, **settings):
    # The exit vocabularies leave out some ids, so an exit cannot propose every target token.
    return HiSpec(
        random_exit(LIVELY, draft_layer, seed=5, vocab=np.arange(56)),
        random_exit(LIVELY, verify_layer, seed=6, vocab=np.arange(60)),
        lively,
        **settings,
    )


def assert_greedy_equal(lively, hispec, prompts, max_new_tokens, eos_id=None):
    ref = specjax.generate(lively, prompts, max_new_tokens=max_new_tokens, eos_id=eos_id)
    out = specjax.speculative_generate(
        lively, hispec, prompts, max_new_tokens=max_new_tokens, eos_id=eos_id, config=ALWAYS
    )
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    return out


@pytest.mark.parametrize(
    "layers,settings,batch",
    [
        ((1, 3), dict(draft_len=3, buffer=4), 4),
        pytest.param((1, 2), dict(draft_len=1, buffer=1), 3, marks=pytest.mark.slow),
        # k >= buffer + 3: finished rows keep drafting while others run (writes must stay in
        # the cache).
        pytest.param((2, 3), dict(draft_len=5, buffer=1), 3, marks=pytest.mark.slow),
        pytest.param((1, 3), dict(draft_len=2, buffer=9), 4, marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_greedy_equals_generate(lively, layers, settings, batch):
    """max_new_tokens runs the longest prompt to the last slots the cache allows."""
    hispec = lively_hispec(lively, *layers, **settings)
    prompts = RAGGED[:batch]
    room = LIVELY.max_seq_len - max(map(len, prompts)) - hispec.slots - 2
    out = assert_greedy_equal(lively, hispec, prompts, room)
    s = {k: np.asarray(v) for k, v in out.stats.items()}
    # Both levels accept some tokens and reject some.
    assert 0 < s["intermediate_accepted"].sum() < s["intermediate_drafted"].sum(), s
    emitted = np.asarray(out.lengths) - 1
    assert (s["full_accepted"] <= emitted).all() and (s["target_calls"] < emitted).all(), s
    chex.assert_trees_all_close(s["tau"], emitted / s["target_calls"])


def test_eos_and_batch_independence(lively):
    """Rows stop at EOS inside a buffer, and a row's tokens are the same alone or in a batch."""
    hispec = lively_hispec(lively)
    ref = specjax.generate(lively, RAGGED, max_new_tokens=30)
    eos = int(np.asarray(ref.tokens)[1, 6])  # a token row 1 emits mid-way
    out = assert_greedy_equal(lively, hispec, RAGGED, 30, eos_id=eos)
    assert int(out.lengths[1]) <= 7
    for i in (0, 3):
        alone = specjax.speculative_generate(
            lively, hispec, [RAGGED[i]], max_new_tokens=30, eos_id=eos, config=ALWAYS
        )
        np.testing.assert_array_equal(np.asarray(alone.tokens)[0], np.asarray(out.tokens)[i])


@pytest.mark.slow
def test_sampled_rows_do_not_depend_on_the_batch(lively):
    hispec = lively_hispec(lively)
    sampling = SamplingConfig(temperature=1.0)
    keys = jax.random.split(jax.random.key(3), 4)
    together = specjax.speculative_generate(
        lively, hispec, RAGGED, max_new_tokens=24, sampling=sampling, key=keys, config=ALWAYS
    )
    alone = specjax.speculative_generate(
        lively, hispec, [RAGGED[2]], max_new_tokens=24, sampling=sampling, key=keys[2:3],
        config=ALWAYS,
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(alone.tokens)[0], np.asarray(together.tokens)[2])


def test_settings_and_config_are_checked(lively):
    with pytest.raises(ValueError, match="must lie below the verify exit"):
        HiSpec(random_exit(LIVELY, 3), random_exit(LIVELY, 2), lively)
    with pytest.raises(ValueError, match="buffer must be an int >= 1"):
        lively_hispec(lively, buffer=0)
    hispec = lively_hispec(lively)
    with pytest.raises(ValueError, match="HiSpec drafts chains"):
        specjax.speculative_generate(
            lively, hispec, RAGGED, max_new_tokens=8,
            config=SpecConfig(tree=TreeConfig(branching=(2, 1))),
        )  # fmt: skip
    with pytest.raises(ValueError, match="verifies with its own exits"):
        specjax.speculative_generate(
            lively, hispec, RAGGED, max_new_tokens=8, verifier=specjax.FullVerifier()
        )
    # Settings HiSpec cannot honour are refused, not dropped.
    for config, named in (
        (SpecConfig(tree=TreeConfig.chain(2), rule="hsd"), "leave rule at 'auto'"),
        (SpecConfig.auto(rule="chain"), "leave rule at 'auto'"),
        (SpecConfig(tree=TreeConfig.chain(2), fallback_tau=1.5), "leave fallback_tau at None"),
        ("chain", "must be a SpecConfig"),
    ):
        with pytest.raises(ValueError, match=named):
            specjax.speculative_generate(lively, hispec, RAGGED, max_new_tokens=8, config=config)
    # An explicit chain sets the draft length.
    out = specjax.speculative_generate(
        lively, hispec, RAGGED[:1], max_new_tokens=12, config=SpecConfig(tree=TreeConfig.chain(2))
    )
    assert int(out.stats["intermediate_drafted"][0]) == 2 * int(out.stats["intermediate_calls"][0])


@pytest.fixture(scope="module")
def target():
    return sharpened(CFG, 3, 3.0)


def sharp_exit(layer, seed):
    head = random_exit(CFG, layer, seed=seed, shift=0.0)
    nnx.update(head, jax.tree.map(lambda x: x * 3.0, nnx.state(head, nnx.Param)))
    return head


def sampled_rows(target, seed=0):
    """N_ROWS rows of 4 sampled tokens: draft exit at layer 1 and verify exit at layer 2 of 3.
    Four tokens: the prefill's, then a first round's 2 drafts and the verify exit's bonus token
    when it accepts both, all judged by the target in the first flush."""
    draft_len = 2
    hispec = HiSpec(sharp_exit(1, 4), sharp_exit(2, 7), target, draft_len=draft_len, buffer=2)
    keys = jax.random.split(jax.random.key(seed), N_ROWS)
    out = specjax.speculative_generate(
        target, hispec, [PROMPT] * N_ROWS, max_new_tokens=draft_len + 2,
        sampling=SamplingConfig(temperature=1.0), key=keys, config=ALWAYS,
    )  # fmt: skip
    assert (np.asarray(out.lengths) == draft_len + 2).all()
    return np.asarray(out.tokens), {k: np.asarray(v) for k, v in out.stats.items()}


# In the default run (~35 s on 2 cores); its biased control is under `slow`.
def test_sampled_distribution_matches_target(target, optimized_hispec_loop):
    tokens, s = sampled_rows(target)
    sampling = SamplingConfig(temperature=1.0)
    problem = check_rows(tokens, target, sampling)
    assert problem is None, problem
    # Both levels accept and reject often enough for the check to see either rule.
    inter = s["intermediate_accepted"].sum() / s["intermediate_drafted"].sum()
    full = s["full_accepted"].sum() / (np.asarray(s["tau"]) * s["target_calls"]).sum()
    assert 0.1 < inter < 0.9 and 0.1 < full < 0.95, (inter, full)


@pytest.mark.slow
def test_check_catches_a_biased_rule(target, monkeypatch):
    """The same check fails when the chain rule draws corrections from p instead of the
    residual (both levels use it)."""
    from specjax import hispec, verify

    monkeypatch.setattr(verify, "verify_chain", biased_chain_rule)
    monkeypatch.setitem(verify.RULES, "chain", biased_chain_rule)
    hispec._hispec.clear_cache()
    try:
        tokens, _ = sampled_rows(target)
    finally:
        hispec._hispec.clear_cache()
    sampling = SamplingConfig(temperature=1.0)
    problem = check_rows(tokens, target, sampling)
    assert problem is not None


def test_shipped_exit_heads_load_as_hispec(shared_dir):
    """load_drafter of an exit-heads directory gives a HiSpec that runs the real stories260K
    target losslessly (greedy), with its checkpoint's settings unless a chain is given."""
    from specjax.datasets import tinystories_prompts
    from specjax.paths import STORIES260K, repo_dir

    path = repo_dir() / "checkpoints/stories260K-hispec"
    if not (path / "hispec.json").exists():
        pytest.skip("checkpoints/stories260K-hispec is not in this checkout")
    stories = specjax.load(shared_dir / STORIES260K)
    hispec = specjax.load_drafter(path, stories)
    assert isinstance(hispec, HiSpec)
    prompts = tinystories_prompts(stories.tokenizer, 3)
    ref = specjax.generate(stories.model, prompts, max_new_tokens=40)
    out = specjax.speculative_generate(
        stories.model, hispec, prompts, max_new_tokens=40, config=ALWAYS
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    # A trained draft exit gets some drafts past the verify exit (untrained: almost none).
    s = {k: np.asarray(v).sum() for k, v in out.stats.items()}
    assert s["intermediate_accepted"] > 0.1 * s["intermediate_drafted"], s


def test_the_default_call_decodes_with_hispec_only_where_it_measured_faster(lively, monkeypatch):
    """SpecConfig.auto() times HiSpec against plain decoding once per kind of call (kept on disk)
    and decodes with the faster; the output is plain decoding's either way (greedy)."""
    from specjax import hispec_choice

    hispec = lively_hispec(lively)
    ref = specjax.generate(lively, RAGGED[:2], max_new_tokens=20)
    measured = []

    def fake_measure(ratio):
        def measure(*args, **kwargs):
            measured.append(ratio)
            return ratio, 1.7

        return measure

    for ratio, runs_hispec in ((0.6, False), (1.4, True)):
        monkeypatch.setattr(hispec_choice, "measure", fake_measure(ratio))
        monkeypatch.setattr(hispec_choice, "_CHOSEN", {})
        # Another setting is another key (a first call measures it).
        h = hispec.with_settings(buffer=2 if runs_hispec else 3)
        out = specjax.speculative_generate(lively, h, RAGGED[:2], max_new_tokens=20)
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
        assert ("intermediate_calls" in out.stats) == runs_hispec, out.stats.keys()
        expected = f"hispec(draft_len=1,buffer={h.buffer})" if runs_hispec else "autoregressive"
        assert out.stats["tree"] == expected
        assert out.stats["hispec_probe_speedup"] == ratio
        # Read back from disk in a later process (the in-process memo cleared): no new probe.
        monkeypatch.setattr(hispec_choice, "_CHOSEN", {})
        monkeypatch.setattr(hispec_choice, "measure", lambda *a, **k: pytest.fail("measured"))
        again = specjax.speculative_generate(lively, h, RAGGED[:2], max_new_tokens=20)
        assert again.stats["tree"] == expected
    assert measured == [0.6, 1.4]
    # A call of one new token probes one token (mostly the prefill): its ratio serves no call
    # of the same cache-length bucket that probes the usual PROBE_TOKENS.
    monkeypatch.setattr(hispec_choice, "measure", fake_measure(2.0))
    monkeypatch.setattr(hispec_choice, "_CHOSEN", {})
    short = specjax.speculative_generate(lively, hispec, RAGGED[:2], max_new_tokens=1)
    assert short.stats["hispec_probe_speedup"] == 2.0 and measured[-1] == 2.0


def test_the_probe_times_both_methods_on_the_calls_prompts(lively):
    """The probe itself (no stand-in): a positive ratio and HiSpec's tau from real calls."""
    from specjax import hispec_choice

    ratio, tau = hispec_choice.measure(
        lively, lively_hispec(lively), RAGGED[:2], sampling=SamplingConfig(),
        max_new_tokens=12, eos_id=None, key=None,
    )  # fmt: skip
    assert np.isfinite(ratio) and ratio > 0.0  # a measured time ratio; its size is not tested
    assert 1.0 <= tau <= 1.0 + lively_hispec(lively).slots
