"""The pre-verifier (PACER): pruning and bucketed verification stay lossless, early-stopped
drafting keeps what pruning would keep, the statistics count what happened, and the trained
module round-trips through its checkpoint folder.

Random pre-verifiers are used (any pre-verifier must leave the output unchanged); their output
layer is scaled up so that their predictions spread over (0, 1) and a threshold cuts some
drafts and not others.
"""

import dataclasses
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lively_models import lively_llama
from test_feature_drafter import make_drafter, proposer_after
from test_lossless_e2e import (
    CFG,
    N_ROWS,
    PROMPT,
    check_rows,
    observed_tokens,
    sharpened,
)

import specjax
from specjax import pre_verifier_replay as pvr
from specjax import pre_verify
from specjax.config import TINY, ModelConfig, SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters.lm import LMDrafter
from specjax.models.pre_verifier import (
    PreVerifier,
    PreVerifierConfig,
    load_pre_verifier,
    save_pre_verifier,
)
from specjax.train import pre_verifier as pvt
from specjax.tree import NODE_STATS, ancestor_mask


def random_pre_verifier(threshold: float, seed: int = 1, **kw) -> PreVerifier:
    pv = PreVerifier(PreVerifierConfig(threshold=threshold, **kw), rngs=nnx.Rngs(seed))
    pv.proj_out.kernel.set_value(pv.proj_out.kernel[...] * 8)
    return pv


@pytest.fixture(scope="module")
def target():
    """TINY at 3x its init scale: at init scale it repeats one token and every draft agrees."""
    return lively_llama(TINY, 0)


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [3]]


# The default run keeps a dynamic tree (feature drafter; test_sampled_children_are_never_pruned
# runs an LM drafter with a pre-verifier); the other drafter kinds and trees run under `slow`.
@pytest.mark.parametrize(
    ("drafter_kind", "tree"),
    [
        ("eagle", TreeConfig.dynamic(9, 4, 3)),
        pytest.param("self", TreeConfig(branching=(2, 2, 1)), marks=pytest.mark.slow),
        pytest.param("mdc", TreeConfig.dynamic(6, 3, 2), marks=pytest.mark.slow),
        pytest.param("self", TreeConfig.chain(4), marks=pytest.mark.slow),
    ],
)
def test_greedy_output_unchanged_at_every_threshold(target, drafter_kind, tree):
    ref = specjax.generate(target, PROMPTS, max_new_tokens=21)
    if drafter_kind == "self":
        drafter = LMDrafter.self_draft(1)
    else:
        drafter = make_drafter(drafter_kind, target)
    drafter.pre_verifier = random_pre_verifier(0.0)
    cuts = []
    for threshold in (0.0, 0.3, 0.9):  # the threshold is traced: one compilation
        drafter.pre_verifier.set_threshold(threshold)
        out = specjax.speculative_generate(
            target, drafter, PROMPTS, max_new_tokens=21, config=SpecConfig(tree=tree)
        )
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
        np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
        cuts.append(int(np.sum(out.stats["pre_verifier_stops"])))
        steps = np.asarray(out.stats["target_calls"])
        hist = np.asarray(out.stats["draft_len_hist"])
        chex.assert_shape(hist, (len(PROMPTS), tree.num_nodes))
        np.testing.assert_array_equal(hist.sum(1), steps)
        verified = np.asarray(out.stats["verified_nodes"])
        assert np.all(verified >= np.asarray(out.stats["draft_len"]) + 1)
        if threshold == 0.0:  # the drafts are both accepted and rejected, so equality means
            accepted = np.asarray(out.stats["accepted_hist"]).sum(0)  # something
            assert accepted[0] > 0 and accepted[1:].sum() > 0, accepted
    assert cuts[0] == 0 and cuts[2] > cuts[0], cuts  # threshold 0 keeps everything
    # pre_verify=False (SpecConfig.auto()'s choices): the drafter's pre-verifier is left out.
    whole = SpecConfig(tree=tree, pre_verify=False)
    out = specjax.speculative_generate(target, drafter, PROMPTS, max_new_tokens=21, config=whole)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert int(np.sum(out.stats["pre_verifier_stops"])) == 0
    np.testing.assert_allclose(np.asarray(out.stats["verified_nodes"]), tree.num_nodes)


@pytest.mark.slow
def test_nothing_kept_is_plain_decoding_in_buckets_of_one(target):
    """A threshold no node reaches: every step verifies the root alone (bucket 1). (The same
    shapes as the eagle case above: the compiled loop is reused.)"""
    drafter = make_drafter("eagle", target)
    pv = random_pre_verifier(0.5)
    pv.proj_out.bias.set_value(jnp.full((1,), -50.0))  # P(accept) ~ 0 for every node
    drafter.pre_verifier = pv
    config = SpecConfig(tree=TreeConfig.dynamic(9, 4, 3))
    out = specjax.speculative_generate(target, drafter, PROMPTS, max_new_tokens=21, config=config)
    ref = specjax.generate(target, PROMPTS, max_new_tokens=21)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_allclose(np.asarray(out.stats["verified_nodes"]), 1.0)
    np.testing.assert_allclose(np.asarray(out.stats["draft_len"]), 0.0)
    np.testing.assert_allclose(np.asarray(out.stats["tau"]), 1.0)


