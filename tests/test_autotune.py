"""The target cost model (specjax.autotune): interpolation, the on-disk cache and its key.
No timing is asserted: measured seconds depend on the machine."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

import specjax
from specjax import autotune
from specjax.config import TINY


@pytest.fixture(scope="module")
def tiny_target():
    return specjax.Llama(TINY, rngs=nnx.Rngs(0))


def test_t_verify_interpolates_and_extrapolates():
    costs = autotune.VerifyCosts(key="k", nodes=(1, 4, 8), seconds=(1.0, 2.5, 4.5))
    assert costs.t_verify(1) == 1.0
    assert costs.t_verify(2) == pytest.approx(1.5)
    assert costs.t_verify(6) == pytest.approx(3.5)
    assert costs.t_verify(16) == pytest.approx(8.5)  # slope of the last segment: 0.5 per node
    assert costs.relative(8) == pytest.approx(4.5)
    with pytest.raises(ValueError, match="at least one node"):
        costs.t_verify(0)


def test_costs_are_measured_once_then_read_from_disk(tiny_target, tmp_path):
    lines = []
    first = autotune.verify_costs(
        tiny_target, context=16, nodes=(1, 4), reps=1, folder=tmp_path, progress=lines.append
    )
    assert first.nodes == (1, 4) and len(first.seconds) == 2
    assert all(s > 0 for s in first.seconds)
    assert len(lines) == 3 and "4 node(s)" in lines[1] and "autoregressive" in lines[2]
    assert first.ar_token > 0
    files = list((tmp_path / "costs").glob("*.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text())["key"] == first.key

    lines.clear()
    again = autotune.verify_costs(
        tiny_target, context=16, nodes=(4, 1), reps=1, folder=tmp_path, progress=lines.append
    )
    assert again == first and not lines  # read back, nothing measured

    # A count the file lacks is timed alone and added to it; the file keeps its grid.
    other = autotune.verify_costs(
        tiny_target, context=16, nodes=(1, 2), reps=1, folder=tmp_path, progress=lines.append
    )
    assert other.nodes == (1, 2, 4) and other.requested == (1, 4)
    assert len(lines) == 1 and "2 node(s)" in lines[0]
    assert other.t_verify(1) == first.t_verify(1) and other.t_verify(4) == first.t_verify(4)
    lines.clear()
    assert autotune.verify_costs(
        tiny_target, context=16, nodes=(4, 1), reps=1, folder=tmp_path, progress=lines.append
    ) == other and not lines  # fmt: skip
    # Another batch is measured anew.
    batch2 = autotune.verify_costs(
        tiny_target, batch=2, context=16, nodes=(1,), reps=1, folder=tmp_path, progress=None
    )
    assert batch2.key != first.key


def test_plain_decoding_is_timed_only_when_wanted(tiny_target, tmp_path):
    """SpecConfig.auto() skips the AR timing when it times candidate steps (which measure plain
    decoding alongside); a later caller that wants it gets it measured and kept."""
    lines = []
    kw = dict(context=16, nodes=(1, 2), reps=1, folder=tmp_path, progress=lines.append)
    without = autotune.verify_costs(tiny_target, with_ar=False, **kw)
    assert without.ar_token == 0 and not any("autoregressive" in x for x in lines)
    assert without.t_autoregressive == without.t_verify(1)  # the estimate while unknown
    lines.clear()
    assert autotune.verify_costs(tiny_target, with_ar=False, **kw) == without and not lines
    with_ar = autotune.verify_costs(tiny_target, **kw)
    assert with_ar.ar_token > 0 and any("autoregressive" in x for x in lines)
    lines.clear()
    assert autotune.verify_costs(tiny_target, with_ar=False, **kw) == with_ar and not lines


def test_grid_stops_where_no_larger_tree_can_pay(tiny_target, tmp_path):
    """With a stop ratio the grid ends at the first N whose forward costs that many one-node
    forwards: here (a ratio no forward is under) right after N=2. The file keeps the grid asked
    for, so the same request reads it back and another stop rule measures anew."""
    lines = []
    kw = dict(context=16, nodes=(1, 2, 4, 8), reps=1, folder=tmp_path, with_ar=False)
    stopped = autotune.verify_costs(tiny_target, stop_ratio=1e-9, progress=lines.append, **kw)
    assert stopped.nodes == (1, 2) and stopped.requested == (1, 2, 4, 8)
    assert "grid stops here" in lines[-1] and not any("4 node(s)" in x for x in lines)
    assert stopped.t_verify(8) >= stopped.t_verify(2)  # extrapolated past the last point
    lines.clear()
    assert autotune.verify_costs(tiny_target, stop_ratio=1e-9, progress=lines.append, **kw) == (
        stopped
    )
    assert not lines
    # A plain grid (no stop rule) over the same counts: only the counts past the stop are
    # timed, and the file still answers the stopped request.
    whole = autotune.verify_costs(tiny_target, progress=lines.append, **kw)
    assert whole.nodes == (1, 2, 4, 8) and len(lines) == 2 and "4 node(s)" in lines[0]
    assert whole.requested == (1, 2, 4, 8) and whole.stop_ratio == 1e-9
    lines.clear()
    again = autotune.verify_costs(tiny_target, stop_ratio=1e-9, progress=lines.append, **kw)
    assert again == whole and not lines


def test_a_stop_rule_is_served_by_a_grid_that_stopped_later(tiny_target, tmp_path, monkeypatch):
    """Two drafters of one target ask for the same grid with their own stop ratios: a file that
    stopped later serves the earlier stop; a later stop is measured to itself, and that file
    then serves both; a file that reached the grid's last count serves every stop."""
    calls = _fake_grid(monkeypatch, lambda n: 1e-3 * n)
    kw = dict(context=16, nodes=(1, 2, 4, 8, 16), reps=1, folder=tmp_path, with_ar=False,
              skip_stairs=True, progress=None)  # fmt: skip
    early = autotune.verify_costs(tiny_target, stop_ratio=3.0, **kw)
    assert early.nodes[-1] == 4 and calls == [1, 2, 4]
    calls.clear()
    late = autotune.verify_costs(tiny_target, stop_ratio=7.0, **kw)
    assert late.nodes[-1] == 8 and late.stop_ratio == 7.0 and calls
    calls.clear()
    for ratio in (3.0, 7.0, 5.0):
        assert autotune.verify_costs(tiny_target, stop_ratio=ratio, **kw) == late
    assert not calls
    # an earlier stop measured after a later one keeps the later one's reach
    calls.clear()
    assert autotune.verify_costs(tiny_target, stop_ratio=12.0, **kw).nodes[-1] == 16
    assert autotune.verify_costs(tiny_target, stop_ratio=9.0, **kw).nodes[-1] == 16
    # that grid reached its last count: any later stop is served by it, nothing timed
    calls.clear()
    assert autotune.verify_costs(tiny_target, stop_ratio=40.0, **kw).stop_ratio == 12.0
    assert not calls


