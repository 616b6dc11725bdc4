"""A pre-verifier's thresholds chosen again under the costs of the machine it runs on
(specjax.pre_verifier_local, specjax.pre_verifier_replay): the replay prunes only where pruning
pays under the given costs, the recorded steps and the choice round-trip through disk, the
caller's own thresholds are never replaced, and an explicit call runs with the new thresholds
with its output unchanged."""

import numpy as np
import pytest
from test_feature_drafter import make_drafter
from test_pre_verifier import PROMPTS, random_pre_verifier, target  # noqa: F401 (fixture)

import specjax
from specjax import autotune, pre_verifier_local
from specjax import pre_verifier_replay as pvr
from specjax.choice import tree_label
from specjax.config import SpecConfig, TreeConfig
from specjax.models.pre_verifier import REPLAY, load_pre_verifier, save_pre_verifier
from specjax.tree import NODE_STATS

COL = {name: i for i, name in enumerate(NODE_STATS)}


class LogqPreVerifier:
    """Predicts acceptance from the draft probability alone: ~1 above 0.5, ~0 below."""

    def logits(self, stats):
        return 40.0 * (np.exp(np.asarray(stats)[..., COL["logq"]]) - 0.5)


def records(n: int = 6) -> list[pvr.StepRecord]:
    """Root, two children (q 0.9 and 0.1) and a grandchild under each (q 0.9 and 0.1); the target
    accepts the likely child and its likely child."""
    stats = np.zeros((5, len(NODE_STATS)), np.float32)
    stats[:, COL["depth"]] = [0, 1, 1, 2, 2]
    stats[:, COL["logq"]] = np.log([1.0, 0.9, 0.1, 0.9, 0.1])
    stats[:, COL["rank"]] = [0, 0, 1, 0, 0]
    stats[:, COL["cum_logq"]] = np.log([1.0, 0.9, 0.1, 0.81, 0.01])
    return [
        pvr.StepRecord(
            parents=np.array([-1, 0, 0, 1, 2]),
            valid=np.ones(5, bool),
            node_stats=stats,
            path=np.array([1, 3]),
        )  # fmt: skip
        for _ in range(n)
    ]


def test_replay_prunes_only_where_verifying_fewer_nodes_is_cheaper():
    recs = records()
    steep = pvr.replay_thresholds(
        LogqPreVerifier(), recs, collection=(4, 2, 2), fixed_trees=(),
        t_verify=lambda n: float(n), t_draft=lambda levels, k: 0.0,
    )  # fmt: skip
    # pruning keeps the accepted path (3 nodes, bucket 4) instead of verifying all 5
    assert steep.table == {4: 0.02} and steep.best.tau == steep.unpruned.tau == 3.0
    assert steep.best.bucket == 4 and steep.unpruned.bucket == 5
    flat = pvr.replay_thresholds(
        LogqPreVerifier(), recs, collection=(4, 2, 2), fixed_trees=(),
        t_verify=lambda n: 1.0, t_draft=lambda levels, k: 0.0,
    )  # fmt: skip
    assert flat.table == {4: 0.0}  # nothing to save: the whole tree (ties go to 0)
    # pruning replays 5/4 = 1.25x the whole tree: taken under a margin below that, not above
    for margin, table in ((1.2, {4: 0.02}), (1.3, {4: 0.0})):
        chosen = pvr.replay_thresholds(
            LogqPreVerifier(), recs, collection=(4, 2, 2), fixed_trees=(),
            t_verify=lambda n: float(n), t_draft=lambda levels, k: 0.0, min_gain=margin,
        )  # fmt: skip
        assert chosen.table == table
        assert chosen.best.bucket == (4 if table[4] else 5)
    with pytest.raises(ValueError, match="start with 0"):
        pvr.replay_thresholds(
            LogqPreVerifier(), recs, collection=(4, 2, 2), fixed_trees=(), thresholds=(0.1, 0.0),
            t_verify=lambda n: float(n), t_draft=lambda levels, k: 0.0, min_gain=1.1,
        )  # fmt: skip