@pytest.mark.slow
def test_sampled_rows_with_pruning_do_not_depend_on_the_other_rows(target):
    """Pruned trees run in a bucket the whole batch shares; a row's draws must not depend on
    that bucket (the other rows' kept counts): each row samples the same tokens alone. The tree
    rule's per-node uniforms are drawn for the bucket's n nodes; node j's value does not depend
    on n because JAX's threefry is partitionable (jax_threefry_partitionable, the default)."""
    drafter = make_drafter("eagle", target, seed=3)
    drafter.pre_verifier = random_pre_verifier(0.2, seed=4)
    keys = jax.random.split(jax.random.key(5), len(PROMPTS))
    kw = dict(max_new_tokens=16, config=SpecConfig(tree=TreeConfig.dynamic(9, 4, 3)),
              sampling=SamplingConfig(temperature=1.0))  # fmt: skip
    together = specjax.speculative_generate(target, drafter, PROMPTS, key=keys, **kw)
    for i, prompt in enumerate(PROMPTS):
        alone = specjax.speculative_generate(target, drafter, [prompt], key=keys[i : i + 1], **kw)
        np.testing.assert_array_equal(np.asarray(together.tokens[i]), np.asarray(alone.tokens[0]))


@pytest.mark.slow
def test_greedy_unchanged_across_batch_and_cache_boundaries(target):
    """Rows finishing at different steps, prompts of other widths, budgets ending exactly at a
    step: the pruned, bucketed run equals plain decoding row by row."""
    drafter = make_drafter("eagle", target, seed=3)
    drafter.pre_verifier = random_pre_verifier(0.2, seed=4)
    prompts = [[7] * 13, [1, 2], [5, 4, 3, 2, 1], [9], [2, 2, 2, 2, 2, 2, 2, 2, 2]]
    for max_new in (2, 5, 17):
        ref = specjax.generate(target, prompts, max_new_tokens=max_new)
        out = specjax.speculative_generate(
            target, drafter, prompts, max_new_tokens=max_new,
            config=SpecConfig(tree=TreeConfig.dynamic(12, 5, 3)),
        )  # fmt: skip
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


@pytest.mark.slow
def test_early_stopped_drafting_keeps_what_pruning_keeps(target):
    """From one engine state, expand_topk with the pre-verifier's stop keeps every node that the
    full expansion pruned afterwards keeps (drafting stops only where nothing deeper could be
    kept; the budget the stopped levels leave free may hold more shallow nodes), and it does
    stop early at a high threshold."""
    drafter = make_drafter("eagle", target)
    cfg = SpecConfig(tree=TreeConfig.dynamic(15, 5, 3))
    _, propose = proposer_after(target, drafter, PROMPTS, cfg, steps=2, max_new_tokens=12)
    live = jnp.ones(len(PROMPTS), bool)
    pv = random_pre_verifier(0.0, seed=7)
    depths = []
    for threshold in (0.1, 0.4, 0.8):
        pv.set_threshold(threshold)
        trees = {}
        for stop in (False, True):
            drafter.pre_verifier = pv if stop else None
            trees[stop] = propose()
        drafter.pre_verifier = None
        for full, stopped in zip(
            *(kept_nodes(trees[k], pv, live) for k in (False, True)), strict=True
        ):
            missing = [n for n in full if n not in stopped]
            assert not missing, (threshold, missing)
        valid = np.asarray(trees[True].valid)
        depths.append(int(np.max(np.where(valid, np.asarray(trees[True].depth), 0))))
    assert depths[-1] < 5, depths


@pytest.mark.slow
def test_early_stop_saves_the_mdc_chain_levels_it_never_reaches(target):
    """mdc computes chain slot d when it expands level d: a stopped draft makes fewer chain
    calls, leaves the slots it reached as the full expansion computes them, and marks the others
    as not reusable by the next step."""
    drafter = make_drafter("mdc", target, reuse=False)
    depth = 5
    cfg = SpecConfig(tree=TreeConfig.dynamic(12, depth, 2))
    _, propose = proposer_after(target, drafter, PROMPTS, cfg, steps=2, max_new_tokens=12)
    drafter.pre_verifier = None
    _, full = propose(True)
    np.testing.assert_array_equal(np.asarray(full.pending[:, 2]), depth)
    assert np.asarray(full.chain_valid).all()
    drafter.pre_verifier = random_pre_verifier(0.0, seed=7)
    drafter.pre_verifier.set_threshold(0.95)
    tree, stopped = propose(True)
    drafter.pre_verifier = None
    valid = np.asarray(tree.valid)
    reached = int(np.max(np.where(valid, np.asarray(tree.depth), 0)))
    levels = np.asarray(stopped.pending[:, 2])  # chain layer calls per row
    assert (levels < depth).all() and (levels >= max(reached, 1)).all(), (levels, reached)
    ready = np.asarray(stopped.chain_valid)
    np.testing.assert_array_equal(ready, np.arange(depth)[None, :] < levels[:, None])
    np.testing.assert_allclose(
        np.asarray(stopped.chain_h)[ready], np.asarray(full.chain_h)[ready], rtol=1e-5, atol=1e-5
    )