def test_a_later_stop_continues_the_grid_where_it_stopped(tiny_target, tmp_path, monkeypatch):
    """The default call's grid (no skipped stairs): a later stop times only the counts past the
    earlier stop, against the file's own t(1), and the file then carries the later stop; a stop
    that would have ended at the same count times nothing."""
    calls = _fake_grid(monkeypatch, lambda n: 1e-3 * n)
    kw = dict(context=16, nodes=(1, 2, 4, 8, 16, 32), reps=1, folder=tmp_path, with_ar=False,
              progress=None)  # fmt: skip
    assert autotune.verify_costs(tiny_target, stop_ratio=3.0, **kw).nodes == (1, 2, 4)
    calls.clear()
    same_end = autotune.verify_costs(tiny_target, stop_ratio=3.5, **kw)
    assert same_end.nodes == (1, 2, 4) and same_end.stop_ratio == 3.5 and not calls
    later = autotune.verify_costs(tiny_target, stop_ratio=7.0, **kw)
    assert calls == [8] and later.nodes == (1, 2, 4, 8) and later.stop_ratio == 7.0
    np.testing.assert_allclose(later.seconds, (1e-3, 2e-3, 4e-3, 8e-3))
    calls.clear()
    assert autotune.verify_costs(tiny_target, stop_ratio=5.0, **kw) == later and not calls


