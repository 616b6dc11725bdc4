"""The acceptance shift (specjax.adaptation, AcceptanceProfile.scaled): the scaled predictions,
the fit that recovers a shift from calls, and the default call recording its outcome and reusing
it. Synthetic profiles; no timing is asserted."""

import dataclasses

import numpy as np
import pytest

import specjax
from specjax import adaptation, choice
from specjax.acceptance import AcceptanceProfile, ProfileRecorder
from specjax.config import AutoSpecConfig, TreeConfig


def chain_profile(accept=(0.8, 0.7, 0.6)) -> AcceptanceProfile:
    d = len(accept)
    return AcceptanceProfile(
        kind="static", mode="greedy", probe=(1,) * d, steps=100, measured_tau=0.0,
        rank_accept=tuple((a,) for a in accept), rank_count=((100,),) * d,
    )  # fmt: skip


def dynamic_profile() -> AcceptanceProfile:
    rec = ProfileRecorder(TreeConfig.dynamic(4, 2, 2), "greedy")
    probs = [1, 0.6, 0.3, 0.9, 0.5]
    for path, n in (([0, 1, 3], 2), ([0, 2, 4], 2), ([0, 1, 0], 1), ([0, 0, 0], 0)):
        rec.add([-1, 0, 0, 1, 2], [0, 1, 1, 2, 2], [True] * 5, probs, path, n)
    return rec.profile()


def test_scaled_static_profile_scales_each_depth():
    p = chain_profile()
    assert p.scaled(1.0) is p
    s = p.scaled(0.5)
    # P(at least k accepted) = prod of the first k acceptances, each halved.
    expected = 1 + 0.4 + 0.4 * 0.35 + 0.4 * 0.35 * 0.3
    assert s.predict_tau(TreeConfig.chain(3)) == pytest.approx(expected)
    assert s.shift == 0.5 and s.scaled(0.5).shift == 0.25
    # Acceptances are capped at 1 when scaled up.
    assert p.scaled(2.0).predict_tau(TreeConfig.chain(3)) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="shift"):
        p.scaled(0.0)


def test_scaled_dynamic_table_scales_each_level_and_stays_in_range():
    p = dynamic_profile()
    s = p.scaled(0.5)
    table, scaled = np.array(p.tau_table), np.array(s.tau_table)
    # Depth 1: the first level's gain halves; depth 2: its own gain is scaled by 0.25.
    np.testing.assert_allclose(scaled[0], 1 + 0.5 * (table[0] - 1))
    np.testing.assert_allclose(
        scaled[1], np.clip(1 + 0.5 * (table[0] - 1) + 0.25 * (table[1] - table[0]), 1, 3)
    )
    big = np.array(p.scaled(2.0).tau_table)
    assert (big >= 1).all() and (big[0] <= 2).all() and (big[1] <= 3).all()
    trees = [TreeConfig.dynamic(n, d, 2) for d in (1, 2) for n in (1, 2, 3, 4)]
    for tree in trees:  # lower shifts never predict more
        assert s.predict_tau(tree) <= p.predict_tau(tree) + 1e-12


def test_scaled_tau_of_one_tree_is_the_scaled_profiles_prediction():
    """The fit's shortcut (scaled_tau) gives the very float the scaled profile predicts, for
    static and dynamic trees, shifts below, at and above 1 (acceptances capped, tau clipped)."""
    static, dynamic = chain_profile(), dynamic_profile()
    trees = [(static, TreeConfig.chain(k)) for k in (1, 2, 3)] + [
        (dynamic, TreeConfig.dynamic(n, d, 2)) for d in (1, 2) for n in (1, 2, 3, 4)
    ]
    for shift in (0.3, 0.55, 0.9, 1.0, 1.2, 2.0, 5.0):
        for profile, tree in trees:
            assert profile.scaled_tau(tree, shift) == profile.scaled(shift).predict_tau(tree)


def observed(profile, tree, shift, steps):
    tau = profile.scaled(shift).predict_tau(tree)
    return adaptation.Observation((profile,), tree, steps, steps * tau)


def test_fit_recovers_the_shift_behind_the_calls():
    p = chain_profile()
    calls = [observed(p, TreeConfig.chain(3), 0.6, 400), observed(p, TreeConfig.chain(1), 0.6, 400)]
    assert adaptation.fit_shift(calls, prior_steps=0) == pytest.approx(0.6, abs=1e-6)
    # The prior pulls a short record toward the calibration (shift 1), never past the data.
    short = [observed(p, TreeConfig.chain(3), 0.6, 8)]
    assert 0.6 < adaptation.fit_shift(short) < 1.0
    # Calls better than the calibration raise it; the range bounds it.
    assert adaptation.fit_shift([observed(p, TreeConfig.chain(2), 1.2, 1000)]) > 1.1
    none = adaptation.Observation((p,), TreeConfig.chain(3), 100, 100.0)  # nothing accepted
    assert adaptation.fit_shift([none], prior_steps=0) == adaptation.SHIFT_RANGE[0]


def test_recorded_calls_give_a_rounded_shift_per_key():
    adaptation.reset()
    p, tree = chain_profile(), TreeConfig.chain(3)
    key = ("t", "d", "greedy")
    assert adaptation.current_shift(key) == 1.0
    hist = np.zeros((2, 4), np.int64)
    hist[:, 0] = [30, 30]  # 60 steps, nothing accepted: far below the profile
    hist[:, 1] = [10, 10]  # 20 steps with one accepted
    stats = {"accepted_hist": hist, "plain_steps": np.array([5, 5])}  # 10 of the 60 were plain
    assert tuple(map(int, adaptation.speculative_counts(stats))) == (70, 90)
    adaptation.record(key, None, None, (p,), tree, stats)
    shift = adaptation.current_shift(key)
    assert shift < 1.0 and shift == pytest.approx(round(shift / 0.1) * 0.1)
    assert adaptation.current_shift(("t", "d", "sampled")) == 1.0  # another mode: untouched
    adaptation.reset()
    assert adaptation.current_shift(key) == 1.0