def kept_nodes(tree, pv, live):
    """Per row, the sorted (depth, parent's token, token) of the nodes the pre-verifier keeps
    (the stopped run's trees come compacted, so nodes are compared by what they are)."""
    keep = np.asarray(pre_verify.keep_mask(tree, pv, live, 5))
    tokens, parents, depth = (np.asarray(x) for x in (tree.tokens, tree.parents, tree.depth))
    rows = []
    for b in range(keep.shape[0]):
        nodes = np.flatnonzero(keep[b])
        rows.append(sorted((depth[b, i], tokens[b, max(parents[b, i], 0)], tokens[b, i])
                           for i in nodes))  # fmt: skip
    return rows


def test_compaction_keeps_a_topological_tree():
    parents = jnp.array([[-1, 0, 0, 1, 2, 3, 1]])
    tree = specjax.tree.DraftTree(
        tokens=jnp.arange(7)[None] + 10,
        parents=parents,
        depth=jnp.array([[0, 1, 1, 2, 2, 3, 2]]),
        valid=jnp.ones((1, 7), bool),
        draft_prob=jnp.ones((1, 7)),
        node_stats=jnp.zeros((1, 7, len(NODE_STATS))),
    )
    keep = jnp.array([[True, True, False, True, False, True, False]])
    c, order = pre_verify.compact(tree, keep)
    np.testing.assert_array_equal(np.asarray(order[0, :4]), [0, 1, 3, 5])
    np.testing.assert_array_equal(np.asarray(c.tokens[0, :4]), [10, 11, 13, 15])
    np.testing.assert_array_equal(np.asarray(c.parents[0, :4]), [-1, 0, 1, 2])
    par = np.asarray(c.parents[0])
    assert all(par[i] < i for i in range(1, 7))
    np.testing.assert_array_equal(np.asarray(c.valid[0]), [1, 1, 1, 1, 0, 0, 0])
    # The ancestor mask of the first four compacted nodes is the kept chain's.
    m = np.asarray(ancestor_mask(c.parents[:, :4])[0])
    np.testing.assert_array_equal(m, np.tril(np.ones((4, 4), bool)))
    acc = specjax.tree.Acceptance(
        path=jnp.array([[0, 1, 2, 0]]), n_accepted=jnp.array([2]), next_token=jnp.array([0])
    )
    np.testing.assert_array_equal(
        np.asarray(pre_verify.to_drafter_indices(acc, order).path), [[0, 1, 3, 0]]
    )


def test_default_buckets():
    assert pre_verify.default_buckets(32) == (1, 4, 8, 16, 32)
    assert pre_verify.default_buckets(7) == (1, 4, 7)
    assert pre_verify.default_buckets(1) == (1,)


def test_sampled_children_are_never_pruned(target):
    """Dropping a child sampled from q because of its own token would bias the output: with a
    sampled chain the engine leaves the pre-verifier out."""
    drafter = LMDrafter.self_draft(1)
    drafter.pre_verifier = random_pre_verifier(0.9)
    out = specjax.speculative_generate(
        target, drafter, PROMPTS, max_new_tokens=8, config=SpecConfig(tree=TreeConfig.chain(3)),
        sampling=SamplingConfig(temperature=1.0), key=jax.random.key(0),
    )  # fmt: skip
    assert int(np.sum(out.stats["pre_verifier_stops"])) == 0
    np.testing.assert_allclose(np.asarray(out.stats["verified_nodes"]), 4.0)


def test_sampling_with_pruning_matches_target_distribution(optimized_loop):
    """Deterministic (top-k) children pruned by the pre-verifier, sampled decoding (the one-hot
    tree rule): the first depth + 2 tokens follow the target's exact distribution (the
    project's exact-enumeration check, test_lossless_e2e), while the pre-verifier keeps more
    nodes in some steps than in others."""
    target = sharpened(CFG, 3, 3.0)
    drafter = LMDrafter(sharpened(ModelConfig(**{**CFG.__dict__, "n_layers": 1}), 11, 2.0))
    drafter.pre_verifier = random_pre_verifier(0.2, seed=2)
    sampling = SamplingConfig(temperature=1.0)
    keys = jax.random.split(jax.random.key(0), N_ROWS)
    tree = TreeConfig(branching=(2, 1))
    out = specjax.speculative_generate(
        target, drafter, [PROMPT] * N_ROWS, max_new_tokens=observed_tokens(tree),
        config=SpecConfig(tree=tree, rule="tree_onehot"), sampling=sampling, key=keys,
    )  # fmt: skip
    tokens = np.asarray(out.tokens)
    problem = check_rows(tokens, target, sampling)
    assert problem is None, problem
    # The pre-verifier keeps different numbers of nodes from step to step (it really decides).
    kept = np.asarray(out.stats["draft_len_hist"]).sum(0)
    assert np.sum(kept > 0.05 * kept.sum()) >= 2, kept
    hist = np.asarray(out.stats["accepted_hist"]).sum(0)
    assert hist[1:].sum() > 0.05 * hist.sum(), hist