def _fake_grid(monkeypatch, seconds_of):
    """sized_loop replaced by loops whose per-iteration time is seconds_of(N); returns the list
    of N in the order they are timed."""
    calls = []

    class FakeLoop:
        def __init__(self, n_nodes):
            self.n_nodes, self.single, self.n = n_nodes, 1e-3, 1

        def per_iteration(self):
            calls.append(self.n_nodes)
            return seconds_of(self.n_nodes)

    monkeypatch.setattr(autotune, "sized_loop", lambda body, *a: FakeLoop(body.keywords["n"]))
    return calls


def test_grid_is_timed_in_interleaved_rounds(tiny_target, monkeypatch):
    """Every N is timed once per round, round after round, and t(N) is the median of its
    rounds: a slow spell (here the whole second round) does not move any t(N)."""

    def seconds_of(n):
        slow = len(calls) in range(4, 7)  # the three calls of the second round
        return n * 1e-3 * (100 if slow else 1)

    calls = _fake_grid(monkeypatch, seconds_of)
    costs = autotune.measure_verify_costs(
        tiny_target, context=16, nodes=(1, 2, 4), reps=3, with_ar=False
    )
    assert calls == [1, 2, 4] * 3
    np.testing.assert_allclose(costs.seconds, (1e-3, 2e-3, 4e-3))


def test_the_interior_of_a_stair_is_not_timed(tiny_target, monkeypatch):
    """With skip_stairs the powers of two are timed first, then each gap's middle: where it costs
    at least the gap's top (SmolLM2's staircase on a 2-core CPU: 5-7 and 9-15 nodes cost more
    than 8 and 16) the gap's other counts are not timed, and they are priced at the dearest
    count timed in the gap. A gap whose middle is cheaper than its top is timed whole."""
    stair = {1: 1.0, 2: 1.1, 3: 1.15, 4: 1.2, 5: 1.5, 6: 1.5, 7: 1.5, 8: 1.3, 16: 1.5}
    calls = _fake_grid(monkeypatch, lambda n: 1e-3 * stair.get(n, 1.9))
    lines = []
    kw = dict(context=16, nodes=tuple(range(1, 17)), reps=1, with_ar=False)
    costs = autotune.measure_verify_costs(tiny_target, skip_stairs=True, progress=lines.append,
                                          **kw)  # fmt: skip
    assert calls == [1, 2, 4, 8, 16, 3, 6, 12]
    assert costs.nodes == (1, 2, 3, 4, 6, 8, 12, 16) and costs.stairs == ((4, 8), (8, 16))
    assert costs.requested == tuple(range(1, 17)) and costs.skip_stairs
    assert costs.t_verify(5) == pytest.approx(1.5e-3) and costs.t_verify(7) == pytest.approx(1.5e-3)
    assert costs.t_verify(10) == pytest.approx(1.9e-3)  # the middle's cost, above the top's
    assert costs.t_verify(3) == pytest.approx(1.15e-3)
    assert any("a stair, the rest of 9-15 nodes is not timed" in x for x in lines)
    again = autotune.VerifyCosts.from_json(json.loads(json.dumps(costs.to_json())))
    assert again == costs

    calls = _fake_grid(monkeypatch, lambda n: 1e-3 * n)  # cost grows through every gap
    linear = autotune.measure_verify_costs(
        tiny_target, skip_stairs=True, progress=None, **dict(kw, nodes=(1, 2, 3, 4, 5, 6, 7, 8))
    )
    assert sorted(calls) == list(range(1, 9)) and linear.stairs == ()
    calls = _fake_grid(monkeypatch, lambda n: 1e-3 * stair.get(n, 1.9))
    # without skip_stairs: every count, in ascending order
    whole = autotune.measure_verify_costs(tiny_target, progress=None, **kw)
    assert calls == list(range(1, 17)) and whole.nodes == kw["nodes"] and not whole.skip_stairs