def test_records_round_trip(tmp_path):
    recs = records(3)
    recs[1] = pvr.StepRecord(recs[1].parents, recs[1].valid, recs[1].node_stats, np.array([], int))
    back = pvr.load_records(pvr.save_records(recs, tmp_path / "r.npz"))
    assert len(back) == 3
    for a, b in zip(recs, back, strict=True):
        for field in ("parents", "valid", "node_stats", "path"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    (tmp_path / "bad.npz").write_bytes(b"not an npz")
    with pytest.raises(ValueError, match="bad.npz"):
        pvr.load_records(tmp_path / "bad.npz")


def flat_costs(monkeypatch, calls: list):
    """Costs under which pruning never pays: every node count verifies in 1 s."""

    class Verify:
        def t_verify(self, n):
            return 1.0

    class Draft:
        def t_draft(self, tree):
            return 0.0

    monkeypatch.setattr(autotune, "verify_costs", lambda *a, **k: calls.append(1) or Verify())
    monkeypatch.setattr(autotune, "draft_costs", lambda *a, **k: Draft())


def test_stale_thresholds_are_replaced_once_per_machine(tmp_path, monkeypatch, target):  # noqa: F811
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    calls = []
    flat_costs(monkeypatch, calls)
    folder = tmp_path / "pre_verifier"
    trained = random_pre_verifier(0.5, budget_thresholds=((4, 0.5), (9, 0.5)))
    save_pre_verifier(trained, folder, card={"collection_tree": "9,4,3"})
    tree = TreeConfig.dynamic(9, 4, 3)

    # Without recorded steps nothing can be chosen: the trained table stays.
    drafter = make_drafter("eagle", target)
    drafter.pre_verifier = load_pre_verifier(folder)
    assert drafter.pre_verifier.replay_file is None
    assert pre_verifier_local.localize(target, drafter) is None

    # With them, an explicit call chooses again first; under flat costs nothing is pruned.
    pvr.save_records(records(), folder / REPLAY)
    drafter.pre_verifier = load_pre_verifier(folder)
    assert pre_verifier_local.pending(drafter.pre_verifier)
    ref = specjax.generate(target, PROMPTS, max_new_tokens=15)
    out = specjax.speculative_generate(target, drafter, PROMPTS, max_new_tokens=15,
                                       config=SpecConfig(tree=tree))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    pv = drafter.pre_verifier
    assert pv.thresholds_source == "this machine" and len(calls) == 1
    assert dict(pv.config.budget_thresholds) == {4: 0.0, 7: 0.0, 9: 0.0, 15: 0.0}
    assert not pv.prunes(tree.num_nodes)
    assert int(np.sum(out.stats["pre_verifier_stops"])) == 0
    np.testing.assert_allclose(np.asarray(out.stats["verified_nodes"]), tree.num_nodes)

    # A later process reads the choice from disk: nothing is measured again.
    again = make_drafter("eagle", target)
    again.pre_verifier = load_pre_verifier(folder)
    record = pre_verifier_local.localize(target, again, announce=False)
    assert len(calls) == 1 and record["table"] == {"4": 0.0, "7": 0.0, "9": 0.0, "15": 0.0}

    # Thresholds the caller set are the caller's.
    mine = load_pre_verifier(folder)
    mine.set_threshold(0.3)
    assert not pre_verifier_local.pending(mine)
    assert not pre_verifier_local.pending(load_pre_verifier(folder).with_settings(threshold=0.2))
    assert pre_verifier_local.pending(load_pre_verifier(folder).with_settings(block=2))


def logq_pre_verifier(threshold: float, **kw):
    """A PreVerifier whose weights compute LogqPreVerifier's logits: 40 (q - 0.5), read from the
    feature exp(logq) (specjax.models.pre_verifier.features' second column)."""
    pv = random_pre_verifier(threshold, **kw)
    for layer in (pv.proj_in, *pv.blocks, pv.proj_out):
        layer.kernel.set_value(layer.kernel[...] * 0)
        layer.bias.set_value(layer.bias[...] * 0)
    pv.proj_in.kernel.set_value(pv.proj_in.kernel[...].at[1, 0].set(40.0))
    pv.proj_in.bias.set_value(pv.proj_in.bias[...].at[0].set(-20.0))
    pv.proj_out.kernel.set_value(pv.proj_out.kernel[...].at[0, 0].set(1.0))
    return pv


def test_default_call_prunes_only_where_the_replay_gains(tmp_path, monkeypatch, target):  # noqa: F811
    from specjax.api import _with_pre_verifier
    from specjax.choice import Choice

    folder = tmp_path / "pre_verifier"
    save_pre_verifier(logq_pre_verifier(0.5), folder, card={"collection_tree": "4,2,2"})
    pvr.save_records(records(), folder / REPLAY)
    np.testing.assert_allclose(
        pvr.predict(load_pre_verifier(folder), records(1)[0].node_stats)[1:],
        [1, 0, 1, 0], atol=1e-3,
    )  # fmt: skip
    tree = TreeConfig.dynamic(4, 2, 2)
    # The costs the choice measured were taken at context 64: the replay prices at those.
    whole = Choice(SpecConfig(tree=tree, pre_verify=False), 2.0, 1.0, 0.6, 1, context=64)

    class Draft:
        def t_draft(self, tree):
            return 0.0

    asked = []
    for label, t_verify, prunes in (("steep", float, True), ("flat", lambda n: 1.0, False)):
        monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / label))
        verify = type("Verify", (), {"t_verify": staticmethod(t_verify)})()
        monkeypatch.setattr(
            autotune, "verify_costs", lambda *a, v=verify, **k: asked.append(("verify", k)) or v
        )
        monkeypatch.setattr(autotune, "draft_costs",
                            lambda *a, **k: asked.append(("draft", k)) or Draft())  # fmt: skip
        drafter = make_drafter("eagle", target)
        drafter.pre_verifier = load_pre_verifier(folder)
        choice, replay = _with_pre_verifier(target, drafter, whole)
        assert drafter.pre_verifier.thresholds_source == "this machine"
        assert asked and all(k["context"] == 64 for _, k in asked)
        # the replay prices draft levels: no whole step is timed for it
        assert all(k["with_overhead"] is False for what, k in asked if what == "draft")
        asked.clear()
        assert choice.config_prunes == prunes, (label, replay)
        if prunes:  # the likely path kept (3 nodes, bucket 4) instead of all 5 verified
            assert replay.tau_pruned == replay.tau_whole == 3.0
            assert replay.gain == pytest.approx(5 / 4)
            assert choice.predicted_speedup == pytest.approx(whole.predicted_speedup * 5 / 4)
            assert choice.tree_label() == "dynamic(4,2,2) pre-verified"
        else:
            assert replay.gain == pytest.approx(1.0) and choice is whole


