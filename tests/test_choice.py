"""The acceptance model (specjax.acceptance), the choice of the tree (specjax.choice) and the
SpecConfig.auto() path of speculative_generate. Synthetic profiles and costs check the arithmetic;
the end-to-end test checks that the default call chooses, reports and stays exact. No timing is
asserted: measured seconds depend on the machine."""

import dataclasses
import math

import chex
import jax
import numpy as np
import pytest
from auto_checks import PREFILL_S, keep_costs, static_profile
from flax import nnx

import specjax
from specjax.acceptance import AcceptanceProfile, ProfileRecorder, read_profiles, write_profiles
from specjax.autotune import DraftCosts, VerifyCosts
from specjax.choice import (
    Choice,
    _best_trees,
    candidate_trees,
    choose,
    probes_for,
    rank,
    verify_grid,
    worth_timing,
)
from specjax.config import TINY, AutoSpecConfig, SpecConfig, TreeConfig
from specjax.drafters import LMDrafter


def test_static_profile_counts_children_of_accepted_parents():
    p = static_profile()
    # Depth 1: 4 steps, node 1 (rank 0) accepted twice, node 2 (rank 1) once.
    assert p.rank_count[0] == (4, 4) and p.rank_accept[0] == (0.5, 0.25)
    # Depth 2: only children of an accepted parent count (3 steps), accepted in 2.
    assert p.rank_count[1][0] == 3 and p.rank_accept[1][0] == pytest.approx(2 / 3, abs=1e-4)
    assert p.measured_tau == pytest.approx((3 + 3 + 2 + 1) / 4)
    # Sequoia's formula reproduces the probe's own tau here, and prices sub-trees.
    assert p.predict_tau(TreeConfig(branching=(2, 1))) == pytest.approx(2.25, abs=1e-4)
    assert p.predict_tau(TreeConfig.chain(2)) == pytest.approx(1 + 0.5 + 0.5 * 2 / 3, abs=1e-4)
    assert p.predict_tau(TreeConfig.chain(1)) == pytest.approx(1.5)
    assert not p.covers(TreeConfig(branching=(3,)))
    with pytest.raises(ValueError, match="outside"):
        p.predict_tau(TreeConfig.chain(3))


def test_dynamic_table_counts_what_each_smaller_budget_keeps():
    # Root; depth 1: node 1 (q .6), node 2 (q .3); depth 2: node 3 under 1 (q .9, score .54),
    # node 4 under 2 (q .5, score .15). Score ranks: 1, 3, 2, 4. Accepted path: 2 then 4.
    rec = ProfileRecorder(TreeConfig.dynamic(4, 2, 2), "greedy")
    rec.add([-1, 0, 0, 1, 2], [0, 1, 1, 2, 2], [True] * 5, [1, 0.6, 0.3, 0.9, 0.5], [0, 2, 4], 2)
    p = rec.profile()
    chex.assert_trees_all_close(np.array(p.tau_table[0]), np.array([1, 1, 2, 2, 2.0]))
    chex.assert_trees_all_close(np.array(p.tau_table[1]), np.array([1, 1, 1, 2, 3.0]))
    assert p.predict_tau(TreeConfig.dynamic(2, 1, 2)) == 2.0  # depth 1 keeps nodes 1 and 2
    assert p.predict_tau(TreeConfig.dynamic(2, 2, 2)) == 1.0  # depth 2 keeps nodes 1 and 3
    assert p.predict_tau(TreeConfig.dynamic(4, 2, 2)) == 3.0
    assert not p.covers(TreeConfig.dynamic(4, 2, 4))  # another top-k: another expansion
    assert not p.covers(TreeConfig.dynamic(2, 1, 2).with_text_chain(2))  # the text: not measured
    # Sibling ranks by draft probability: node 2 is rank 1 at depth 1.
    assert p.rank_accept[0] == (0.0, 1.0)