def test_a_plain_grid_is_served_by_a_finer_grids_file(tiny_target, tmp_path, monkeypatch):
    """The default call's grid (fine, stairs skipped, a stop rule) and the pre-verifier's replay
    grid (the powers of two) at one key: the replay reads the counts the call timed and times
    only those it lacks, cached at the stored grid's length; neither request then measures
    again, so neither file overwrites the other."""
    calls = _fake_grid(monkeypatch, lambda n: 1e-3 * n)
    rooms = []
    real_init_cache = autotune.init_cache

    def init_cache(cfg, batch, length):
        rooms.append(length)
        return real_init_cache(cfg, batch, length)

    monkeypatch.setattr(autotune, "init_cache", init_cache)
    fine = dict(nodes=tuple(range(1, 17)), stop_ratio=5.5, skip_stairs=True)
    kw = dict(context=16, reps=1, folder=tmp_path, with_ar=False, progress=None)
    call = autotune.verify_costs(tiny_target, **fine, **kw)
    assert 8 in call.nodes and 16 not in call.nodes  # stopped at t(8) = 8 t(1) >= 5.5 t(1)
    calls.clear()
    rooms.clear()

    served = autotune.verify_costs(tiny_target, nodes=(1, 2, 4, 8), **kw)
    assert served == call and not calls  # every count was timed by the call
    merged = autotune.verify_costs(tiny_target, nodes=(1, 2, 4, 8, 16), **kw)
    assert calls == [16] and rooms == [16 + 16]  # in the cache the call's grid was timed in
    assert merged.t_verify(16) == pytest.approx(16e-3) and merged.t_verify(8) == call.t_verify(8)
    assert (merged.requested, merged.stop_ratio, merged.skip_stairs, merged.stairs) == (
        call.requested, call.stop_ratio, call.skip_stairs, call.stairs,
    )  # fmt: skip
    calls.clear()
    assert autotune.verify_costs(tiny_target, **fine, **kw) == merged and not calls
    assert autotune.verify_costs(tiny_target, nodes=(1, 16), **kw) == merged and not calls
    wider = autotune.verify_costs(tiny_target, nodes=(1, 32), **kw)
    assert calls == [32] and rooms[-1] == 16 + 32 and wider.nodes[-1] == 32
    # The same grid with a later stop is measured again (to that stop).
    calls.clear()
    autotune.verify_costs(tiny_target, **dict(fine, stop_ratio=40.0), **kw)
    assert calls[:3] == [1, 2, 4]