@pytest.mark.slow
def test_default_call_with_a_pre_verifier_stays_exact(tmp_path, monkeypatch, target):  # noqa: F811
    """SpecConfig.auto() with a drafter whose pre-verifier has recorded steps: the choice replays
    them (here under costs that reward pruning), reports the replayed gain, prunes where it
    gains, and the output is generate's."""
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "pre_verifier"
    save_pre_verifier(logq_pre_verifier(0.5), folder, card={"collection_tree": "4,2,2"})
    pvr.save_records(records(), folder / REPLAY)
    real_verify = autotune.verify_costs
    steep = type("Verify", (), {"t_verify": staticmethod(float)})()
    monkeypatch.setattr(
        pre_verifier_local.autotune, "verify_costs",
        lambda *a, **k: steep if k.get("with_ar") is False else real_verify(*a, **k),
    )  # fmt: skip
    drafter = make_drafter("eagle", target)
    # A drafter that drafts no text chain: the default call then weighs trees without one,
    # which the replay can price (a chosen chain leaves the replay out: pruning_gain).
    drafter.text_chains = False
    drafter.pre_verifier = load_pre_verifier(folder)
    auto = SpecConfig.auto(max_nodes=8, verbose=False, allow_autoregressive=False,
                           timed_candidates=0, adapt=False)  # fmt: skip
    ref = specjax.generate(target, PROMPTS, max_new_tokens=15)
    out = specjax.speculative_generate(target, drafter, PROMPTS, max_new_tokens=15, config=auto)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    gain = out.stats["pre_verifier_replay_gain"]
    pruned = gain >= pre_verifier_local.MIN_GAIN
    assert out.stats["tree"].endswith(" pre-verified") == pruned, (out.stats["tree"], gain)
    assert drafter.pre_verifier.thresholds_source == "this machine"


class _SteepCosts:
    """t(N) = N ms at every count asked for: verifying fewer nodes always saves."""

    def __init__(self, nodes):
        self.nodes = tuple(nodes)
        self.seconds = tuple(n * 1e-3 for n in self.nodes)

    def t_verify(self, n):
        return n * 1e-3