def test_profiles_round_trip_and_damaged_files_raise(tmp_path):
    p = static_profile()
    write_profiles(tmp_path / "a.json", [p])
    assert read_profiles(tmp_path / "a.json") == [p]
    assert read_profiles(tmp_path / "missing.json") == []
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="unreadable acceptance profile"):
        read_profiles(tmp_path / "bad.json")


def flat_profile(depth=4, topk=4, nodes=16, gain=2.0):
    """A dynamic profile whose tau grows with diminishing returns, 1 + gain (1 - 0.8^(n - 1))
    for n nodes, at most depth + 1."""
    table = tuple(
        tuple(min(1 + gain * (1 - 0.8 ** (n - 1)), 1 + d) for n in range(1, nodes + 1))
        for d in range(1, depth + 1)
    )
    zero = tuple((0.0,) * topk for _ in range(depth))
    return AcceptanceProfile(
        kind="dynamic", mode="greedy", probe=(nodes - 1, depth, topk), steps=1,
        measured_tau=table[-1][-1], rank_accept=zero, rank_count=tuple((0,) * topk
        for _ in range(depth)), tau_table=table,
    )  # fmt: skip


def test_choice_follows_the_cost_curve():
    profile = flat_profile()
    draft = DraftCosts(key="d", kind="dynamic", topk=(4,), deep_depth=4,
                       shallow=(0.01,), deep=(0.04,))  # fmt: skip
    flat = VerifyCosts(key="v", nodes=(1, 16), seconds=(1.0, 1.0))  # accelerator-like
    steep = VerifyCosts(key="v", nodes=(1, 16), seconds=(1.0, 2.5))  # CPU-like
    wide = choose([profile], flat, draft)
    narrow = choose([profile], steep, draft)
    assert wide.config.tree.num_nodes > narrow.config.tree.num_nodes
    for c, costs in ((wide, flat), (narrow, steep)):  # the best of every candidate
        best = max(
            profile.predict_tau(t) / (costs.t_verify(t.num_nodes) + draft.t_draft(t))
            for t in candidate_trees(profile, 64)
        )
        assert c.predicted_tau / c.seconds_per_step == pytest.approx(best)
        assert c.predicted_speedup == pytest.approx(best * costs.t_verify(1))
    assert narrow.stats()["tree"].startswith("dynamic(")
    # Room for at most 3 cache slots past a row: only trees that fit are weighed.
    small = choose([profile], flat, draft, room=3)
    assert max(small.config.tree.num_nodes, small.config.tree.max_depth + 1) <= 3


def test_a_text_chain_is_chosen_where_its_tokens_pay_for_its_nodes():
    """A profile whose text chain of 4 adds 0.6 tokens a step to every tree: with a flat t(N)
    (an accelerator) the best tree takes the chain; where each node costs a sixth of a step
    it does not; text trees form their own family for timing."""
    base = flat_profile()
    profile = dataclasses.replace(
        base,
        text_chains=(4,),
        text_table=(tuple(tuple(x + 0.6 for x in row) for row in base.tau_table),),
    )
    draft = DraftCosts(key="d", kind="dynamic", topk=(4,), deep_depth=4,
                       shallow=(0.01,), deep=(0.04,))  # fmt: skip
    flat = VerifyCosts(key="v", nodes=(1, 32), seconds=(1.0, 1.0))
    steep = VerifyCosts(key="v", nodes=(1, 32), seconds=(1.0, 6.0))
    assert choose([profile], flat, draft).config.tree.text_chain == 4
    assert choose([profile], steep, draft).config.tree.text_chain == 0
    label = choose([profile], flat, draft).stats()["tree"]
    assert label.startswith("dynamic(") and label.endswith("+text(4)")
    timed = _best_trees([profile], steep, draft, count=2)
    assert {t.text_chain for t in timed} == {0, 4}