def test_draft_costs_time_only_the_shapes_the_file_lacks(tiny_target, tmp_path, monkeypatch):
    """The default call times top-4 and top-8 with the step overhead; the pre-verifier's
    replay then asks for top-2 as well: only top-2 is timed, and the file keeps the rest."""
    from test_feature_drafter import make_drafter

    drafter = make_drafter("eagle", tiny_target)
    timed = []

    def fake_propose(target, drafter, tree, *, batch, context, reps, with_step=False):
        timed.append((tree.topk, tree.max_depth, with_step))
        seconds = 1e-3 * tree.topk * tree.max_depth
        return seconds, (seconds + 5e-3 if with_step else None)

    monkeypatch.setattr(autotune, "_time_propose", fake_propose)
    verify = autotune.VerifyCosts(key="k", nodes=(1, 8), seconds=(1e-3, 2e-3))
    kw = dict(context=16, folder=tmp_path, progress=None)
    call = autotune.draft_costs(tiny_target, drafter, verify, topks=(4, 8), **kw)
    assert call.topk == (4, 8) and call.overhead is not None
    timed.clear()
    replay = autotune.draft_costs(tiny_target, drafter, verify, topks=(2, 4, 8),
                                  with_overhead=False, **kw)  # fmt: skip
    assert sorted(timed) == [(2, 1, False), (2, 8, False)]
    assert replay.topk == (2, 4, 8) and replay.overhead == call.overhead
    tree = specjax.TreeConfig.dynamic(4, 3, 4)
    assert replay.t_draft(tree) == call.t_draft(tree)
    assert replay.t_draft(specjax.TreeConfig.dynamic(2, 3, 2)) == pytest.approx(6e-3)
    timed.clear()
    assert autotune.draft_costs(tiny_target, drafter, verify, topks=(4, 8), **kw) == replay
    assert not timed
    with pytest.raises(ValueError, match="cannot merge"):
        replay.with_points(
            autotune.DraftCosts(key="k", kind="static", nodes=(2,), per_depth=(1.0,))
        )


def test_key_follows_the_weights(tiny_target):
    other = specjax.Llama(TINY, rngs=nnx.Rngs(1))
    assert autotune.cost_key(tiny_target, batch=1, context=16) != autotune.cost_key(
        other, batch=1, context=16
    )


def test_context_beyond_the_model_is_refused(tiny_target):
    with pytest.raises(ValueError, match="max_seq_len"):
        autotune.measure_verify_costs(tiny_target, context=TINY.max_seq_len, nodes=(1,))


def test_plain_decoding_step_is_generates_state_at_a_fixed_context(tiny_target):
    """The timed body runs in a stand-in for generate's state after its prefill (its structure,
    shapes, dtypes and committed lengths, every row live) and puts the context back, so every
    timed iteration costs the same and no row finishes."""
    from specjax.config import SamplingConfig
    from specjax.decode import prepare_keys, prepare_prompts, start_decoding

    body, params, state = autotune.plain_decoding_step(tiny_target, batch=2, context=16)
    ids, lens = prepare_prompts(
        autotune.filler_prompts(tiny_target, 2, 16), TINY, autotune.AR_TOKENS
    )
    real, _ = start_decoding(
        tiny_target, jax.numpy.asarray(ids), jax.numpy.asarray(lens), prepare_keys(None, 2),
        jax.numpy.int32(-1), max_new_tokens=autotune.AR_TOKENS, sampling=SamplingConfig(),
        attn_impl="auto", record_hidden=False,
    )  # fmt: skip
    assert jax.tree.structure(state) == jax.tree.structure(real)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == jax.tree.map(
        lambda x: (x.shape, x.dtype), real
    )
    for name in ("step", "rows", "done"):
        np.testing.assert_array_equal(np.asarray(getattr(state, name)), getattr(real, name))
    np.testing.assert_array_equal(np.asarray(state.cache.lengths), np.asarray(lens))
    after = jax.jit(body)(params, state)
    np.testing.assert_array_equal(np.asarray(after.cache.lengths), np.asarray(lens))
    assert int(after.step) == int(state.step) and not np.asarray(after.done).any()


def test_timed_loop_takes_its_fixed_cost_off_and_never_returns_zero(tiny_target):
    """Every timing is net of the zero-iteration call (dispatch, the copy of the carried state);
    when noise puts that above a whole call, the call's own average stands in."""
    body, params, state = autotune.plain_decoding_step(tiny_target, batch=1, context=16)
    timed = autotune.sized_loop(body, params, state, call_s=0.01)
    assert timed.n >= 1 and timed.fixed > 0 and timed.single > 0
    assert timed.per_iteration() > 0
    timed.fixed = 1e3  # more than any call: the fallback
    assert 0 < timed.per_iteration() < 1e3 / timed.n