def test_checkpoint_round_trip_and_load_drafter_switch(tmp_path, target):
    pv = random_pre_verifier(0.25, block=2)
    save_pre_verifier(pv, tmp_path / "pv", card={"auc": 0.5})
    back = load_pre_verifier(tmp_path / "pv")
    assert back.config == pv.config
    stats = jax.random.normal(jax.random.key(0), (3, 5, len(NODE_STATS)))
    np.testing.assert_allclose(
        np.asarray(back.logits(stats)), np.asarray(pv.logits(stats)), rtol=1e-6
    )
    with pytest.raises(ValueError, match="pre_verifier.json"):
        load_pre_verifier(tmp_path / "missing")
    header_path = tmp_path / "pv" / "pre_verifier.json"
    header = json.loads(header_path.read_text())
    header_path.write_text(json.dumps({**header, "version": 99}))
    with pytest.raises(ValueError, match="version 99 .* train it again"):
        load_pre_verifier(tmp_path / "pv")
    with pytest.raises(ValueError, match="threshold"):
        pv.with_settings(threshold=1.5)
    with pytest.raises(ValueError, match="only"):
        pv.with_settings(hidden=3)
    other = pv.with_settings(threshold=0.6)
    assert other.config.threshold == 0.6 and pv.config.threshold == 0.25


@pytest.mark.slow
def test_budget_thresholds_prune_each_tree_at_its_own_threshold(tmp_path, target):
    """A tree of N draft nodes is pruned at the trained threshold of the largest budget <= N
    (the smallest budget's below all of them); a new explicit threshold replaces the table;
    the table survives the checkpoint."""
    table = ((4, 0.05), (7, 0.2), (31, 0.6))
    pv = random_pre_verifier(0.02, budget_thresholds=table)
    assert [pv.threshold_for(n) for n in (1, 4, 6, 7, 30, 31, 64)] == [
        0.05, 0.05, 0.05, 0.2, 0.2, 0.6, 0.6,
    ]  # fmt: skip
    save_pre_verifier(pv, tmp_path / "pv")
    assert load_pre_verifier(tmp_path / "pv").config.budget_thresholds == table
    plain = pv.with_settings(threshold=0.3)
    assert plain.config.budget_thresholds == () and plain.threshold_for(31) == 0.3
    in_place = pv.with_settings(block=1)
    assert in_place.config.budget_thresholds == table
    in_place.set_threshold(0.4)
    assert in_place.config.budget_thresholds == () and in_place.threshold_for(31) == 0.4
    with pytest.raises(ValueError, match="repeat"):
        pv.with_settings(budget_thresholds=((4, 0.1), (4, 0.2)))

    drafter = make_drafter("eagle", target)
    cfg = SpecConfig(tree=TreeConfig.dynamic(9, 4, 3))  # 9 draft nodes: budget 7's 0.2
    _, propose = proposer_after(target, drafter, PROMPTS, cfg, steps=1, max_new_tokens=12)
    tree = propose()
    live = jnp.ones(len(PROMPTS), bool)
    kept = {t: np.asarray(pre_verify.keep_mask(tree, pv.with_settings(threshold=t), live, 4))
            for t in (0.02, 0.2)}  # fmt: skip
    assert not np.array_equal(kept[0.02], kept[0.2])  # the two thresholds differ here
    np.testing.assert_array_equal(np.asarray(pre_verify.keep_mask(tree, pv, live, 4)), kept[0.2])


@pytest.mark.slow
def test_a_budget_left_unpruned_runs_the_whole_tree(target):
    """Threshold 0 in the trained table (the replay found no pruning faster there) leaves that
    budget's trees whole: drafted to full depth, verified at every node, nothing cut; a budget
    with a threshold still prunes."""
    pv = random_pre_verifier(0.0, budget_thresholds=((4, 0.9), (7, 0.0)))
    assert pv.prunes(5) and not pv.prunes(8) and random_pre_verifier(0.0).prunes(8)
    drafter = make_drafter("eagle", target)
    drafter.pre_verifier = pv
    ref = specjax.generate(target, PROMPTS, max_new_tokens=12)
    for tree, whole in ((TreeConfig.dynamic(9, 4, 3), True), (TreeConfig.dynamic(4, 2, 2), False)):
        out = specjax.speculative_generate(
            target, drafter, PROMPTS, max_new_tokens=12, config=SpecConfig(tree=tree)
        )
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
        verified = np.asarray(out.stats["verified_nodes"])
        stops = int(np.sum(out.stats["pre_verifier_stops"]))
        if whole:
            np.testing.assert_allclose(verified, tree.num_nodes)
            assert stops == 0
        else:
            assert stops > 0 and (verified < tree.num_nodes).any()