def test_a_staircase_t_n_is_priced_at_timed_node_counts_only():
    """On a CPU t(N) is a staircase (SmolLM2: t(8) well under t(5..7)): interpolating between
    powers of two prices 9-15 nodes like 8-16 ones. Timed at every count (the fine grid), the
    choice finds the cheap step; asked for timed counts only, no tree between timed counts is
    a candidate."""
    profile = flat_profile()
    draft = DraftCosts(key="d", kind="dynamic", topk=(4,), deep_depth=4,
                       shallow=(0.01,), deep=(0.04,))  # fmt: skip
    nodes = tuple(range(1, 17))
    stairs = tuple(1.0 if n in (1, 8, 16) else 1.0 + 0.1 * n for n in nodes)  # t(8) = t(16) = t(1)
    fine = VerifyCosts(key="v", nodes=nodes, seconds=stairs)
    coarse = VerifyCosts(key="v", nodes=(1, 2, 4, 8, 16), seconds=tuple(stairs[n - 1]
                         for n in (1, 2, 4, 8, 16)))  # fmt: skip
    assert choose([profile], fine, draft, timed_nodes_only=True).config.tree.num_nodes in (8, 16)
    ranked = rank([profile], coarse, draft, timed_nodes_only=True)
    assert {tree.num_nodes for _, tree, _, _ in ranked} <= {2, 4, 8, 16}
    everything = rank([profile], coarse, draft)
    assert {tree.num_nodes for _, tree, _, _ in everything} > {2, 4, 8, 16}


def test_only_counts_that_could_hold_the_best_tree_are_worth_timing():
    """worth_timing: with t(N) timed at the powers of two, an untimed count is worth a program
    only where a tree of that size, at INTERIOR_OPTIMISM x the interpolated cost, beats every
    tree at a timed count (the most promising first); once those counts are timed, as dear as
    the line between their neighbours, nothing more is asked for. A count at
    or past the last timed one is never asked for (it would be extrapolated)."""
    profile = flat_profile()
    draft = DraftCosts(key="d", kind="dynamic", topk=(4,), deep_depth=4,
                       shallow=(0.001,), deep=(0.004,))  # fmt: skip
    fine = [3, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15]
    # CPU-like: steep from one node, so the best tree is small and only counts near it matter.
    anchors = VerifyCosts(key="v", nodes=(1, 2, 4, 8, 16), seconds=(1.0, 1.3, 1.45, 2.4, 4.0))
    wanted = worth_timing([profile], anchors, draft, fine)
    assert wanted and set(wanted) < {3, 5, 6, 7}, wanted
    ranked = rank([profile], anchors, draft)  # the best interpolated tree's count comes first
    untimed = (tree.num_nodes for _, tree, _, _ in ranked if tree.num_nodes not in anchors.nodes)
    assert next(untimed) == wanted[0]
    # those counts timed as dear as the line between their neighbours: nothing more to time
    timed = VerifyCosts(key="v", nodes=tuple(sorted({*anchors.nodes, *wanted})),
                        seconds=tuple(anchors.t_verify(n) for n in sorted({*anchors.nodes,
                                                                          *wanted})))  # fmt: skip
    assert worth_timing([profile], timed, draft, fine) == []
    # flat costs (an accelerator): the deepest counts hold the best trees, every one below 16
    flat = VerifyCosts(key="v", nodes=(1, 2, 4, 8, 16), seconds=(1.0,) * 5)
    assert worth_timing([profile], flat, draft, fine) == [15, 14, 13, 12, 11, 10, 9]
    # timed up to 4 nodes only (a stop rule): the counts past it are not asked for (extrapolated)
    short = VerifyCosts(key="v", nodes=(1, 2, 4), seconds=(1.0, 1.0, 1.6))
    assert worth_timing([profile], short, draft, fine) == [3]