def test_candidate_steps_are_compared_within_rounds():
    """A step's cost is its ratio to plain decoding in the same round: a round where another
    process slowed both sides (round 2) and one where it slowed the step alone (round 3) leave
    the ratio of 1.5 standing. Medians taken apart would give 300 / 105 = 2.9."""
    ar, steps = autotune.paired_medians([0.100, 0.200, 0.105], {"tree": [0.150, 0.300, 0.330]})
    assert ar == pytest.approx(0.105)
    assert steps["tree"] / ar == pytest.approx(1.5)


def test_step_timing_state_stands_in_for_a_real_prefill(tiny_target):
    """Whole steps are timed in a state built from zeros instead of a target prefill: it must be
    the real state's structure, shapes and dtypes (else another program would be timed), with
    the committed lengths a prefill leaves, and a step must run in it."""
    from specjax.config import SamplingConfig, SpecConfig, TreeConfig
    from specjax.drafters import LMDrafter
    from specjax.speculative import SteppedRun

    drafter = LMDrafter.self_draft(1)
    config = SpecConfig(tree=TreeConfig(branching=(2, 1)), pre_verify=False)
    body, params, state = autotune._step_body(tiny_target, drafter, config, batch=2, context=16)
    real = SteppedRun(
        tiny_target, drafter, autotune.filler_prompts(tiny_target, 2, 16),
        max_new_tokens=autotune.COST_NEW_TOKENS, config=config, sampling=SamplingConfig(),
    ).state  # fmt: skip
    shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
    assert jax.tree.structure(state) == jax.tree.structure(real)
    assert shapes == jax.tree.map(lambda x: (x.shape, x.dtype), real)
    np.testing.assert_array_equal(
        np.asarray(state.verifier_state.lengths), np.asarray(real.verifier_state.lengths)
    )
    after = jax.jit(body)(params, state)
    assert jax.tree.structure(after) == jax.tree.structure(state)


def test_timed_steps_keep_one_ledger_per_drafter_batch_and_context(
    tiny_target, tmp_path, monkeypatch
):
    """A tree timed once is not timed again at the same drafter, batch and context: a later
    call that asks for it gets the ratio the ledger holds (even where a new timing would read
    otherwise), only its new trees are compiled and timed, and a call with nothing new times
    nothing, plain decoding included."""
    from specjax.config import TreeConfig

    a, b, c = (TreeConfig.dynamic(n, 2, 4) for n in (3, 5, 7))
    speed = {("plain",): 0.1, a: 0.2, b: 0.3, c: 0.4}
    timed = []

    class FakeLoop:
        def __init__(self, what):
            self.what = what

        def per_iteration(self):
            timed.append(self.what)
            return speed[self.what]

    monkeypatch.setattr(autotune, "sized_loop", lambda body, params, init, call_s: FakeLoop(body))
    monkeypatch.setattr(autotune, "plain_decoding_step", lambda *a, **k: (("plain",), None, None))
    monkeypatch.setattr(autotune, "_step_body", lambda t, d, config, **k: (config.tree, None, None))

    def asking(*trees):
        return lambda steps: [steps.add(tree) for tree in trees]

    kw = dict(batch=1, context=16, folder=tmp_path, progress=None)
    ar, seconds = autotune.timed_steps(tiny_target, tiny_target, asking(a, b), **kw)
    assert ar == pytest.approx(0.1) and set(seconds) == {a, b}
    assert seconds[b] == pytest.approx(0.3)
    speed.update({("plain",): 0.2, b: 1.0})  # a slower spell; b would now read 5x plain
    timed.clear()
    ar, seconds = autotune.timed_steps(tiny_target, tiny_target, asking(b, c), **kw)
    assert b not in timed and c in timed  # only the new tree is timed
    assert ar == pytest.approx(0.2)
    assert seconds[b] / ar == pytest.approx(3.0) and seconds[c] / ar == pytest.approx(2.0)
    timed.clear()
    ar, seconds = autotune.timed_steps(tiny_target, tiny_target, asking(a, c), **kw)
    assert not timed and ar == pytest.approx(0.2)  # nothing new: nothing timed
    assert seconds[a] / ar == pytest.approx(2.0) and set(seconds) == {a, c}
    # Another context keeps its own ledger.
    autotune.timed_steps(tiny_target, tiny_target, asking(a), **{**kw, "context": 32})
    assert a in timed


