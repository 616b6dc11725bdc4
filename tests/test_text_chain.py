"""A text chain on a feature drafter's tree (TreeConfig.text_chain): the chain prompt lookup
drafts, greedy equality across trees, batches and the cache's end, the committed text, the
sampled distribution with the chain on, and the errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lively_models import lively_llama
from test_feature_drafter import make_drafter
from test_lossless_e2e import CFG, N_ROWS, check_rows, observed_tokens, sharpened
from test_ngram_drafter import LIVELY, TEST_PROMPTS, greedy_equal_across_batches, host_text_match

import specjax
from specjax.acceptance import AcceptanceProfile, ProfileRecorder
from specjax.choice import candidate_trees
from specjax.config import SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters.text_chain import draft_text_chain, host_text_chain, init_row_text
from specjax.speculative import SteppedRun, check_speculative_args


def host_chain(committed, root, k, longest):
    """The chain prompt lookup drafts after root, by brute force: (tokens, how many valid)."""
    text, ctx, out = list(committed) + [root], list(committed) + [root], []
    for _ in range(k):
        token, order = host_text_match(text, ctx, longest)
        if not order:
            break
        out.append(token)
        ctx.append(token)
    return out


def test_draft_text_chain_follows_a_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(30):
        b, t = 3, int(rng.integers(1, 20))
        ids = rng.integers(0, 4, (b, t))
        lens = rng.integers(1, t + 1, (b,))
        root = rng.integers(0, 5, (b,))  # 4: a token the text never holds
        rt = init_row_text(jnp.asarray(ids), jnp.asarray(lens), cache_len=32, max_depth=5,
                           keep=True)  # fmt: skip
        tokens, valid = draft_text_chain(rt, jnp.asarray(root, jnp.int32), 5, 3)
        for r in range(b):
            want = host_chain(ids[r, : lens[r]].tolist(), int(root[r]), 5, 3)
            n = int(np.sum(valid[r]))
            assert np.all(np.asarray(valid[r, :n])) and n == len(want), (trial, r)
            assert np.asarray(tokens[r, :n]).tolist() == want, (trial, r)


def drafted_tree(tokens, parents, depth, valid=None, stats=None):
    """A one-row DraftTree of the given node lists (node 0 the root)."""
    from specjax.tree import DraftTree

    n = len(tokens)
    return DraftTree(
        tokens=jnp.array([tokens], jnp.int32),
        parents=jnp.array([parents], jnp.int32),
        depth=jnp.array([depth], jnp.int32),
        valid=jnp.array([valid if valid is not None else [True] * n]),
        draft_prob=jnp.ones((1, n)),
        node_stats=None if stats is None else jnp.asarray(stats)[None],
    )


def test_the_chain_hangs_from_the_drafter_node_that_already_spells_its_start():
    """Where the drafter's tree spells the chain's first tokens, those chain nodes are not
    verified again and the chain's next node hangs from the drafter's node (greedy takes the
    deepest path either way; the one-hot rule tries the drafter's node first and would never
    reach a duplicate chain's rest)."""
    from specjax.drafters.feature import with_text_chain
    from specjax.drafters.text_chain import shared_prefix

    # root 5; children 8 (node 1) and 4 (node 2); 8's child 9 (node 3), 4's child 2 (node 4).
    tree = drafted_tree([5, 8, 4, 9, 2], [-1, 0, 0, 1, 2], [0, 1, 1, 2, 2])
    for chain, chain_valid, want in (
        ([8, 9, 2], [True] * 3, (3, 2)),  # spelled down to node 3
        ([8, 7, 2], [True] * 3, (1, 1)),
        ([4, 2, 6], [True] * 3, (4, 2)),
        ([8, 9, 2], [True, False, False], (1, 1)),  # an invalid chain node spells nothing
        ([7, 9, 2], [True] * 3, (0, 0)),  # the chain leaves at the root
    ):
        anchor, shared = shared_prefix(
            tree.tokens, tree.parents, tree.depth, tree.valid,
            jnp.array([chain]), jnp.array([chain_valid]),
        )  # fmt: skip
        assert (int(anchor[0]), int(shared[0])) == want, (chain, chain_valid)
    invalid = tree.replace(valid=jnp.array([[True, True, True, False, True]]))
    anchor, shared = shared_prefix(
        invalid.tokens, invalid.parents, invalid.depth, invalid.valid,
        jnp.array([[8, 9, 2]]), jnp.ones((1, 3), bool),
    )  # fmt: skip
    assert (int(anchor[0]), int(shared[0])) == (1, 1)

    # The committed text 5 8 9 2 6: after the root 5 the text drafts 8, 9, 2, 6.
    rt = init_row_text(jnp.array([[5, 8, 9, 2, 6]]), jnp.array([5]), 32, 4, keep=True)
    merged = with_text_chain(tree, rt, jnp.array([5]), 4, 1)
    assert np.asarray(merged.tokens[0, 5:]).tolist() == [8, 9, 2, 6]
    assert np.asarray(merged.valid[0, 5:]).tolist() == [False, False, True, True]
    assert np.asarray(merged.parents[0, 5:]).tolist()[2:] == [3, 7]
    assert np.asarray(merged.depth[0, 5:]).tolist() == [1, 2, 3, 4]


def test_the_drafter_path_the_chain_spells_is_as_probable_as_the_chain_says():
    """with_chain_evidence: the drafter's nodes on the path the chain also spells get at least
    the chain's own path probability (its recorded cum_logq), the chain's nodes below read their
    match, other nodes keep the network's conditional values, and path probabilities never grow
    from parent to child (what bucket_by_cost's parent closure needs)."""
    from specjax import pre_verify
    from specjax.tree import NODE_STATS

    logq, cum = NODE_STATS.index("logq"), NODE_STATS.index("cum_logq")
    # Drafter: root, 8 (node 1), 9 (node 2, child of 1), 3 (node 3, child of 1). Chain of 3:
    # nodes 4 and 5 spell 8 9 (not valid), node 6 hangs from node 2.
    stats = np.zeros((7, len(NODE_STATS)), np.float32)
    chain_logq = np.log([0.9, 0.8, 0.7])
    stats[4:, logq] = chain_logq
    stats[4:, cum] = np.cumsum(chain_logq)
    tree = drafted_tree(
        [5, 8, 9, 3, 8, 9, 4], [-1, 0, 1, 1, 0, 4, 2], [0, 1, 2, 2, 1, 2, 3],
        valid=[True, True, True, True, False, False, True], stats=stats,
    )  # fmt: skip
    network = jnp.log(jnp.array([[1.0, 0.5, 0.95, 0.4, 0.1, 0.1, 0.1]]))
    got = pre_verify.with_chain_evidence(tree, network, 3, 3)
    pi = np.exp(np.asarray(pre_verify.path_logp(got, tree.parents, 3))[0])
    np.testing.assert_allclose(pi[1], 0.9, rtol=1e-5)  # the chain's 0.9 beats the network's 0.5
    np.testing.assert_allclose(pi[2], 0.72, rtol=1e-5)  # 0.9 * 0.8 beats 0.5 * 0.95
    np.testing.assert_allclose(pi[3], 0.9 * 0.4, rtol=1e-5)  # the network's, below the raise
    np.testing.assert_allclose(pi[6], 0.72 * 0.7, rtol=1e-5)  # the chain's own node
    parents = np.asarray(tree.parents[0])
    assert all(pi[i] <= pi[parents[i]] + 1e-6 for i in range(1, 7))
    # Where the network is surer than the chain, its probability stays.
    sure = jnp.log(jnp.array([[1.0, 0.99, 0.99, 0.4, 0.1, 0.1, 0.1]]))
    pi = np.exp(np.asarray(pre_verify.path_logp(
        pre_verify.with_chain_evidence(tree, sure, 3, 3), tree.parents, 3
    ))[0])  # fmt: skip
    np.testing.assert_allclose(pi[1:3], [0.99, 0.99**2], rtol=1e-5)


@pytest.fixture(scope="module")
def lively():
    return lively_llama(LIVELY, seed=1)


GREEDY_TREES = {
    "7-3-3+text4": TreeConfig.dynamic(7, 3, 3).with_text_chain(4),
    "2-1-2+text6": TreeConfig.dynamic(2, 1, 2).with_text_chain(6),
    "7-3-3+text4-m2": TreeConfig.dynamic(7, 3, 3).with_text_chain(4, min_match=2),
    "2-1-2+text6-m1": TreeConfig.dynamic(2, 1, 2).with_text_chain(6, min_match=1),
}
# 15-25 s a case on a 2-core CPU: the default run keeps a chain verified whole (mdc) and one
# verified where drafted (eagle), each kind once; every other pairing runs under `slow`.
DEFAULT_GREEDY = {("2-1-2+text6", "mdc"), ("7-3-3+text4-m2", "eagle")}


@pytest.mark.parametrize(
    "tree, kind",
    [
        pytest.param(
            tree, kind, id=f"{name}-{kind}",
            marks=() if (name, kind) in DEFAULT_GREEDY else pytest.mark.slow,
        )
        for name, tree in GREEDY_TREES.items()
        for kind in ("eagle", "mdc")
    ],
)  # fmt: skip
def test_greedy_equals_generate_across_trees_batches_and_the_cache_end(lively, tree, kind):
    outs = greedy_equal_across_batches(lively, make_drafter(kind, lively), tree)
    # Paths longer than the drafter's own depth went through the text chain.
    hist = np.asarray(outs[-1].stats["accepted_hist"]).sum(0)
    assert hist[tree.drafter_depth + 1 :].sum() > 0, hist
    verified = np.asarray(outs[-1].stats["verified_nodes"])
    if tree.text_min_match:  # verified where drafted: some steps ran on fewer nodes
        assert np.all(verified < tree.num_nodes) and np.all(verified >= tree.drafter_nodes)
    else:
        assert np.all(verified == tree.num_nodes)


def test_the_committed_text_is_the_prompt_and_the_output(lively):
    drafter = make_drafter("eagle", lively)
    tree = TreeConfig.dynamic(3, 2, 2).with_text_chain(5)
    ref = specjax.generate(lively, TEST_PROMPTS, max_new_tokens=30)
    run = SteppedRun(lively, drafter, TEST_PROMPTS, max_new_tokens=30, config=SpecConfig(tree=tree))
    for _ in range(4):
        run.step()
    rt = run.state.drafter_state.row_text
    for b, prompt in enumerate(TEST_PROMPTS):
        filled = int(rt.filled[b])
        emitted = filled - len(prompt)
        assert emitted >= 4  # the prefill's token and at least one per step
        want = prompt + np.asarray(ref.tokens[b, :emitted]).tolist()
        assert np.asarray(rt.text[b, :filled]).tolist() == want, b


@pytest.mark.parametrize(
    "kind, min_match",
    # The default run keeps one case a kind (the chain verified whole for mdc, where drafted
    # for the eagle); ~20-25 s each on a 2-core CPU.
    [
        pytest.param("eagle", 0, marks=pytest.mark.slow),
        ("mdc", 0),
        ("eagle", 1),
        pytest.param("mdc", 1, marks=pytest.mark.slow),
    ],
)
def test_sampled_text_chain_keeps_the_target_distribution(kind, min_match, optimized_loop):
    """The one-hot tree rule over the drafter's top-1 and the text's chain of 2: the joint
    distribution of the first tokens over N_ROWS sampled rows is the target's exact one. The
    prompt repeats itself, so the text's chain is accepted often (~12% of steps: measured with
    this target and drafter), and a path of two drafts can only have gone through it. With
    min_match the tree is compacted to its drafted nodes before verification (in a batch this
    large some row always drafts the whole chain, so the whole bucket runs; the greedy case
    covers the smaller buckets)."""
    out = sampled_run_checked(kind, min_match)
    hist = np.asarray(out.stats["accepted_hist"]).sum(0)
    assert hist[2] > 0.005 * hist.sum() and hist[0] > 0.05 * hist.sum(), hist


def sampled_run_checked(kind: str, min_match: int, pre_verifier=None):
    """N_ROWS rows of a self-repeating prompt sampled at T=1 with the one-hot tree rule over
    the drafter's top-1 and the text's chain of 2 (the drafter given `pre_verifier`); asserts
    that the joint distribution of the first tokens is the target's exact one, returns the
    output."""
    target = sharpened(CFG, 4, 2.0)
    prompt = [1, 5, 2, 6, 3, 1, 5, 2, 6, 3]
    drafter = make_drafter(kind, target, seed=2, scale=2.0)
    if pre_verifier is not None:
        drafter.pre_verifier = pre_verifier
    sampling = SamplingConfig(temperature=1.0)
    tree = TreeConfig.dynamic(1, 1, 1).with_text_chain(2, min_match=min_match)
    out = specjax.speculative_generate(
        target, drafter, [prompt] * N_ROWS, max_new_tokens=observed_tokens(tree),
        config=SpecConfig(tree=tree), sampling=sampling,
        key=jax.random.split(jax.random.key(0), N_ROWS),
    )  # fmt: skip
    problem = check_rows(np.asarray(out.tokens), target, sampling, prompt)
    assert problem is None, problem
    return out


def test_a_text_chain_needs_a_dynamic_tree_and_a_drafter_that_adds_it(lively):
    with pytest.raises(ValueError, match="text chain hangs off a dynamic tree"):
        TreeConfig(branching=(2, 1), text_chain=2)
    with pytest.raises(ValueError, match="text_chain must be >= 0"):
        TreeConfig.dynamic(3, 2, 2).with_text_chain(-1)

    class DynamicWithoutText:  # a drafter choosing dynamic trees that adds no text chain
        samples_children = False
        dynamic_trees = True

        def check_compatible(self, target):
            pass

    tree = TreeConfig.dynamic(3, 2, 2).with_text_chain(2)
    with pytest.raises(ValueError, match="cannot add a text chain"):
        check_speculative_args(lively, DynamicWithoutText(), SpecConfig(tree=tree),
                               SamplingConfig())  # fmt: skip
    assert tree.num_nodes == 6 and tree.max_depth == 2 and tree.drafter_nodes == 4
    assert TreeConfig.dynamic(3, 2, 2).with_text_chain(5).max_depth == 5
    assert not TreeConfig.dynamic(2, 2, 1).with_text_chain(2).is_chain


def test_the_tree_spelling_takes_a_text_chain(tmp_path):
    from specjax.bench.methods import parse_method
    from specjax.choice import tree_label
    from specjax.drafters.spec import tree_for

    (tmp_path / "drafter.json").write_text("{}")  # names a feature drafter directory
    tree = tree_for(str(tmp_path), "7,4,4,8")
    assert tree == TreeConfig.dynamic(7, 4, 4).with_text_chain(8)
    assert tree_for(str(tmp_path), "7,4,4").text_chain == 0
    matched = tree_for(str(tmp_path), "7,4,4,8,3")
    assert matched == TreeConfig.dynamic(7, 4, 4).with_text_chain(8, min_match=3)
    with pytest.raises(ValueError, match="N,DEPTH,TOPK,TEXT"):
        tree_for(str(tmp_path), "7,4,4,8,3,1")
    assert tree_label(tree) == "dynamic(7,4,4)+text(8)"
    assert tree_label(matched) == "dynamic(7,4,4)+text(8,m3)"
    assert parse_method(f"{tmp_path}@7,4,4,8").name.endswith("tree 7/d4/top4 + text 8")
    assert parse_method(f"{tmp_path}@7,4,4,8,3").name.endswith("+ text 8 (match 3+)")
    with pytest.raises(ValueError, match="needs a text chain"):
        TreeConfig(branching=(4, 1), budget=7, text_min_match=2)
    assert TreeConfig.dynamic(7, 4, 4).with_text_chain(0, min_match=3).text_min_match == 0


def test_the_host_chain_is_the_engine_chain():
    """Calibration replays the chain on the host (host_text_chain): the same tokens as the
    engine's draft_text_chain, and the same nodes drafted from a minimum match."""
    rng = np.random.default_rng(1)
    for trial in range(30):
        t = int(rng.integers(1, 25))
        ids = rng.integers(0, 4, (1, t))
        root = int(rng.integers(0, 5))
        rt = init_row_text(jnp.asarray(ids), jnp.asarray([t]), cache_len=40, max_depth=6,
                           keep=True)  # fmt: skip
        tokens, valid = draft_text_chain(rt, jnp.asarray([root], jnp.int32), 6, 3)
        n = int(np.sum(valid[0]))
        want = host_text_chain(ids[0].tolist() + [root], 6, 3)
        assert np.asarray(tokens[0, :n]).tolist() == want, trial
        # From matches of m+ tokens: the prefix whose host match lengths are >= m.
        _, matches = host_text_chain(ids[0].tolist() + [root], 6, 3, with_matches=True)
        for m in (2, 3):
            _, valid_m = draft_text_chain(rt, jnp.asarray([root], jnp.int32), 6, 3, m)
            prefix = next((i for i, x in enumerate(matches) if x < m), len(matches))
            assert int(np.sum(valid_m[0])) == prefix, (trial, m)


def test_profiles_predict_text_chains_as_the_longer_path():
    """One recorded step of a dynamic(4, 2, 2) probe (the tau table of test_choice's example:
    depth 1 [1, 1, 2, 2, 2], depth 2 [1, 1, 1, 2, 3] by node count) whose text chain had its
    first token right: a tree with a chain keeps the longer of its path and the chain's."""
    rec = ProfileRecorder(TreeConfig.dynamic(4, 2, 2), "greedy", text_chains=(2, 4))
    rec.add([-1, 0, 0, 1, 2], [0, 1, 1, 2, 2], [True] * 5, [1, 0.6, 0.3, 0.9, 0.5], [0, 2, 4], 2)
    rec.add_text(0, 1)
    p = rec.profile()
    assert p.text_chains == (2, 4)
    assert p.predict_tau(TreeConfig.dynamic(1, 1, 2).with_text_chain(2)) == 2.0  # chain wins
    assert p.predict_tau(TreeConfig.dynamic(4, 2, 2).with_text_chain(4)) == 3.0  # tree wins
    assert not p.covers(TreeConfig.dynamic(4, 2, 2).with_text_chain(8))  # not measured
    again = AcceptanceProfile.from_json(json.loads(json.dumps(p.to_json())))
    assert again == p
    tree = TreeConfig.dynamic(2, 2, 2).with_text_chain(2)
    for shift in (0.5, 1.3):
        assert p.scaled_tau(tree, shift) == pytest.approx(p.scaled(shift).predict_tau(tree))
    # The chain's gain over its drafter tree moves with the shift like the tree's own tau.
    base = tree.with_text_chain(0)
    gain = p.predict_tau(tree) - p.predict_tau(base)
    assert gain > 0
    assert p.scaled_tau(tree, 0.5) - p.scaled_tau(base, 0.5) == pytest.approx(0.5 * gain)
    chained = [t for t in candidate_trees(p, 8) if t.text_chain]
    assert TreeConfig.dynamic(4, 2, 2).with_text_chain(2) in chained
    assert max(t.num_nodes for t in chained) <= 8


def test_text_tables_by_answer_length_count_the_steps_before_each_length():
    """Two recorded steps of the same tree, the first early in its answer (emitted 10) with the
    chain's first token right, the second late (emitted 100) with two right: the 64-token table
    holds the first step's gain only, the 128-token table both; a call picks the longest measured
    length up to its max_new_tokens (the shortest below all of them)."""
    rec = ProfileRecorder(TreeConfig.dynamic(4, 2, 2), "greedy", text_chains=(2,),
                          text_lengths=(64, 128))  # fmt: skip
    step = ([-1, 0, 0, 1, 2], [0, 1, 1, 2, 2], [True] * 5, [1, 0.6, 0.3, 0.9, 0.5], [0, 0, 0], 0)
    rec.add(*step)
    rec.add(*step)
    # Both chains drafted 2 nodes, one of them from a match of TEXT_MIN_MATCH+ tokens.
    rec.add_text(0, 1, emitted=10, drafted=2, matched=1)
    rec.add_text(1, 2, emitted=100, drafted=2, matched=1)
    p = rec.profile()
    assert p.text_lengths == (64, 128)
    assert p.text_drafted == (0.0, 0.0, 1.0) and p.matched_drafted == (0.0, 1.0, 0.0)
    # From such matches the chain gets 1 token right at both steps: tau 2 over every step; at
    # 64 tokens its gain (1.0) scales as the any-match chain's does there (1.0 of 1.5).
    matched = TreeConfig.dynamic(4, 2, 2).with_text_chain(2, min_match=3)
    assert p.predict_tau(matched) == 2.0
    assert p.at_answer_length(64).predict_tau(matched) == pytest.approx(1 + 1 / 1.5, abs=1e-4)
    assert p.at_answer_length(128).predict_tau(matched) == 2.0
    tree = TreeConfig.dynamic(4, 2, 2).with_text_chain(2)
    # The tree accepts nothing on its own (tau 1); the chain 2 then 3 tokens a step.
    assert p.predict_tau(tree) == 2.5  # every step
    assert p.at_answer_length(64).predict_tau(tree) == 2.0  # the first step only
    assert p.at_answer_length(100).predict_tau(tree) == 2.0
    assert p.at_answer_length(128).predict_tau(tree) == 2.5
    assert p.at_answer_length(16).text_length == 64
    assert p.at_answer_length(4096).text_length == 128
    assert p.at_answer_length(64).predict_tau(TreeConfig.dynamic(4, 2, 2)) == 1.0
    again = AcceptanceProfile.from_json(json.loads(json.dumps(p.to_json())))
    assert again == p
    plain = ProfileRecorder(TreeConfig.dynamic(4, 2, 2), "greedy").profile()
    assert plain.at_answer_length(64) is plain
    with pytest.raises(ValueError, match="call it before scaled"):  # would undo the shift
        p.scaled(0.8).at_answer_length(64)


def test_calibration_replays_the_chain_at_each_step_against_what_the_target_wrote(
    lively, monkeypatch
):
    """calibrate's replay gives host_text_chain the text up to each step's root and compares
    its tokens with what the target wrote next. With an oracle chain (the target's own next
    tokens, read off generate's output for the text it is given) every chain node is right, so
    a chain of 8 adds min(8, tokens left) a step; a text or a comparison off by one token
    would make the oracle's tokens wrong at almost every step."""
    import specjax.drafters.text_chain as text_chain
    from specjax.acceptance import calibrate

    prompt, new = TEST_PROMPTS[1], 40
    out = specjax.generate(lively, [prompt], max_new_tokens=new)
    ref = prompt + np.asarray(out.tokens[0]).tolist()

    def oracle(text, k, longest, with_matches=False):
        assert text == ref[: len(text)]  # the committed text and the root, in order
        tokens = ref[len(text) : len(text) + k]
        # Only the first two nodes come from matches of TEXT_MIN_MATCH+ tokens.
        return (
            (tokens, [8, 5, 2, 8, 8, 8, 8, 8, 8, 8, 8, 8][: len(tokens)])
            if with_matches
            else tokens
        )

    monkeypatch.setattr(text_chain, "host_text_chain", oracle)
    drafter = make_drafter("eagle", lively)
    probe = TreeConfig.dynamic(7, 3, 3)
    p = calibrate(lively, drafter, [prompt], probe=probe, max_new_tokens=new)
    assert p.text_chains == (2, 4, 8, 12)
    assert p.text_lengths == (new,)  # the run's own answer length only (below the first)
    with_chain = p.predict_tau(probe.with_text_chain(8))
    # Each step emits the chain's 8 tokens and the bonus while 9 or more are left.
    assert with_chain > 7.0 and with_chain > p.predict_tau(probe) + 4.0, with_chain
    # From matches of 3+ tokens the chain drafts (and gets right) its first two nodes only.
    matched = p.predict_tau(probe.with_text_chain(8, min_match=3))
    assert 2.5 < matched < with_chain - 3.0, matched
    assert p.matched_drafted[2] > 0.8 and p.text_drafted[12] > 0.5


def test_the_default_runs_its_chosen_chain_verified_where_drafted():
    """The default's chained trees run with text_min_match 1: the same tokens as the profile's
    tables (drafted from any match), which therefore still cover the tree; TEXT_MIN_MATCH has
    tables of its own, other minimum matches are not covered."""
    from specjax.api import _verified_where_drafted

    tree = TreeConfig.dynamic(4, 2, 2).with_text_chain(2)
    run = _verified_where_drafted(SpecConfig(tree=tree, fallback_tau=1.5))
    assert run.tree == tree.with_text_chain(2, min_match=1) and run.fallback_tau == 1.5
    plain = SpecConfig(tree=TreeConfig.dynamic(4, 2, 2))
    assert _verified_where_drafted(plain) == plain
    rec = ProfileRecorder(TreeConfig.dynamic(4, 2, 2), "greedy", text_chains=(2,))
    rec.add([-1, 0, 0, 1, 2], [0, 1, 1, 2, 2], [True] * 5, [1, 0.6, 0.3, 0.9, 0.5], [0, 2, 4], 2)
    rec.add_text(0, 1)
    p = rec.profile()
    assert p.covers(tree) and p.covers(tree.with_text_chain(2, min_match=1))
    assert p.predict_tau(tree.with_text_chain(2, min_match=1)) == p.predict_tau(tree)
    assert p.covers(tree.with_text_chain(2, min_match=3))  # TEXT_MIN_MATCH: its own table
    assert not p.covers(tree.with_text_chain(2, min_match=2))  # not measured


def test_a_cost_aware_pre_verifier_predicts_chain_nodes_by_their_match():
    """keep_mask reads a text chain's nodes (the last text_nodes) from their recorded logq (the
    match table's value) and the drafter's nodes from the network: a threshold between the two
    chain nodes' path probabilities keeps the first chain node and drops the second, whatever
    the network would have said about them."""
    from test_pre_verifier import random_pre_verifier

    from specjax import pre_verify
    from specjax.drafters.text_chain import CHAIN_NODE_LOGP, chain_node_logp
    from specjax.tree import NODE_STATS

    matches = jnp.array([[8, 1]])  # first chain node from an 8-token match, second from 1
    logq = chain_node_logp(matches)
    np.testing.assert_allclose(np.asarray(logq[0]), [CHAIN_NODE_LOGP[-1], CHAIN_NODE_LOGP[0]])
    stats = np.zeros((4, len(NODE_STATS)), np.float32)
    stats[2:, 0] = np.asarray(logq[0])
    # node 1 the drafter's, nodes 2-3 the chain
    tree = drafted_tree([5, 6, 7, 8], [-1, 0, 0, 2], [0, 1, 1, 2], stats=stats)
    cut = float(np.exp(CHAIN_NODE_LOGP[-1] + CHAIN_NODE_LOGP[0] / 2))  # between the two paths
    pv = random_pre_verifier(cut)
    live = jnp.ones((1,), bool)
    keep = np.asarray(pre_verify.keep_mask(tree, pv, live, 3, text_nodes=2))
    assert keep[0, 2] and not keep[0, 3], keep
    network = np.asarray(pv.node_logp(tree.node_stats))[0, 1]
    assert keep[0, 1] == (network >= np.log(cut)), (keep, network)
    # Without text_nodes the network judges the chain's nodes too.
    blind = np.asarray(pre_verify.keep_mask(tree, pv, live, 3))
    want = np.asarray(pre_verify.path_logp(pv.node_logp(tree.node_stats), tree.parents, 3))
    np.testing.assert_array_equal(blind[0, 1:], want[0, 1:] >= np.log(cut))


@pytest.mark.parametrize("kind", ["eagle", pytest.param("mdc", marks=pytest.mark.slow)])
def test_a_cost_aware_pre_verifier_with_a_text_chain_keeps_greedy_output(lively, kind):
    """A pre-verifier choosing each step's bucket by costs prunes the drafter's nodes and the
    text chain's together (a threshold-only one is off with a chain): greedy output equals
    generate at batch 1 and 3 and up to the cache's end, steps ran on several node counts, and
    the chain's nodes were accepted."""
    from test_pre_verifier import random_pre_verifier

    from specjax.speculative import pruning_pre_verifier

    tree = TreeConfig.dynamic(7, 3, 3).with_text_chain(4, min_match=1)  # 12 nodes
    drafter = make_drafter(kind, lively)
    drafter.pre_verifier = random_pre_verifier(0.3)
    assert pruning_pre_verifier(drafter, SpecConfig(tree=tree), "greedy") is None
    # Costs under which the buckets (1, 4, 8, 10, 12) score near each other.
    costs = ((1, 1.0), (4, 1.05), (8, 1.1), (10, 1.3), (12, 1.45))
    drafter.pre_verifier = random_pre_verifier(0.0, costs=costs)
    assert pruning_pre_verifier(drafter, SpecConfig(tree=tree), "greedy") is not None
    outs = greedy_equal_across_batches(lively, drafter, tree)
    hist = np.asarray(outs[-1].stats["accepted_hist"]).sum(0)
    assert hist[tree.drafter_depth + 1 :].sum() > 0, hist
    verified = np.asarray(outs[-1].stats["verified_nodes"])
    assert np.all(verified < tree.num_nodes) and np.all(verified > 1), verified


def test_sampled_cost_aware_pruning_of_tree_and_chain_keeps_the_target_distribution(
    optimized_loop,
):
    """The one-hot tree rule with the cost-aware pre-verifier pruning the drafter's top-1 and
    the text's chain of 2 together: under these costs every step verifies 2 nodes, so each row
    keeps only the one of its two first nodes the predictions favour (by the drafter's
    statistics and the chain's match, never by the target). The joint distribution of the
    first tokens over N_ROWS sampled rows is still the target's exact one."""
    from test_pre_verifier import random_pre_verifier

    pv = random_pre_verifier(0.0, costs=((1, 1.0), (2, 1.01), (4, 3.0)))
    out = sampled_run_checked("eagle", 1, pre_verifier=pv)
    np.testing.assert_allclose(np.asarray(out.stats["verified_nodes"]), 2.0)
    hist = np.asarray(out.stats["accepted_hist"]).sum(0)
    assert hist[1] > 0.05 * hist.sum() and hist[2] == 0, hist