def test_verify_grid_is_fine_at_few_rows():
    assert verify_grid(1, 64) == list(range(1, 17)) + [32, 64]
    assert verify_grid(4, 64) == [1, 2, 3, 4, 8, 16, 32, 64]
    assert verify_grid(32, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert verify_grid(2, 4) == [1, 2, 3, 4]
    assert verify_grid(1, 12) == list(range(1, 13))


def test_a_chain_verified_where_drafted_is_priced_by_what_it_drafts():
    """Chains from TEXT_MIN_MATCH+ token matches (verified where drafted): a step runs on the
    bucket that holds the batch's most drafted chain, priced by the calibrated shares; where
    such chains rarely draft, one is chosen under a steep t(N) over the same chain from any
    match; it is timed as its twin verifying the whole chain, and its measured step is the
    twin's less the saving. Chains past MAX_TEXT_CHAIN are not candidates."""
    from specjax.choice import MAX_TEXT_CHAIN, timed_twin, verify_saving

    base = flat_profile()
    more = tuple(tuple(x + 1.2 for x in row) for row in base.tau_table)
    profile = dataclasses.replace(
        base, text_chains=(4, 8), text_table=(more, more), matched_table=(more, more),
        # Any match: the chain drafts all 8 nodes; from 3+ token matches: none on 3 steps in 4.
        text_drafted=(0.0,) * 8 + (1.0,), matched_drafted=(0.75,) + (0.0,) * 7 + (0.25,),
    )  # fmt: skip
    tree = TreeConfig.dynamic(3, 2, 4).with_text_chain(4, min_match=3)
    assert tree.text_buckets == (4, 6, 8)
    assert profile.verify_buckets(tree) == [(4, 0.75), (6, 0.0), (8, 0.25)]
    # Two rows: the bucket of 4 only when neither drafts.
    shares = profile.verify_buckets(tree, batch=2)
    assert shares == [(4, 0.5625), (6, 0.0), (8, pytest.approx(0.4375))]
    assert profile.verify_buckets(tree.with_text_chain(4, 1)) == [(4, 0.0), (6, 0.0), (8, 1.0)]
    assert profile.verify_buckets(tree.with_text_chain(4)) == [(8, 1.0)]
    steep = VerifyCosts(key="v", nodes=(1, 32), seconds=(1.0, 6.0))
    t = steep.t_verify
    assert verify_saving(profile, tree, steep, 1) == pytest.approx(0.75 * (t(8) - t(4)))
    draft = DraftCosts(key="d", kind="dynamic", topk=(4,), deep_depth=4,
                       shallow=(0.01,), deep=(0.04,))  # fmt: skip
    chosen = choose([profile], steep, draft).config.tree
    assert chosen.text_min_match == 3 and chosen.text_chain == 4, chosen
    assert all(t.text_chain <= MAX_TEXT_CHAIN for t in candidate_trees(profile, 64))
    assert timed_twin(chosen) == chosen.with_text_chain(4)
    timed = _best_trees([profile], steep, draft, count=3)
    assert any(t.text_min_match for t in timed)
    # Measured: its twin's step less the model's saving.
    twin_step = 5.0
    measured = (5.0, {timed_twin(chosen): twin_step})  # plain decoding measured slow
    c = choose([profile], steep, draft, measured=measured)
    assert c.config.tree.text_min_match == 3
    saving = verify_saving(profile, c.config.tree, steep, 1)
    assert saving > 0 and c.seconds_per_step == pytest.approx(twin_step - saving)


def test_measured_steps_override_the_model():
    profile = flat_profile()
    draft = DraftCosts(key="d", kind="dynamic", topk=(4,), deep_depth=4,
                       shallow=(0.01,), deep=(0.04,))  # fmt: skip
    flat = VerifyCosts(key="v", nodes=(1, 16), seconds=(1.0, 1.0))
    model_best = choose([profile], flat, draft).config.tree
    small = TreeConfig.dynamic(1, 1, 4)
    # Measured: the model's favourite is slow here, the small tree fast.
    measured = (1.0, {model_best: 10.0, small: 1.0})
    c = choose([profile], flat, draft, measured=measured)
    assert c.config.tree == small and c.candidates == 2
    # Profiles and timings describe the whole tree: a pre-verifier must not prune the choice.
    assert not c.config.pre_verify
    assert c.predicted_speedup == pytest.approx(profile.predict_tau(small) / 1.0)
    # Plain decoding measured faster than every timed step: fall back.
    assert choose([profile], flat, draft, measured=(0.1, {small: 1.0})).config is None
    # Predicted faster, but by less than the margin asked for: fall back too.
    speedup = c.predicted_speedup
    assert choose([profile], flat, draft, measured=measured, min_speedup=speedup * 0.99).config
    assert (
        choose([profile], flat, draft, measured=measured, min_speedup=speedup * 1.01).config is None
    )


class FakeSteps:
    """Stands in for autotune.CandidateSteps: `add` records the tree and returns a step time."""

    def __init__(self, seconds):
        self.seconds, self.trees = seconds, []

    def add(self, tree):
        self.trees.append(tree)
        return self.seconds(tree)


def test_first_timed_candidate_gives_the_overhead():
    """Unknown overhead: the best tree without it is timed first, its excess over draft +
    verify becomes the overhead, and the other candidates are ranked with it."""
    from specjax.choice import _best_trees, _time_best

    profile = flat_profile()
    draft = DraftCosts(key="d", kind="dynamic", topk=(4,), deep_depth=4,
                       shallow=(0.01,), deep=(0.04,))  # fmt: skip
    steep = VerifyCosts(key="v", nodes=(1, 16), seconds=(1.0, 2.5))
    first = _best_trees([profile], steep, draft, count=1)[0]
    overhead = 3.0  # a large fixed cost per step favours more tokens per step
    steps = FakeSteps(lambda t: draft.t_draft(t) + steep.t_verify(t.num_nodes) + overhead)
    ranked_with = _time_best(steps, [profile], steep, draft, count=3)
    assert ranked_with.overhead == pytest.approx(overhead)
    with_overhead = _best_trees([profile], steep, ranked_with, count=3)
    assert steps.trees == [first] + [t for t in with_overhead if t != first][:2]
    assert with_overhead[0].num_nodes > first.num_nodes  # the overhead moved the ranking
    # A known overhead is used as it is: no first timing apart from the rest.
    known = dataclasses.replace(draft, overhead=overhead)
    steps = FakeSteps(lambda t: 1.0)
    assert _time_best(steps, [profile], steep, known, count=2) == known
    assert steps.trees == with_overhead[:2]


def test_timed_candidates_include_the_best_of_each_top_k():
    """A top-8 profile predicted above a top-4 one fills the model's top three with top-8
    trees; the timed set still holds the best top-4 tree, so measured steps weigh both."""
    from specjax.choice import _best_trees, rank

    top4, top8 = flat_profile(topk=4, gain=1.5), flat_profile(topk=8, gain=2.5)
    draft = DraftCosts(key="d", kind="dynamic", topk=(4, 8), deep_depth=4,
                       shallow=(0.01, 0.01), deep=(0.04, 0.04), overhead=0.0)  # fmt: skip
    steep = VerifyCosts(key="v", nodes=(1, 16), seconds=(1.0, 2.5))
    ranked = [tree for _, tree, _, _ in rank([top4, top8], steep, draft)]
    assert all(tree.topk == 8 for tree in ranked[:3])  # the model alone would time no top-4
    timed = _best_trees([top4, top8], steep, draft, count=3)
    best4 = next(tree for tree in ranked if tree.topk == 4)
    assert timed[:1] == ranked[:1] and best4 in timed and len(set(timed)) == 3
    assert timed == sorted(timed, key=ranked.index)  # best predicted first
    assert _best_trees([top4, top8], steep, draft, count=1) == ranked[:1]


def test_the_first_timed_tree_covers_its_family():
    """Unknown overhead: the tree timed first (ranked without the overhead) keeps its slot and
    counts for its top-k, so the remaining slots still reach the other top-k. Before, it took
    a slot the family rule did not see, and the top-4 family went untimed here."""
    from specjax.choice import _best_trees, _time_best, rank

    top4, top8 = flat_profile(topk=4, gain=1.5), flat_profile(topk=8, gain=2.5)
    draft = DraftCosts(key="d", kind="dynamic", topk=(4, 8), deep_depth=4,
                       shallow=(0.01, 0.01), deep=(0.04, 0.04))  # fmt: skip
    steep = VerifyCosts(key="v", nodes=(1, 16), seconds=(1.0, 2.5))
    first = _best_trees([top4, top8], steep, draft, count=1)[0]
    steps = FakeSteps(lambda t: draft.t_draft(t) + steep.t_verify(t.num_nodes) + 3.0)
    ranked_with = _time_best(steps, [top4, top8], steep, draft, count=2)
    ranked = [tree for _, tree, _, _ in rank([top4, top8], steep, ranked_with)]
    # The case the rule is for: with the overhead the best tree is another top-8 tree.
    assert first.topk == 8 and ranked[0] != first and ranked[0].topk == 8
    best4 = next(tree for tree in ranked if tree.topk == 4)
    assert steps.trees == [first, best4]


def test_choice_falls_back_to_autoregressive_when_no_tree_pays():
    profile = flat_profile(gain=0.1)
    draft = DraftCosts(key="d", kind="dynamic", topk=(4,), deep_depth=4,
                       shallow=(0.5,), deep=(2.0,))  # fmt: skip
    costs = VerifyCosts(key="v", nodes=(1, 16), seconds=(1.0, 4.0))
    choice = choose([profile], costs, draft)
    assert choice.config is None and choice.predicted_speedup == 1.0
    assert choice.stats()["tree"] == "autoregressive"
    forced = choose([profile], costs, draft, allow_autoregressive=False)
    assert forced.config is not None and forced.predicted_speedup < 1


def test_static_probe_narrows_to_max_nodes():
    drafter = LMDrafter.self_draft(1)
    (probe,) = probes_for(drafter, 64)
    assert probe.num_nodes <= 64 and probe.max_depth == 8
    (small,) = probes_for(drafter, 8)
    assert small.num_nodes <= 8
    trees = list(candidate_trees(static_profile(), 64))
    assert TreeConfig(branching=(2, 1)) in trees and TreeConfig.chain(1) in trees


def test_a_pair_calibrated_for_fewer_nodes_is_calibrated_again(tmp_path, monkeypatch):
    """A pair profile kept by a call with a small max_nodes has a narrow probe: a later call
    allowing more nodes calibrates its own probe instead of silently choosing within the narrow
    one; a call within the kept probe calibrates nothing."""
    import specjax.choice as choice

    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    target = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    drafter = LMDrafter.self_draft(1)
    write_profiles(choice.pair_profile_file(target, drafter, "greedy"), [static_profile()])
    calibrated = []

    def fake_calibrate(target, drafter, rows, *, probe, **kwargs):
        calibrated.append(probe)
        return dataclasses.replace(static_profile(), probe=probe.branching)

    monkeypatch.setattr(choice, "calibrate", fake_calibrate)
    greedy = specjax.SamplingConfig()
    kept = choice.find_profiles(target, drafter, [[1, 2, 3]], sampling=greedy, max_nodes=4)
    assert calibrated == [] and [p.probe for p in kept] == [(2, 1)]
    # Prompts that leave no room to calibrate wider probes keep choosing within the kept ones.
    long = [[1] * (TINY.max_seq_len - 12)]
    narrow = choice.find_profiles(target, drafter, long, sampling=greedy, max_nodes=16)
    assert calibrated == [] and [p.probe for p in narrow] == [(2, 1)]
    wide = choice.find_profiles(target, drafter, [[1, 2, 3]], sampling=greedy, max_nodes=16)
    assert calibrated == list(probes_for(drafter, 16)) and calibrated[0].num_nodes > 5
    assert [p.probe for p in wide] == [calibrated[0].branching]
    # The wider profile is kept: the same call again calibrates nothing.
    choice.find_profiles(target, drafter, [[1, 2, 3]], sampling=greedy, max_nodes=16)
    assert len(calibrated) == 1


def test_cost_context_follows_the_call():
    """Costs are measured near the call's cache length, rounded to a power of two (a few cost
    sets per machine), within the model's room for the largest tree."""
    from types import SimpleNamespace

    from specjax.choice import MIN_COST_CONTEXT, cost_context

    model = SimpleNamespace(config=SimpleNamespace(max_seq_len=2048))
    auto = AutoSpecConfig()
    assert cost_context(model, auto) == MIN_COST_CONTEXT
    assert cost_context(model, auto, 10.0) == MIN_COST_CONTEXT
    assert cost_context(model, auto, 90.0) == 64
    assert cost_context(model, auto, 100.0) == 128
    assert cost_context(model, auto, 300.0) == 256
    assert cost_context(model, auto, 380.0) == 512
    assert cost_context(model, AutoSpecConfig(context=200), 10.0) == 200  # explicit wins
    short = SimpleNamespace(config=SimpleNamespace(max_seq_len=512))
    assert cost_context(short, auto, 1000.0) == 512 - 64 - 16  # room for 64 nodes after it
    with pytest.raises(ValueError, match="context <= 432"):  # an explicit context: never lowered
        cost_context(short, AutoSpecConfig(context=500))


def test_default_call_reads_kept_costs_and_profiles(tmp_path, monkeypatch):
    """With costs and a profile already on disk, the default call measures nothing, runs the
    tree the kept numbers favour, reports it and gives generate's greedy tokens."""
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    target = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    drafter = LMDrafter.self_draft(1)
    auto = AutoSpecConfig(max_nodes=4, verbose=False, timed_candidates=0, adapt=False)
    keep_costs(tmp_path, target, drafter, auto)
    before = sorted(tmp_path.rglob("*.json"))
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    out = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=12, config=auto)
    ref = specjax.generate(target, prompts, max_new_tokens=12)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert sorted(tmp_path.rglob("*.json")) == before  # nothing measured or calibrated
    # Flat verification cost: of the (2, 1) probe's trees within 4 nodes ((1,), (2,), (1, 1)),
    # the chain of 2 accepts most: tau 1 + 0.5 + 0.5 * 2/3, in 1 + 2 x 0.01 seconds.
    assert out.stats["tree"] == "branching(1,1)"
    tau = 1 + 0.5 + 0.5 * 2 / 3
    assert out.stats["predicted_tau"] == pytest.approx(tau, abs=1e-3)
    assert out.stats["predicted_step_speedup"] == pytest.approx(tau / 1.02, abs=1e-3)
    # The whole call: the kept prefill and 12 plain tokens against the prefill, the call's
    # choosing (wall time, so only its sign is asserted; that it measured nothing is the file
    # check above) and 12 / tau steps.
    choose_s = out.stats["choose_s"]
    assert out.stats["prefill_s"] == PREFILL_S and choose_s > 0
    call = (PREFILL_S + 12 * 1.0) / (PREFILL_S + choose_s + 12 / tau * 1.02)
    assert out.stats["predicted_speedup"] == pytest.approx(call, rel=1e-3)
    # The call falls back to plain steps below the tree's break-even tau, step over token cost;
    # this pair stays above it.
    assert out.stats["break_even_tau"] == pytest.approx(1.02, abs=1e-6)
    assert int(np.asarray(out.stats["plain_steps"]).sum()) == 0
    no_fallback = dataclasses.replace(auto, fallback=False)
    off = specjax.speculative_generate(
        target, drafter, prompts, max_new_tokens=12, config=no_fallback
    )
    np.testing.assert_array_equal(np.asarray(off.tokens), np.asarray(ref.tokens))
    assert "plain_steps" in off.stats