def test_timed_steps_confirm_the_trees_a_choice_hinges_on(tiny_target, tmp_path, monkeypatch):
    """confirm names trees; those with one reading are timed again, and a tree whose two
    readings disagree by more than CONFIRM_SPREAD a third time, its ratio then the median. A
    tree confirmed once keeps its readings in the ledger and is not timed again; trees confirm
    does not name keep their single reading. A ledger of one ratio a tree is still read."""
    from specjax.config import TreeConfig

    a, b, c = (TreeConfig.dynamic(n, 2, 4) for n in (3, 5, 7))
    # Each tree's successive readings (step seconds against plain decoding's 0.1 s).
    script = {a: [0.2, 0.21], b: [0.05, 0.15, 0.16], c: [0.3]}
    timed = []

    class FakeLoop:
        def __init__(self, what):
            self.what, self.calls = what, 0

        def per_iteration(self):
            if self.what == ("plain",):
                return 0.1
            timed.append(self.what)
            # One compile-time estimate, then one value per measurement (rounds=1 below).
            value = script[self.what][max(self.calls - 1, 0)]
            self.calls += 1
            return value

    monkeypatch.setattr(autotune, "CANDIDATE_ROUNDS", 1)
    monkeypatch.setattr(autotune.CandidateSteps.measure, "__defaults__", (1,))
    monkeypatch.setattr(autotune, "sized_loop", lambda body, params, init, call_s: FakeLoop(body))
    monkeypatch.setattr(autotune, "plain_decoding_step", lambda *a, **k: (("plain",), None, None))
    monkeypatch.setattr(autotune, "_step_body", lambda t, d, config, **k: (config.tree, None, None))
    asked = []

    def confirm(t_ar, seconds):
        asked.append(dict(seconds))
        return [a, b]  # c is never named

    kw = dict(batch=1, context=16, folder=tmp_path, progress=None)
    select = lambda steps: [steps.add(t) for t in (a, b, c)]  # noqa: E731
    ar, seconds = autotune.timed_steps(tiny_target, tiny_target, select, confirm=confirm, **kw)
    # First measurement: b read 0.5 plain tokens a step; confirmed at 1.5 (3x apart), so a
    # third reading (1.6) settles it at the median; a's two readings agree within 10%.
    assert asked[0][b] / ar == pytest.approx(0.5)
    assert seconds[a] / ar == pytest.approx(2.05)
    assert seconds[b] / ar == pytest.approx(1.5)
    assert seconds[c] / ar == pytest.approx(3.0)
    assert len(asked) == autotune.CONFIRM_PASSES == 2  # one ask before each pass
    data = json.loads(next(tmp_path.rglob("steps-*.json")).read_text())
    assert sorted(map(len, data["readings"])) == [1, 2, 3]
    # Every named tree is settled now: nothing is timed again, plain decoding included.
    timed.clear()
    ar, seconds = autotune.timed_steps(tiny_target, tiny_target, select, confirm=confirm, **kw)
    assert not timed and seconds[b] / ar == pytest.approx(1.5)
    # A ledger written before readings were kept (one ratio a tree) is read as one reading.
    path = next(tmp_path.rglob("steps-*.json"))
    old = {k: v for k, v in data.items() if k != "readings"}
    path.write_text(json.dumps(old))
    _, seconds = autotune.timed_steps(tiny_target, tiny_target, select, **kw)
    assert not timed and seconds[b] / ar == pytest.approx(1.5)