@pytest.mark.slow
def test_default_call_verifies_a_wider_tree_pruned_by_cost(tmp_path, monkeypatch, target):  # noqa: F811
    """SpecConfig.auto() (greedy) with a feature drafter that has a pre-verifier: the loop runs
    the chosen tree widened to at least api.COST_AWARE_TREE plus a text chain of
    api.COST_AWARE_CHAIN from any match, on a twin of the drafter whose pre-verifier chooses
    each step's nodes by t(N); output is generate's, the drafter itself is left as it was, and
    a second call runs the same twin."""
    from specjax import api

    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    real_verify = autotune.verify_costs
    asked = []

    def verify_costs(*a, **k):
        if k.get("with_ar") is False:
            asked.append(k)
            return _SteepCosts(k["nodes"])
        return real_verify(*a, **k)

    monkeypatch.setattr(pre_verifier_local.autotune, "verify_costs", verify_costs)
    drafter = make_drafter("eagle", target)
    trained = random_pre_verifier(0.5)
    drafter.pre_verifier = trained
    auto = SpecConfig.auto(max_nodes=6, verbose=False, allow_autoregressive=False,
                           timed_candidates=0, adapt=False)  # fmt: skip
    prompt, other = PROMPTS[1:2], PROMPTS[:1]  # one row: batches keep the chosen tree
    ref = specjax.generate(target, prompt, max_new_tokens=15)
    out = specjax.speculative_generate(target, drafter, prompt, max_new_tokens=15, config=auto)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    label = out.stats["tree"]
    nodes, depth, topk = api.COST_AWARE_TREE
    assert label.startswith(f"dynamic({nodes},") and "pre-verified by cost" in label, label
    assert f"+text({api.COST_AWARE_CHAIN},m1)" in label, label
    assert "(chosen whole: dynamic(" in label, label
    # the costs were asked at batch 1
    assert asked and all(k["batch"] == 1 for k in asked)
    verified = np.asarray(out.stats["verified_nodes"])
    assert 0 < verified.max() < nodes + api.COST_AWARE_CHAIN, verified  # steep costs prune
    assert drafter.pre_verifier is trained and not trained.shape.costs
    twins = len(api._COST_AWARE)
    again = specjax.speculative_generate(target, drafter, other, max_new_tokens=15,
                                         config=auto)  # fmt: skip
    ref = specjax.generate(target, other, max_new_tokens=15)
    np.testing.assert_array_equal(np.asarray(again.tokens), np.asarray(ref.tokens))
    assert len(api._COST_AWARE) == twins


@pytest.mark.parametrize(
    "chosen, widened",
    [
        (TreeConfig.dynamic(3, 2, 8).with_text_chain(4, 3), TreeConfig.dynamic(7, 3, 4)),
        (TreeConfig.dynamic(4, 5, 2), TreeConfig.dynamic(7, 5, 4)),
        (TreeConfig.dynamic(9, 4, 2).with_text_chain(12), TreeConfig.dynamic(9, 4, 2)),
    ],
)
def test_the_default_candidate_widens_the_chosen_tree(chosen, widened, monkeypatch, target):  # noqa: F811
    """_cost_aware_candidate: the chosen tree widened to at least COST_AWARE_TREE (a larger
    one kept), a chain of at least COST_AWARE_CHAIN drafted from any match, verified on a twin
    whose pre-verifier has the costs at batch 1 and the choice's context; the predictions stay
    the chosen tree's; without a pre-verifier, or for a batch of rows over
    COST_AWARE_MAX_BATCH, nothing changes."""
    from specjax import api
    from specjax.choice import Choice

    asked = []
    monkeypatch.setattr(pre_verifier_local.autotune, "verify_costs",
                        lambda *a, **k: asked.append(k) or _SteepCosts(k["nodes"]))  # fmt: skip
    drafter = make_drafter("eagle", target)
    choice = Choice(SpecConfig(tree=chosen), 2.0, 1.0, 0.6, 1, context=64)
    assert api._cost_aware_candidate(target, drafter, choice, 3) == (drafter, choice)
    drafter.pre_verifier = random_pre_verifier(0.5)
    assert api._cost_aware_candidate(target, drafter, choice, 3) == (drafter, choice)  # batch 3
    twin, wide = api._cost_aware_candidate(target, drafter, choice, 1)
    chain = max(chosen.text_chain, api.COST_AWARE_CHAIN)
    assert wide.config.tree == widened.with_text_chain(chain, 1)
    assert wide.config.pre_verify and wide.widened_from == chosen
    assert (wide.predicted_tau, wide.seconds_per_step) == (2.0, 1.0)
    assert twin is not drafter and drafter.pre_verifier.shape.costs == ()
    assert twin.pre_verifier.shape.costs and twin.pre_verifier.threshold_for(8) == 0.0
    assert [(k["batch"], k["context"]) for k in asked] == [(1, 64)]
    assert api._cost_aware_candidate(target, drafter, choice, 1)[0] is twin  # reused
    assert wide.tree_label().endswith(f"pre-verified by cost (chosen whole: {tree_label(chosen)})")
    # Batches run it once allowed to (experiments/batched.py --cost-aware), priced at their size.
    monkeypatch.setattr(api, "COST_AWARE_MAX_BATCH", 3)
    batch_twin, batch_wide = api._cost_aware_candidate(target, drafter, choice, 3)
    assert batch_twin is not twin and batch_wide.config == wide.config
    assert [k["batch"] for k in asked] == [1, 3]