def test_auto_calibrates_on_the_prompts_not_their_padding(monkeypatch):
    """An int array of prompts is padded to the prompt bucket like ragged lists are: the choice
    (and a first calibration) sees each prompt's own tokens either way."""
    import specjax.api as api

    class Chosen(Exception):
        pass

    seen = []

    def resolve_auto(target, drafter, rows, **kwargs):
        seen.append([list(map(int, r)) for r in rows])
        raise Chosen

    monkeypatch.setattr(api, "resolve_auto", resolve_auto)
    target = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    auto = AutoSpecConfig(verbose=False)
    for prompts in ([[1, 2, 3], [4, 5, 6]], np.array([[1, 2, 3], [4, 5, 6]])):
        with pytest.raises(Chosen):
            specjax.speculative_generate(target, LMDrafter.self_draft(1), prompts,
                                         max_new_tokens=4, config=auto)  # fmt: skip
    assert seen == [[[1, 2, 3], [4, 5, 6]]] * 2
    # Keys are checked before the choice measures anything.
    with pytest.raises(ValueError, match="key must be one key or 2 per-row keys"):
        specjax.speculative_generate(target, LMDrafter.self_draft(1), [[1, 2], [3]],
                                     max_new_tokens=4, config=auto,
                                     key=jax.random.split(jax.random.key(0), 3))  # fmt: skip
    assert len(seen) == 2