def test_load_drafter_refuses_a_missing_pre_verifier(tmp_path, target):
    from specjax.train.checkpoint import save_drafter

    drafter = make_drafter("eagle", target)
    save_drafter(drafter.net, tmp_path / "d")
    assert specjax.load_drafter(tmp_path / "d", target, strict=False).pre_verifier is None
    with pytest.raises(ValueError, match="no pre-verifier"):
        specjax.load_drafter(tmp_path / "d", target, strict=False, pre_verifier=True)
    save_pre_verifier(random_pre_verifier(0.3), tmp_path / "d" / "pre_verifier")
    loaded = specjax.load_drafter(tmp_path / "d", target, strict=False)
    assert loaded.pre_verifier is not None and loaded.pre_verifier.config.threshold == 0.3
    off = specjax.load_drafter(tmp_path / "d", target, strict=False, pre_verifier=False)
    assert off.pre_verifier is None
    with pytest.raises(ValueError, match="pre_verifier must be"):
        specjax.load_drafter(tmp_path / "d", target, strict=False, pre_verifier="yes")


def test_load_drafter_sets_a_cost_aware_pre_verifier(tmp_path, target, monkeypatch):
    """pre_verifier="costs" (`DIR:pvcost`): the trained pre-verifier at threshold 0 with this
    machine's t(N) as its costs (stubbed here: the measurement is autotune's)."""
    from specjax import autotune
    from specjax.drafters.spec import split_drafter_switch
    from specjax.train.checkpoint import save_drafter

    assert split_drafter_switch("ckpt/d:pvcost") == ("ckpt/d", {"pre_verifier": "costs"})
    drafter = make_drafter("eagle", target)
    save_drafter(drafter.net, tmp_path / "d")
    save_pre_verifier(random_pre_verifier(0.3), tmp_path / "d" / "pre_verifier")
    measured = autotune.VerifyCosts(key="k", nodes=(1, 4, 8), seconds=(1.0, 1.2, 1.5))
    monkeypatch.setattr(autotune, "verify_costs", lambda *a, **kw: measured)
    pv = specjax.load_drafter(tmp_path / "d", target, strict=False, pre_verifier="costs")
    pv = pv.pre_verifier
    assert pv.shape.costs == ((1, 1.0), (4, 1.2), (8, 1.5))
    assert float(pv.keep_logp(16)) == -np.inf  # threshold 0: the costs alone decide


def test_labels_auc_and_replay():
    parents = np.array([-1, 0, 0, 1, 2])
    stats = np.zeros((5, len(NODE_STATS)), np.float32)
    stats[:, 5] = [0, 1, 1, 2, 2]
    rec = pvr.StepRecord(parents=parents, valid=np.ones(5, bool), node_stats=stats,
                         path=np.array([1, 3]))  # fmt: skip
    x, y = pvt.node_labels([rec])
    # nodes 1, 2 (parent root, accepted) and 3 (parent 1, accepted); node 4's parent was rejected
    np.testing.assert_array_equal(y, [True, False, True])
    assert pvt.auc(np.array([0.9, 0.1, 0.8]), y) == 1.0
    assert pvt.auc(np.array([0.1, 0.9, 0.2]), y) == 0.0
    assert pvt.auc(np.array([0.5, 0.5, 0.5]), y) == 0.5
    sim = pvr.simulate(None, [rec], 0.0, t_verify=lambda n: 1.0, t_draft=lambda d: 0.0)
    assert sim.tau == 3.0 and sim.bucket == 5  # every node kept: bucket N = 5
    assert sim.depth == 2 and sim.draft_len == 4