def test_adapt_setting_is_checked():
    for bad in (0, -0.5, "yes"):
        with pytest.raises(ValueError, match="adapt"):
            AutoSpecConfig(adapt=bad)
    AutoSpecConfig(adapt=0.7)


@pytest.mark.slow
def test_default_call_records_its_outcome_and_the_next_call_uses_it(tmp_path, monkeypatch):
    """A default call records its speculative steps; the next default call with the same target
    and drafter reports the shift fitted from them, and an explicit shift (adapt=number) scales
    the prediction and records nothing. Greedy output equals generate's throughout."""
    from auto_checks import kept_costs_call, static_profile

    adaptation.reset()
    target, drafter, auto, prompts, ref = kept_costs_call(tmp_path, monkeypatch, fallback=False)
    first = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=12, config=auto)
    np.testing.assert_array_equal(np.asarray(first.tokens), np.asarray(ref.tokens))
    assert first.stats["acceptance_shift"] == 1.0
    key = adaptation.key_of(target, drafter, "greedy")
    (call,) = adaptation._CALLS[key][2]
    steps, tokens = call.counts()
    assert steps == int(np.asarray(first.stats["target_calls"]).sum())
    assert tokens == int((np.asarray(first.stats["accepted_hist"]) * np.arange(1, 4)).sum())
    expected = adaptation.current_shift(key)
    second = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=12,
                                          config=auto)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(second.tokens), np.asarray(ref.tokens))
    assert second.stats["acceptance_shift"] == expected != 1.0
    assert len(adaptation._CALLS[key][2]) == 2
    # Giving that shift back repeats the choice from memory (no fingerprints, no file reads).
    chosen = len(choice._CHOSEN)
    given = dataclasses.replace(auto, adapt=expected)
    again = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=12, config=given)
    assert len(choice._CHOSEN) == chosen and again.stats["tree"] == second.stats["tree"]
    fixed = dataclasses.replace(auto, adapt=0.5)
    third = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=12, config=fixed)
    np.testing.assert_array_equal(np.asarray(third.tokens), np.asarray(ref.tokens))
    assert third.stats["acceptance_shift"] == 0.5
    tree = TreeConfig(branching=tuple(int(b) for b in third.stats["tree"][10:-1].split(",")))
    assert third.stats["predicted_tau"] == pytest.approx(
        static_profile().scaled(0.5).predict_tau(tree), abs=1e-6
    )
    assert len(adaptation._CALLS[key][2]) == 2  # an explicit shift records nothing
    assert [c.age for c in adaptation._CALLS[key][2]] == [1, 0]
    # A default call whose choice is plain decoding records no call but ages the kept ones.
    plain = dataclasses.replace(auto, min_speedup=1e6)
    fourth = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=12, config=plain)
    assert fourth.stats["tree"] == "autoregressive"
    np.testing.assert_array_equal(np.asarray(fourth.tokens), np.asarray(ref.tokens))
    assert [c.age for c in adaptation._CALLS[key][2]] == [2, 1]
    adaptation.reset()


def test_older_calls_weigh_less_and_plain_calls_age_them():
    """A process whose calls made plain decoding the choice does not stay there: every default
    call, plain ones included, halves an older call's weight every HALF_LIFE_CALLS calls, so the
    shift drifts back toward the calibration until a tree is tried again."""
    adaptation.reset()
    p, tree = chain_profile(), TreeConfig.chain(3)
    key = ("t", "d", "greedy")
    hist = np.zeros((1, 4), np.int64)
    hist[0, 0] = 8 * adaptation.PRIOR_STEPS  # steps outweighing the prior, nothing accepted
    adaptation.record(key, None, None, (p,), tree, {"accepted_hist": hist})
    low = adaptation.current_shift(key)
    assert low <= 0.2
    shifts = [low]
    for _ in range(6 * int(adaptation.HALF_LIFE_CALLS)):
        adaptation.record_plain(key)
        shifts.append(adaptation.current_shift(key))
    assert all(a <= b for a, b in zip(shifts, shifts[1:], strict=False)), shifts
    assert shifts[-1] >= 0.9  # 48 plain calls later the prior (shift 1) dominates again
    (call,) = adaptation._CALLS[key][2]
    assert call.age == 6 * adaptation.HALF_LIFE_CALLS
    assert adaptation.weight(call) == pytest.approx(2.0**-6)
    # A new speculative call counts in full and ages the older one.
    adaptation.record(key, None, None, (p,), tree, {"accepted_hist": hist})
    assert [c.age for c in adaptation._CALLS[key][2]] == [49, 0]
    assert adaptation.current_shift(key) <= 0.2
    adaptation.record_plain(("t", "d", "sampled"))  # nothing recorded under that key: no-op
    assert ("t", "d", "sampled") not in adaptation._CALLS
    adaptation.reset()


def test_fit_weights_recent_calls_more():
    p = chain_profile()
    old = observed(p, TreeConfig.chain(3), 0.4, 400)
    new = observed(p, TreeConfig.chain(3), 0.9, 400)
    old.age = 16  # weight 1/4
    fitted = adaptation.fit_shift([old, new], prior_steps=0)
    assert 0.65 < fitted < 0.9  # nearer the recent call's 0.9 than the plain mean of the two
    old.age = 0
    even = adaptation.fit_shift([old, new], prior_steps=0)
    assert even < fitted