def test_auto_settings_that_cannot_hold_are_refused():
    for setting, named in (
        ({"max_nodes": 1}, "max_nodes"),
        ({"max_batch_nodes": 1}, "max_batch_nodes"),
        ({"min_speedup": 0.95}, "allow_autoregressive=False"),
    ):
        with pytest.raises(ValueError, match=named):
            AutoSpecConfig(**setting)


def test_chosen_config_falls_back_below_its_break_even_tau():
    chosen = SpecConfig(tree=TreeConfig.chain(3))
    choice = Choice(config=chosen, predicted_tau=2.4, seconds_per_step=0.05,
                    ar_seconds_per_token=0.0320, candidates=5)  # fmt: skip
    assert choice.break_even_tau == pytest.approx(1.5625)
    assert choice.with_fallback() == dataclasses.replace(chosen, fallback_tau=1.562)


@pytest.mark.slow
def test_default_call_chooses_reports_and_stays_exact(tmp_path, monkeypatch):
    """speculative_generate's default (SpecConfig.auto()): calibrates the pair on the call's
    prompts, measures costs into $SPECJAX_CACHE, chooses, and gives generate's greedy tokens."""
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    target = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    drafter = LMDrafter.self_draft(1)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    auto = AutoSpecConfig(
        max_nodes=4, verbose=False, allow_autoregressive=False, timed_candidates=1
    )
    ref = specjax.generate(target, prompts, max_new_tokens=12)
    out = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=12, config=auto)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert out.stats["tree"].startswith("branching(")
    assert out.stats["predicted_tau"] >= 1 and math.isfinite(out.stats["predicted_speedup"])
    assert list((tmp_path / "acceptance").glob("*.json"))
    # target, drafter and the timed candidate steps
    assert len(list((tmp_path / "costs").glob("*.json"))) == 3
    # With the autoregressive fallback allowed the output is the same either way.
    out2 = specjax.speculative_generate(
        target, drafter, prompts, max_new_tokens=12, config=SpecConfig.auto(
            verbose=False, max_nodes=4, timed_candidates=1)
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(out2.tokens), np.asarray(ref.tokens))
    assert len(list((tmp_path / "costs").glob("*.json"))) == 3  # measured once