def test_fixed_subtree_replay():
    """A small fixed tree replayed from a recorded larger one keeps the most probable nodes within
    its depth and sibling ranks, closed under parents, and accepts the recorded path's longest
    prefix that it holds."""
    stats = np.zeros((5, len(NODE_STATS)), np.float32)
    col = {name: i for i, name in enumerate(NODE_STATS)}
    stats[:, col["depth"]] = [0, 1, 1, 2, 2]
    stats[:, col["rank"]] = [0, 0, 1, 0, 0]
    stats[:, col["cum_logq"]] = [0, -0.1, -1.0, -0.3, -1.2]
    rec = pvr.StepRecord(parents=np.array([-1, 0, 0, 1, 2]), valid=np.ones(5, bool),
                         node_stats=stats, path=np.array([1, 3]))  # fmt: skip
    np.testing.assert_array_equal(pvr.fixed_subtree(rec, 2, 2, 1), [1, 1, 0, 1, 0])
    np.testing.assert_array_equal(pvr.fixed_subtree(rec, 2, 1, 2), [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(pvr.fixed_subtree(rec, 1, 2, 2), [1, 1, 0, 0, 0])
    # node 4's parent (rank 1) is outside a top-1 tree, so node 4 is too
    np.testing.assert_array_equal(pvr.fixed_subtree(rec, 4, 2, 1), [1, 1, 0, 1, 0])
    costs = dict(t_verify=lambda n: float(n), t_draft=lambda d: 0.5 * d)
    deep = pvr.simulate_fixed([rec], (2, 2, 1), **costs)
    assert deep.tau == 3.0 and deep.bucket == 3 and deep.seconds == 4.0
    wide = pvr.simulate_fixed([rec], (2, 1, 2), **costs)
    assert wide.tau == 2.0 and wide.draft_len == 2 and wide.seconds == 3.5
    # pruning replayed on the small tree: without a pre-verifier it is the small tree itself
    base = pvr.simulate(None, [rec], 0.0, base=(2, 1, 2), **costs)
    assert base.tau == 2.0 and base.draft_len == 2 and base.bucket == 3 and base.depth == 1


def test_oracle_replay_keeps_exactly_the_accepted_path():
    """A perfect discriminator keeps the root and the accepted path only: the tree's tau, the
    smallest bucket holding the path, drafting one level below the path's end; under gently
    rising costs no threshold of a real pre-verifier replays more tokens per second. The
    cost-aware bucket replays what the engine's bucket_by_cost keeps."""
    rng = np.random.default_rng(0)
    n = 9
    parents = np.array([-1, 0, 0, 1, 1, 2, 3, 4, 6])
    depth = np.array([0, 1, 1, 2, 2, 2, 3, 3, 4])
    records = []
    for path in ([1, 3, 6, 8], [2], [], [1, 4]):
        stats = rng.normal(size=(n, len(NODE_STATS))).astype(np.float32)
        stats[:, 5] = depth
        records.append(pvr.StepRecord(parents=parents, valid=np.ones(n, bool),
                                      node_stats=stats, path=np.array(path, int)))  # fmt: skip
    costs = dict(t_verify=lambda k: 1.0 + 0.1 * k, t_draft=lambda d: 0.2 * d)
    whole = pvr.simulate(None, records, 0.0, **costs)
    best = pvr.simulate_oracle(records, **costs)
    assert best.tau == whole.tau == (5 + 2 + 1 + 3) / 4
    # paths of 4, 1, 0, 2 nodes (+ root) in buckets (1, 4, 8, 9): 8, 4, 1, 4
    assert best.bucket == (8 + 4 + 1 + 4) / 4 and best.draft_len == (4 + 1 + 0 + 2) / 4
    # drafting stops one level below the path's end, at most the tree's depth (4)
    assert best.depth == (4 + 2 + 1 + 3) / 4
    pv = random_pre_verifier(0.0)
    for threshold in pvr.THRESHOLDS:
        real = pvr.simulate(pv, records, threshold, **costs)
        assert real.tokens_per_second <= best.tokens_per_second + 1e-12
    with pytest.raises(ValueError, match="oracle"):
        pvr.simulate(pv, records, 0.1, oracle=True, **costs)
    # the cost-aware bucket: free verification keeps every node; a steep cost only the root,
    # and drafting still runs as deep as the threshold left the tree
    flat = pvr.simulate(pv, records, 0.0, by_cost=True, t_verify=lambda k: 1.0,
                        t_draft=lambda d: 0.0)  # fmt: skip
    assert flat.bucket == n and flat.tau == whole.tau
    steep = pvr.simulate(pv, records, 0.0, by_cost=True, t_verify=lambda k: float(k) ** 2,
                         t_draft=lambda d: 0.0)  # fmt: skip
    assert steep.bucket == 1 and steep.tau == 1.0 and steep.depth == whole.depth
    # between the extremes, the replay keeps what the engine keeps at batch 1
    points = ((1, 1.0), (4, 1.05), (8, 1.6), (9, 1.7))
    t_verify = dict(points).__getitem__  # every bucket of a 9-node tree is a point
    probs = pvr.predict(pv, np.concatenate([r.node_stats for r in records]))
    kept_sizes = set()
    for i, r in enumerate(records):
        path_p = pvr.path_probability(probs[i * n : (i + 1) * n], r.parents)
        keep = np.ones(n, bool)
        ours = pvr._cheapest_bucket(keep, path_p, (1, 4, 8, 9), t_verify)
        engine = pre_verify.bucket_by_cost(
            jnp.asarray(keep[None]), jnp.log(jnp.asarray(path_p[None], jnp.float32)),
            jnp.ones((1,), bool), (1, 4, 8, 9), points,
        )  # fmt: skip
        np.testing.assert_array_equal(ours, np.asarray(engine[0]))
        kept_sizes.add(int(ours.sum()))
    assert kept_sizes - {1, n}, f"only the extreme buckets were exercised: {kept_sizes}"
    # node probabilities given directly: the pre-verifier's own reproduce its replay, and the
    # labels themselves (1 on the accepted path, 0 elsewhere) are the perfect pre-verifier
    own = pvr.predict(pv, np.concatenate([r.node_stats for r in records]))
    assert pvr.simulate(None, records, 0.3, node_probs=own, **costs) == pvr.simulate(
        pv, records, 0.3, **costs
    )
    labels = np.concatenate([np.isin(np.arange(n), r.path) for r in records]).astype(float)
    perfect = pvr.simulate(None, records, 0.5, node_probs=labels, **costs)
    assert dataclasses.replace(perfect, threshold=0.0) == best
    with pytest.raises(ValueError, match="node_probs has 35 entries for 36"):
        pvr.simulate(None, records, 0.5, node_probs=labels[:-1], **costs)


def test_buckets_past_the_measured_counts_are_extrapolated():
    """A bucket larger than every measured count costs more than the last one (along the last
    two), not the same: held flat, it would win whenever it adds any expected tokens."""
    costs = ((1, 1.0), (16, 2.0), (32, 3.0))
    np.testing.assert_allclose(
        pre_verify.bucket_seconds(costs, (1, 24, 32, 48, 64)), [1.0, 2.5, 3.0, 4.0, 5.0]
    )
    n = 64
    prob = jnp.asarray(np.linspace(1.0, 0.01, n)[None])  # every node fairly likely
    keep, live = jnp.ones((1, n), bool), jnp.ones((1,), bool)
    out = np.asarray(pre_verify.bucket_by_cost(keep, jnp.log(prob), live, (32, 64), costs))
    assert out.sum() == 32  # 64 nodes: ~1.5x the tokens of 32 at 5/3 of the time


def test_bucket_by_cost_keeps_the_most_probable_nodes_of_the_best_bucket():
    """Two rows; path probabilities known. With a flat cost up to 8 nodes the 8-bucket wins and
    keeps each row's 7 most probable nodes; with a steep cost the root alone wins."""
    n = 10
    prob = np.array(
        [
            [1, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1],
            [1, 0.05, 0.04, 0.03, 0.02, 0.01, 0.01, 0.01, 0.01, 0.01],
        ]
    )
    keep = jnp.ones((2, n), bool)
    live = jnp.ones((2,), bool)
    flat = ((1, 1.0), (8, 1.05), (10, 3.0))
    out = np.asarray(pre_verify.bucket_by_cost(keep, jnp.log(prob), live, (1, 4, 8, 10), flat))
    np.testing.assert_array_equal(out.sum(1), [8, 8])
    np.testing.assert_array_equal(out[0], [1, 1, 1, 1, 1, 1, 1, 1, 0, 0])
    steep = ((1, 1.0), (4, 3.0), (10, 10.0))
    out = np.asarray(pre_verify.bucket_by_cost(keep, jnp.log(prob), live, (1, 4, 8, 10), steep))
    np.testing.assert_array_equal(out.sum(1), [1, 1])
    # a row that is not live does not vote: alone, the second row prefers the root
    mid = ((1, 1.0), (4, 1.3), (8, 1.4), (10, 3.0))
    both = pre_verify.bucket_by_cost(keep, jnp.log(prob), live, (1, 4, 8, 10), mid)
    np.testing.assert_array_equal(np.asarray(both).sum(1), [8, 8])
    second = pre_verify.bucket_by_cost(
        keep, jnp.log(prob), jnp.array([False, True]), (1, 4, 8, 10), mid
    )
    np.testing.assert_array_equal(np.asarray(second).sum(1), [1, 1])


@pytest.mark.slow
def test_greedy_unchanged_with_bucket_costs(target):
    """The per-step bucket chosen from costs (bucket_by_cost) leaves greedy output unchanged and
    does pick different buckets."""
    drafter = make_drafter("eagle", target, seed=5)
    # Costs under which 8 and 16 nodes score nearly alike for this drafter (whose kept nodes'
    # path probabilities are near 1), so the choice changes from step to step.
    costs = ((1, 1.0), (4, 1.6), (8, 2.0), (16, 3.9))
    drafter.pre_verifier = random_pre_verifier(0.01, seed=6, costs=costs)
    ref = specjax.generate(target, PROMPTS, max_new_tokens=21)
    out = specjax.speculative_generate(
        target, drafter, PROMPTS, max_new_tokens=21,
        config=SpecConfig(tree=TreeConfig.dynamic(15, 5, 3)),
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    verified = np.asarray(out.stats["verified_nodes"])  # [B] mean verified nodes per step
    assert np.all(verified >= 1) and np.all(verified <= 16)
    # Different buckets were chosen: a row verifying one bucket at every step would read that
    # bucket, so a mean strictly between 8 and 16 means more than one size was verified.
    assert np.all((verified > 8) & (verified < 16)), verified


@pytest.mark.slow
def test_pruning_sampled_children_would_be_caught(monkeypatch):
    """Control: the engine's refusal matters. Forcing the pre-verifier onto a sampled chain
    (dropping children by their own sampled token) biases the output, and the same exact check
    as above catches it."""
    from specjax import speculative

    target = sharpened(CFG, 3, 3.0)
    drafter = LMDrafter(sharpened(ModelConfig(**{**CFG.__dict__, "n_layers": 1}), 11, 2.0))
    drafter.pre_verifier = random_pre_verifier(0.2, seed=2)
    forced = property(lambda self: self.drafter.pre_verifier)
    monkeypatch.setattr(speculative.SpeculativeLoop, "pre_verifier", forced)
    speculative._speculative.clear_cache()
    sampling = SamplingConfig(temperature=1.0)
    tree = TreeConfig.chain(2)
    try:
        out = specjax.speculative_generate(
            target, drafter, [PROMPT] * N_ROWS, max_new_tokens=observed_tokens(tree),
            config=SpecConfig(tree=tree, rule="chain"), sampling=sampling,
            key=jax.random.split(jax.random.key(0), N_ROWS),
        )  # fmt: skip
    finally:
        speculative._speculative.clear_cache()
    assert check_rows(np.asarray(out.tokens), target, sampling) is not None


@pytest.mark.parametrize("kind", ["eagle", "mdc"])
def test_recorded_hidden_states_belong_to_each_nodes_parent(target, kind):
    """record_steps(with_hidden=True) drafts and accepts exactly what a plain recording does and
    adds each node's token and the drafter state its distribution was read from: zeros at the
    root, one state per parent (siblings share it; eagle's differ between parents, mdc's chain
    slot is one per depth). The drafter is left as it was."""
    drafter = make_drafter(kind, target)
    config = SpecConfig(tree=TreeConfig.dynamic(9, 3, 3))
    record = dict(config=config, max_new_tokens=8)
    plain = pvt.record_steps(target, drafter, PROMPTS, **record)
    rich = pvt.record_steps(target, drafter, PROMPTS, with_hidden=True, **record)
    assert drafter.record_hidden is False and "record_hidden" not in vars(drafter)
    assert len(plain) == len(rich) > 0
    distinct_parents = 0
    for a, r in zip(plain, rich, strict=True):
        for field in ("parents", "valid", "node_stats", "path"):
            np.testing.assert_array_equal(getattr(a, field), getattr(r, field))
        assert a.hidden is None and r.hidden.shape == (10, target.config.d_model)
        assert r.tokens.shape == (10,)
        np.testing.assert_array_equal(r.hidden[0], 0.0)
        nodes = np.flatnonzero(r.valid)[1:]
        depth = r.node_stats[:, NODE_STATS.index("depth")].astype(int)
        for i in nodes:
            for j in nodes:
                same = r.parents[i] == r.parents[j] or (kind == "mdc" and depth[i] == depth[j])
                if same:
                    np.testing.assert_array_equal(r.hidden[i], r.hidden[j])
                elif depth[i] == depth[j] or kind == "mdc":
                    distinct_parents += 1
                    assert not np.array_equal(r.hidden[i], r.hidden[j])
        assert np.abs(r.hidden[nodes]).max() > 0
    assert distinct_parents > 0  # the check above had pairs to compare
    lm = LMDrafter.self_draft(1)
    with pytest.raises(ValueError, match="feature drafter"):
        pvt.record_steps(target, lm, PROMPTS, with_hidden=True, **record)


@pytest.mark.parametrize("num_nodes", [1, 3, 6])
def test_expand_topk_records_hidden_states_at_every_budget(num_nodes):
    """node_hidden has a row per node (zeros at the root and in unfilled slots) for a budget of
    the root alone, one within the pool and one larger than the pool (padded slots)."""
    from specjax.tree import expand_topk

    b, v, h = 2, 5, 3
    logits = jnp.log(jnp.arange(1, v + 1, dtype=jnp.float32) / 15.0)

    def step(states, tokens):  # the children of a slot see its state + 1
        feat = states["feat"] + 1.0
        return jnp.broadcast_to(logits, tokens.shape + (v,)), {"feat": feat}

    root = {"feat": jnp.zeros((b, h))}
    tree, _, _ = expand_topk(step, root, jnp.zeros((b,), jnp.int32), depth=2, width=1, topk=2,
                             num_nodes=num_nodes, hidden=lambda c: c["feat"])  # fmt: skip
    hidden = np.asarray(tree.node_hidden)
    assert hidden.shape == (b, num_nodes, h)
    np.testing.assert_array_equal(hidden[:, 0], 0.0)
    depth = np.asarray(tree.depth)
    valid = np.asarray(tree.valid)
    # a node at depth d was read from its parent's state: d ones (the step adds 1 a level)
    expected = np.where(valid, depth, 0)[..., None] * np.ones(h)
    expected[:, 0] = 0.0
    np.testing.assert_array_equal(hidden, expected)
    if num_nodes == 6:
        assert not valid.all()  # the pool (4 children) is smaller than the budget
