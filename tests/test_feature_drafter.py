"""Feature drafters (hidden-state mdc with reuse, EAGLE-style): losslessness end to end, train/test
consistency of the unrolled training forward, reuse accounting, checkpoints and errors.

Random drafters are used here (any drafter must be lossless); trained ones are measured by
experiments/drafters.py and checked for greedy equality by the slow tests in test_drafters_real.py.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lively_models import lively_llama
from specjax.kernels import cpu_panels
from test_lossless_e2e import (
    CFG,
    N_ROWS,
    PROMPT,
    check_rows,
    observed_tokens,
    sharpened,
)

import specjax
from specjax.config import TINY, SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters import load_drafter
from specjax.drafters.feature import EagleDrafter, HiddenStateDrafter
from specjax.models.drafter import DrafterConfig, DrafterNet, target_parts, unrolled_outputs
from specjax.train.checkpoint import load_drafter_net, save_drafter
from specjax.train.data import Dataset
from specjax.train.trainer import TrainConfig, train

KINDS = {"mdc": HiddenStateDrafter, "eagle": EagleDrafter}
# "mdc2": the hidden-state drafter injecting the parent and the grandparent token ("mdc4": and two
# more ancestors); "-fused": the drafter reads the target's layer 1 fused into its last hidden
# state (EAGLE-3's fusion).
VARIANTS = ["mdc", "mdc2", "mdc4", "eagle"]


def make_drafter(kind, target, seed=0, reuse=True, scale=1.0, fresh_slots=1):
    """A random drafter of kind "mdc", "mdc2", "mdc4" or "eagle", optionally "-fused" (e.g.
    "mdc2-fused"; "-stale" for mdc's stale-plus-fresh logits); mdc recomputes
    only the root's slot (fresh_slots=1), so that shallow test trees still reuse much of the
    chain."""
    kind, stale = kind.removesuffix("-stale"), kind.endswith("-stale")
    kind, fused = kind.removesuffix("-fused"), kind.endswith("-fused")
    path_tokens = int(kind[3:]) if kind[3:].isdigit() else 1
    kind = kind.rstrip("0123456789")
    cfg = DrafterConfig(
        kind=kind,
        target=target.config,
        draft_vocab_size=target.config.vocab_size,
        path_tokens=path_tokens,
        fusion_layers=(1,) if fused else (),
    )
    net = DrafterNet(cfg, np.arange(cfg.draft_vocab_size), rngs=nnx.Rngs(seed), target=target)
    net.fc.set_value(net.fc[...] * scale)
    if fused:  # a fusion that is not the identity
        w = net.fusion_fc
        w.set_value(jax.random.normal(jax.random.key(seed + 2), w.shape) / np.sqrt(w.shape[0]))
    if kind == "mdc":  # a readout MLP that is not the identity
        down = net.readout_down
        down.set_value(jax.random.normal(jax.random.key(seed + 1), down.shape) / down.shape[0])
        if path_tokens >= 3:  # far ancestors that count (their weight starts at zero)
            net.far_norm.set_value(jnp.ones_like(net.far_norm[...]))
        return HiddenStateDrafter(
            net, target, reuse=reuse, fresh_slots=fresh_slots, stale_logits=stale
        )
    return EagleDrafter(net, target)


def proposer_after(target, drafter, prompts, cfg, steps, max_new_tokens=24):
    """(engine state, propose) after `steps` speculative steps: propose() drafts a greedy tree
    from that state with the drafter's settings at the time of the call (propose(True): the
    tree and the drafter's new state)."""
    from specjax.drafters.base import RootContext
    from specjax.speculative import SteppedRun

    run = SteppedRun(target, drafter, prompts, max_new_tokens=max_new_tokens, config=cfg)
    for _ in range(steps):
        run.step()
    s = run.state
    ctx = RootContext(root=s.root, prev=s.prev, lengths=s.verifier_state.lengths)

    def propose(with_state=False):
        tree, state = drafter.propose(
            s.drafter_state, target, ctx, s.keys, config=cfg, sampling=SamplingConfig()
        )
        return (tree, state) if with_state else tree

    return s, propose


@pytest.fixture(scope="module")
def tiny_target():
    return specjax.Llama(TINY, rngs=nnx.Rngs(0))


# The default run keeps one case per drafter kind (test_properties.py covers greedy equality over
# random trees); mdc2 and reuse off run under `slow`.
@pytest.mark.parametrize(
    ("kind", "reuse"),
    [
        ("mdc", True),
        ("eagle-fused", True),
        pytest.param("eagle", True, marks=pytest.mark.slow),
        pytest.param("mdc-fused", True, marks=pytest.mark.slow),
        pytest.param("mdc2", True, marks=pytest.mark.slow),
        ("mdc4", True),
        pytest.param("mdc", False, marks=pytest.mark.slow),
        pytest.param("mdc2", False, marks=pytest.mark.slow),
        pytest.param("mdc-stale", True, marks=pytest.mark.slow),
    ],
)
def test_greedy_equals_generate_ragged_batch(kind, reuse):
    """On a target whose output varies (the random init repeats one token, which every draft
    would match), with drafts both accepted and rejected."""
    target = lively_llama(TINY, 0)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [3]]
    ref = specjax.generate(target, prompts, max_new_tokens=24)
    drafter = make_drafter(kind, target, reuse=reuse)
    hist = 0
    for tree in (TreeConfig.dynamic(7, 3, 3), TreeConfig.chain(3)):
        out = specjax.speculative_generate(
            target, drafter, prompts, max_new_tokens=24, config=SpecConfig(tree=tree)
        )
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
        np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
        hist = hist + np.asarray(out.stats["accepted_hist"]).sum(0)[:4]
    assert hist[0] > 0 and hist[1:].sum() > 0, hist


@pytest.mark.skipif(
    jax.default_backend() != "cpu" or not cpu_panels.available(),
    reason="the eagle's levels go through the CPU attention kernel where it builds",
)
# ~15 s a tree on a 2-core CPU: the default run keeps the dynamic tree with several children
# a level; the deeper one-child tree and the static tree run under `slow`.
@pytest.mark.parametrize(
    "tree",
    [
        TreeConfig.dynamic(7, 3, 3),
        pytest.param(TreeConfig.dynamic(5, 4, 1), marks=pytest.mark.slow),
        pytest.param(TreeConfig(branching=(2, 2)), marks=pytest.mark.slow),
    ],
    ids=["dynamic-7-3-3", "dynamic-5-4-1", "static-2-2"],
)
def test_eagle_levels_through_the_kernel_draft_the_same_tree(tiny_target, tree):
    """The eagle's tree levels through the CPU kernel (keys written past the context, a mask of
    ancestors) draft what the carried-ancestors attention drafts, from ragged rows
    mid-generation: the same tokens and parents, probabilities to float tolerance."""
    drafter = make_drafter("eagle", tiny_target, seed=2)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [3]]
    trees = {}
    for impl in ("auto", "reference"):
        cfg = SpecConfig(tree=tree, attn_impl=impl, pre_verify=False)
        assert drafter.tree_keys_in_cache(cfg) == (tree.max_depth * tree.topk) * (impl == "auto")
        _, propose = proposer_after(tiny_target, drafter, prompts, cfg, steps=3)
        trees[impl] = propose()
    kernel, carried = trees["auto"], trees["reference"]
    np.testing.assert_array_equal(np.asarray(kernel.tokens), np.asarray(carried.tokens))
    np.testing.assert_array_equal(np.asarray(kernel.parents), np.asarray(carried.parents))
    np.testing.assert_allclose(
        np.asarray(kernel.draft_prob), np.asarray(carried.draft_prob), rtol=1e-4, atol=1e-6
    )


@pytest.mark.slow
def test_rows_do_not_depend_on_each_other(tiny_target):
    drafter = make_drafter("mdc", tiny_target)
    cfg = SpecConfig(tree=TreeConfig.dynamic(6, 3, 2))
    sampling = SamplingConfig(temperature=1.0)
    keys = jax.random.split(jax.random.key(5), 3)
    both = specjax.speculative_generate(
        tiny_target,
        drafter,
        [[1, 2], [7, 7, 7]],
        max_new_tokens=16,
        config=cfg,
        sampling=sampling,
        key=keys[:2],
    )
    other = specjax.speculative_generate(
        tiny_target,
        drafter,
        [[1, 2], [3, 4, 5, 6]],
        max_new_tokens=16,
        config=cfg,
        sampling=sampling,
        key=jnp.stack([keys[0], keys[2]]),
    )
    np.testing.assert_array_equal(np.asarray(both.tokens[0]), np.asarray(other.tokens[0]))


@pytest.fixture(scope="module")
def lossless_target():
    return sharpened(CFG, 3, 3.0)


# The default run keeps mdc (~35 s on a 2-core CPU): its chain reused after rejections is the
# path a bias could hide in; the eagle's top-k children go through the same tree, rule and
# commits (and the default run samples the eagle with a text chain in test_text_chain).
@pytest.mark.parametrize(
    "kind",
    [
        "mdc",
        pytest.param("eagle", marks=pytest.mark.slow),
        pytest.param("mdc2", marks=pytest.mark.slow),
        pytest.param("mdc4", marks=pytest.mark.slow),
        pytest.param("eagle-fused", marks=pytest.mark.slow),
    ],
)
def test_sampling_matches_target_distribution(lossless_target, kind, optimized_loop):
    """The whole path with a feature drafter (dynamic top-k tree, one-hot rule, drafter cache
    commits, and for mdc the reuse of the hidden-state chain after rejections) samples the
    target's exact joint distribution of the first depth + 2 tokens, the bonus token after a
    fully accepted first step included (see test_lossless_e2e)."""
    target = lossless_target
    drafter = make_drafter(kind, target, seed=2, scale=2.0)
    sampling = SamplingConfig(temperature=1.0)
    tree = TreeConfig.dynamic(5, 3, 2)
    out = specjax.speculative_generate(
        target,
        drafter,
        [PROMPT] * N_ROWS,
        max_new_tokens=observed_tokens(tree),
        config=SpecConfig(tree=tree),
        sampling=sampling,
        key=jax.random.split(jax.random.key(0), N_ROWS),
    )
    tokens = np.asarray(out.tokens)
    problem = check_rows(tokens, target, sampling)
    assert problem is None, problem
    hist = np.asarray(out.stats["accepted_hist"]).sum(0)
    assert hist[1:].sum() > 0.05 * hist.sum() and hist[:-1].sum() > 0.05 * hist.sum(), hist
    if kind == "mdc":  # reuse really happened in these rows
        assert int(np.sum(out.stats["reused"])) > 0.05 * int(np.sum(out.stats["drafted"]))


# The default run keeps mdc2-fused (a hidden-state chain, two path tokens and the fusion); the
# others run under `slow` (mdc4, ancestors beyond the grandparent, ~18 s on a 2-core CPU: its
# drafting stays greedy-checked in test_greedy_equals_generate_ragged_batch).
@pytest.mark.parametrize(
    "kind",
    [
        k if k == "mdc2-fused" else pytest.param(k, marks=pytest.mark.slow)
        for k in [*VARIANTS, "eagle-fused", "mdc-fused", "mdc2-fused"]
    ],
)
def test_drafting_follows_the_unrolled_training_forward(tiny_target, kind):
    """A drafted greedy chain is what the training forward predicts for that chain: the token at
    depth k + 1 is the argmax of the level-k logits at the root's position + k, so the drafter
    is trained under exactly the conditions it drafts in."""
    target = tiny_target
    drafter = make_drafter(kind, target, seed=4)
    prompt = jnp.asarray([[1, 5, 2, 9, 3, 3, 7]])
    n, depth = prompt.shape[1], 3
    cache_len = 32
    from specjax.cache import init_cache
    from specjax.drafters.base import RootContext
    from specjax.prefill import prefill

    cache = init_cache(target.config, 1, cache_len)
    lens = jnp.asarray([n])
    layers = drafter.feature_layers
    _, _, hidden = prefill(target, prompt, lens, cache, "reference", return_hidden=layers)
    config = SpecConfig(tree=TreeConfig.chain(depth))
    state = drafter.init_state(target, prompt, lens, cache_len, config=config, target_hidden=hidden)
    root = jnp.asarray([4])
    ctx = RootContext(root=root, prev=prompt[:, -1], lengths=lens)
    tree, _ = drafter.propose(
        state, target, ctx, jax.random.key(0)[None], config=config, sampling=SamplingConfig()
    )
    chain = np.asarray(tree.tokens[0])  # root + depth drafted tokens
    seq = jnp.concatenate([prompt, jnp.asarray(chain)[None]], axis=1)
    # Features of the drafted positions are never read by levels >= 1 (they use their own).
    feats = jnp.pad(drafter.net.read_features(hidden), ((0, 0), (0, depth + 1), (0, 0)))
    parts = target_parts(target, drafter.net.draft_vocab[...])
    outs = unrolled_outputs(drafter.net, parts, seq, feats, depth)
    emb = jnp.take(parts.embed, seq, axis=0)
    for k in range(depth):
        j = n + k  # the parent's position; its ancestors sit before it, nearest first
        ancestors = jnp.stack([emb[:, j - a] for a in range(1, 4)], axis=1)
        logits = drafter.net.logits(parts, outs[k][:, j], emb[:, j], ancestors)
        assert int(jnp.argmax(logits[0])) == chain[k + 1], (k, chain)


@pytest.mark.slow
def test_reuse_serves_tokens_and_saves_chain_calls(tiny_target):
    cfg = SpecConfig(tree=TreeConfig.dynamic(10, 5, 2))
    stats = {}
    for reuse in (True, False):
        drafter = make_drafter("mdc", tiny_target, reuse=reuse)
        # Two rows that finish after different numbers of steps: statistics count live steps.
        out = specjax.speculative_generate(
            tiny_target,
            drafter,
            [[1, 2, 3, 4], [5, 6]],
            max_new_tokens=40,
            config=cfg,
            sampling=SamplingConfig(temperature=1.0),
            key=jax.random.key(3),
        )
        stats[reuse] = {k: np.asarray(out.stats[k]) for k in ("reused", "chain_calls", "drafted")}
        stats[reuse]["steps"] = np.asarray(out.stats["target_calls"])
        stats[reuse]["accepted"] = np.asarray(out.stats["accepted_hist"])
    assert (stats[False]["reused"] == 0).all()
    assert (stats[True]["reused"] > 0).all()
    # Without reuse every step computes the whole chain (depth 5 calls); with reuse a step after
    # a rejection computes only the root's slot and the slots the old chain did not cover.
    np.testing.assert_array_equal(stats[False]["chain_calls"], 5 * stats[False]["steps"])
    np.testing.assert_array_equal(stats[False]["drafted"], 10 * stats[False]["steps"])
    assert (stats[True]["chain_calls"] < 5 * stats[True]["steps"]).all()
    assert stats[True]["accepted"][:, :-1].sum() > 0  # rejections happened: reuse was possible


@pytest.mark.slow
def test_stale_logits_change_the_tree(tiny_target):
    """The stale-plus-fresh variant: after a rejection the recomputed slots' draft distribution
    mixes in the carried (stale) hidden state, so the trees differ from the fresh-only ones
    (greedy output: test_greedy_equals_generate_ragged_batch, mdc-stale)."""
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [3]]
    drafter = make_drafter("mdc-stale", tiny_target, fresh_slots=3)
    cfg = SpecConfig(tree=TreeConfig.dynamic(9, 4, 3))
    s, propose = proposer_after(tiny_target, drafter, prompts, cfg, steps=3)
    trees = {}
    for stale in (False, True):
        drafter.stale_logits = stale
        trees[stale] = propose()
    assert np.asarray(s.drafter_state.chain_valid).any()  # slots were carried over
    assert not np.array_equal(np.asarray(trees[False].tokens), np.asarray(trees[True].tokens))
    with pytest.raises(ValueError, match="stale_logits"):
        HiddenStateDrafter(drafter.net, tiny_target, reuse=False, stale_logits=True)


@pytest.mark.parametrize("kind", ["mdc", "mdc2", "mdc4", "eagle-fused"])
def test_checkpoint_round_trip(tmp_path, tiny_target, kind):
    drafter = make_drafter(kind, tiny_target, seed=7)
    save_drafter(
        drafter.net, tmp_path / "d", target_name="tiny", dtype="float32", target=tiny_target
    )
    net = load_drafter_net(tmp_path / "d")
    assert net.config == drafter.net.config
    # The bound drafter stores its layers in the target's layout (out_in on the CPU); the
    # checkpoint and a fresh net are canonical.
    assert drafter.net.out_in == tiny_target.layers.out_in and not net.out_in
    chex.assert_trees_all_close(net.canonical_params(), drafter.net.canonical_params())
    np.testing.assert_array_equal(net.draft_vocab[...], drafter.net.draft_vocab[...])
    loaded = load_drafter(tmp_path / "d", tiny_target)
    assert isinstance(loaded, KINDS[drafter.kind])
    assert loaded.feature_layers == ((1, 2) if kind.endswith("-fused") else (2,))


def test_averaged_drafters_are_the_mean_of_their_weights(tmp_path, tiny_target):
    """specjax.train.averaging: the mean of each parameter, and a clear error for drafters that
    cannot be averaged (another kind, another draft vocabulary, another target)."""
    from specjax.train.averaging import average_drafters

    def saved(name, net, fingerprint="fp"):
        save_drafter(net, tmp_path / name, target_name="tiny", dtype="float32",
                     fingerprint=fingerprint)  # fmt: skip
        return tmp_path / name

    a, b = (make_drafter("eagle", tiny_target, seed=s).net for s in (1, 2))
    net, header = average_drafters([saved("a", a), saved("b", b)])
    assert header["kind"] == "eagle" and header["target_fingerprint"] == "fp"
    expected = jax.tree.map(lambda x, y: (x + y) / 2, a.canonical_params(), b.canonical_params())
    assert not np.allclose(a.canonical_params()["fc"], b.canonical_params()["fc"])
    chex.assert_trees_all_close(net.canonical_params(), expected, atol=1e-6)
    np.testing.assert_array_equal(net.draft_vocab[...], a.draft_vocab[...])

    with pytest.raises(ValueError, match="configuration"):
        average_drafters([tmp_path / "a", saved("m", make_drafter("mdc", tiny_target).net)])
    vocab = np.arange(tiny_target.config.vocab_size)[::-1].copy()
    other = DrafterNet(a.config, vocab, rngs=nnx.Rngs(4), target=tiny_target)
    with pytest.raises(ValueError, match="draft vocabulary"):
        average_drafters([tmp_path / "a", saved("v", other)])
    with pytest.raises(ValueError, match="another target"):
        average_drafters([tmp_path / "a", saved("t", b, fingerprint="other")])
    with pytest.raises(ValueError, match="at least two"):
        average_drafters([tmp_path / "a"])


def test_last_tokens_are_the_ancestors_the_readout_injects(tiny_target):
    """The mdc state keeps the A = path_tokens - 1 tokens before the root: the prompt's last
    ones at the start (-1 before a short prompt's start, read as a zero embedding like the
    training's shift), then the last committed ones after each accepted path."""
    drafter = make_drafter("mdc4", tiny_target)
    prompts = jnp.asarray([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8], [9, 0, 0, 0, 0]])
    last = drafter._last_tokens(prompts, jnp.asarray([3, 5, 1]))
    np.testing.assert_array_equal(last, [[1, 2, 3], [6, 7, 8], [-1, -1, 9]])
    path = jnp.asarray([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]])  # slot 0: root
    moved = drafter._advance_last_tokens(last, path, jnp.asarray([2, 0, 1]))
    np.testing.assert_array_equal(moved, [[10, 11, 12], [7, 8, 20], [9, 30, 31]])


def test_continuation_starts_from_the_saved_weights(tmp_path, tiny_target):
    """train_drafter(init_from=DIR) starts from DIR's weights: equal after start_from; a saved
    drafter of another config or draft vocabulary is refused (train_drafter builds the net with
    the saved vocabulary: choose_draft_vocab, below, and the slow
    test_a_continuation_on_other_data_keeps_its_draft_vocabulary end to end)."""
    from specjax.train.pipeline import start_from

    saved = make_drafter("eagle", tiny_target, seed=7).net
    save_drafter(saved, tmp_path / "d", target_name="tiny", dtype="float32", target=tiny_target)

    def fresh(kind="eagle", vocab=None):
        if vocab is None:
            vocab = np.arange(tiny_target.config.vocab_size)
        cfg = DrafterConfig(kind=kind, target=tiny_target.config, draft_vocab_size=len(vocab))
        return DrafterNet(cfg, vocab, rngs=nnx.Rngs(3), target=tiny_target)

    net = fresh()
    assert not np.allclose(net.canonical_params()["fc"], saved.canonical_params()["fc"])
    start_from(net, tmp_path / "d")
    chex.assert_trees_all_close(net.canonical_params(), saved.canonical_params())
    with pytest.raises(ValueError, match="config differs"):
        start_from(fresh("mdc"), tmp_path / "d")
    # An mdc widened from two path tokens to four starts as the saved drafter: the saved
    # weights, and the far ancestors' weight at zero, so its logits are the saved one's.
    two = make_drafter("mdc2", tiny_target, seed=8).net
    save_drafter(two, tmp_path / "m2", target_name="tiny", dtype="float32", target=tiny_target)
    vocab = np.arange(tiny_target.config.vocab_size)
    cfg4 = DrafterConfig(kind="mdc", target=tiny_target.config, draft_vocab_size=len(vocab),
                         path_tokens=4)  # fmt: skip
    four = DrafterNet(cfg4, vocab, rngs=nnx.Rngs(3), target=tiny_target)
    start_from(four, tmp_path / "m2")
    saved_params = load_drafter_net(tmp_path / "m2").canonical_params()
    widened = four.canonical_params()
    chex.assert_trees_all_close({k: widened[k] for k in saved_params}, saved_params)
    parts = target_parts(tiny_target, four.draft_vocab[...])
    m = tiny_target.config.d_model
    out, parent, anc = (jax.random.normal(jax.random.key(i), s) for i, s in
                        enumerate([(2, m), (2, m), (2, 3, m)]))  # fmt: skip
    chex.assert_trees_all_close(
        four.logits(parts, out, parent, anc),
        load_drafter_net(tmp_path / "m2").logits(parts, out, parent, anc),
        atol=1e-5,
    )
    save_drafter(four, tmp_path / "m4", target_name="tiny", dtype="float32", target=tiny_target)
    with pytest.raises(ValueError, match="config differs"):  # narrowing is no continuation
        start_from(DrafterNet(two.config, vocab, rngs=nnx.Rngs(3)), tmp_path / "m4")
    # A folder that holds no drafter names itself before anything is loaded or distilled.
    from specjax.train.data import DistillConfig
    from specjax.train.pipeline import DrafterRecipe, train_drafter

    recipe = DrafterRecipe(kind="eagle", data_kind="story", distill=DistillConfig(kind="story"),
                           train=TrainConfig(steps=1))  # fmt: skip
    with pytest.raises(ValueError, match="no drafter.json"):
        train_drafter(tmp_path / "no-target", recipe, tmp_path / "out",
                      data_dir=tmp_path / "data", init_from=tmp_path)  # fmt: skip
    assert not (tmp_path / "data").exists()
    with pytest.raises(ValueError, match="draft vocabulary"):
        start_from(
            fresh(vocab=np.arange(tiny_target.config.vocab_size)[::-1].copy()), tmp_path / "d"
        )

    # A drafter of 6 tokens saved; data whose most frequent answer tokens are others.
    from specjax.train.pipeline import choose_draft_vocab

    small = fresh(vocab=np.array([0, 1, 2, 3, 4, 5]))
    save_drafter(small, tmp_path / "s", target_name="tiny", dtype="float32", target=tiny_target)
    tokens = np.array([[9, 10, 11, 12, 13, 14, 10, 11]], np.int32)
    data = Dataset(tokens=tokens, feats=np.zeros((1, 8, 4), np.float16),
                   lengths=np.array([8]), prompt_lens=np.array([1]))  # fmt: skip
    own = choose_draft_vocab(data, 6, tiny_target.config.vocab_size, 2)
    assert 2 in own and 10 in own and 0 not in own
    kept = choose_draft_vocab(data, 6, tiny_target.config.vocab_size, 2, init_from=tmp_path / "s")
    np.testing.assert_array_equal(kept, [0, 1, 2, 3, 4, 5])


def test_errors_name_the_problem(tmp_path, tiny_target):
    with pytest.raises(ValueError, match="no drafter.json"):
        load_drafter(tmp_path, tiny_target)
    (tmp_path / "drafter.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="unknown drafter checkpoint layout"):
        load_drafter(tmp_path, tiny_target)
    other = specjax.Llama(TINY.__class__(**{**TINY.__dict__, "vocab_size": 20}), rngs=nnx.Rngs(1))
    with pytest.raises(ValueError, match="vocab_size 16 vs 20"):
        make_drafter("mdc", tiny_target).check_compatible(other)
    drafter = make_drafter("eagle", tiny_target)
    with pytest.raises(ValueError, match="proposes its top-k"):
        specjax.speculative_generate(
            tiny_target,
            drafter,
            [[1, 2]],
            max_new_tokens=4,
            config=SpecConfig(tree=TreeConfig.chain(2), rule="chain"),
            sampling=SamplingConfig(temperature=1.0),
        )
    with pytest.raises(ValueError, match="static trees"):
        specjax.speculative_generate(
            tiny_target,
            specjax.LMDrafter.self_draft(1),
            [[1, 2]],
            max_new_tokens=4,
            config=SpecConfig(tree=TreeConfig.dynamic(5, 3, 2)),
        )


def test_recorded_hidden_states_equal_teacher_forced_ones(tiny_target):
    """generate(record_hidden=True) gives the hidden states a teacher-forced pass over prompt +
    answer gives (the features distillation stores)."""
    from specjax.train.data import teacher_forced_hidden

    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]
    out = specjax.generate(
        tiny_target,
        prompts,
        max_new_tokens=12,
        sampling=SamplingConfig(temperature=1.0),
        key=jax.random.key(0),
        record_hidden=True,
    )
    tokens = np.concatenate([np.asarray(prompts), np.asarray(out.tokens)], axis=1)
    graphdef, params = nnx.split(tiny_target)
    forced = np.asarray(teacher_forced_hidden(graphdef, params, jnp.asarray(tokens)))
    recorded = np.concatenate(
        [np.asarray(out.stats["prompt_hidden"])[:, :4], np.asarray(out.stats["hidden"])], axis=1
    )
    np.testing.assert_allclose(recorded[:, :-1], forced[:, :-1], atol=1e-4)
    assert np.all(recorded[:, -1] == 0)  # the last token is never read


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mdc", "eagle-fused"])
def test_training_lowers_the_loss(tiny_target, kind):
    """A few optax steps on target-written sequences raise the drafter's agreement (for a fused
    drafter, on features that hold its fusion layer, and the fusion is trained)."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 16, size=4).tolist() for _ in range(16)]
    out = specjax.generate(tiny_target, prompts, max_new_tokens=28)
    tokens = np.concatenate([np.asarray(prompts), np.asarray(out.tokens)], axis=1)
    from specjax.train.data import teacher_forced_hidden

    drafter = make_drafter(kind, tiny_target)
    lower = drafter.net.config.fusion_layers
    graphdef, params = nnx.split(tiny_target)
    hidden = teacher_forced_hidden(graphdef, params, jnp.asarray(tokens), lower)
    feats, fused = (hidden[0], np.asarray(hidden[1], np.float16)) if lower else (hidden, None)
    data = Dataset(
        tokens=tokens.astype(np.int32),
        feats=np.asarray(feats, np.float16),
        lengths=np.full(16, 32, np.int32),
        prompt_lens=np.full(16, 4, np.int32),
        fusion_feats=fused,
    )
    before = np.array(drafter.net.fusion_fc[...]) if lower else None  # (train donates)
    parts = target_parts(tiny_target, drafter.net.draft_vocab[...])
    summary = train(
        drafter.net, parts, data, TrainConfig(steps=60, batch=8, lr=3e-3, warmup=5), log=None
    )
    first, last = summary["history"][0], summary["history"][-1]
    assert last["loss"] < 0.7 * first["loss"], (first, last)
    assert last["acc0"] > first["acc0"]
    if lower:
        moved = np.abs(np.asarray(drafter.net.fusion_fc[...]) - before).max()
        assert moved > 1e-3


@pytest.mark.slow
def test_training_resumes_where_it_stopped(tiny_target, tmp_path, monkeypatch):
    """A run stopped after a progress save and started again with the same folder ends with the
    same weights as an unbroken run; a folder from a run with other settings is refused."""
    from specjax.train import trainer
    from specjax.train.data import teacher_forced_hidden

    rng = np.random.default_rng(2)
    tokens = rng.integers(1, 16, size=(16, 16)).astype(np.int32)
    graphdef, params = nnx.split(tiny_target)
    data = Dataset(
        tokens=tokens,
        feats=np.asarray(teacher_forced_hidden(graphdef, params, jnp.asarray(tokens)), np.float16),
        lengths=rng.integers(8, 17, size=16).astype(np.int32),
        prompt_lens=np.full(16, 3, np.int32),
    )
    cfg = TrainConfig(steps=6, batch=4, warmup=2, levels=2, feature_noise=0.1)
    parts = target_parts(tiny_target, np.arange(tiny_target.config.vocab_size))

    def weights(net):
        return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(net, nnx.Param)))

    unbroken = make_drafter("mdc", tiny_target, seed=5)
    train(unbroken.net, parts, data, cfg, log=None)

    real_save = trainer.save_progress

    def save_then_stop(folder, **kw):
        real_save(folder, **kw)
        if kw["step"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "save_progress", save_then_stop)
    folder = tmp_path / "progress"
    stopped = make_drafter("mdc", tiny_target, seed=5)
    with pytest.raises(KeyboardInterrupt):
        train(stopped.net, parts, data, cfg, log=None, resume_dir=folder, save_every_s=0)
    resumed = make_drafter("mdc", tiny_target, seed=5)
    lines = []
    summary = train(resumed.net, parts, data, cfg, log=lines.append, resume_dir=folder)
    assert lines == [f"[train] resuming from step 3 of 6 ({folder})"]
    assert [h["step"] for h in summary["history"]] == [0, 5]
    chex.assert_trees_all_close(weights(resumed.net), weights(unbroken.net), rtol=1e-6, atol=1e-7)
    other = dataclasses.replace(cfg, lr=cfg.lr / 2)
    with pytest.raises(ValueError, match="other settings or data"):
        train(make_drafter("mdc", tiny_target).net, parts, data, other, resume_dir=folder)


@pytest.mark.slow
def test_feature_noise_perturbs_only_what_the_drafter_reads(tiny_target, monkeypatch):
    """feature_noise shifts the hidden states fed to the drafter by at most noise x scale, and
    leaves the target distribution it is scored against alone."""
    from specjax.train import trainer

    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(1, 16, size=(2, 12)), jnp.int32)
    from specjax.train.data import teacher_forced_hidden

    graphdef, params = nnx.split(tiny_target)
    feats = teacher_forced_hidden(graphdef, params, tokens)
    batch = {
        "tokens": tokens,
        "feats": feats,
        "lengths": jnp.array([12, 10], jnp.int32),
        "prompt_lens": jnp.array([3, 3], jnp.int32),
    }
    drafter = make_drafter("eagle", tiny_target)
    parts = target_parts(tiny_target, drafter.net.draft_vocab[...])
    seen = []

    def spy(net, parts, tokens, feats_in, levels, window=None):
        seen.append(feats_in)
        return unrolled_outputs(net, parts, tokens, feats_in, levels, window)

    monkeypatch.setattr(trainer, "unrolled_outputs", spy)
    cfg = TrainConfig(steps=1, levels=2, feature_noise=0.25)
    with pytest.raises(ValueError, match="needs a key"):
        trainer.drafter_loss(drafter.net, parts, batch, cfg, 2.0)
    trainer.drafter_loss(drafter.net, parts, batch, cfg, 2.0, jax.random.key(0))
    trainer.drafter_loss(
        drafter.net, parts, batch, TrainConfig(steps=1, levels=2), 2.0, jax.random.key(0)
    )
    noisy, clean = (np.asarray(x) for x in seen)
    diff = np.abs(noisy - np.asarray(feats))
    assert diff.max() <= 0.25 * 2.0 + 1e-6 and diff.mean() > 0.1
    np.testing.assert_array_equal(clean, np.asarray(feats))


def test_fusion_starts_as_the_last_hidden_state_and_needs_its_data(tiny_target):
    """An untrained fusion reads exactly the last hidden state (its projection starts at zero);
    training a fused drafter on features without the fusion layers is refused before compiling;
    bad fusion layers are refused."""
    cfg = DrafterConfig(
        kind="eagle", target=tiny_target.config, draft_vocab_size=16, fusion_layers=(1,)
    )
    net = DrafterNet(cfg, np.arange(16), rngs=nnx.Rngs(0), target=tiny_target)
    hidden = {1: jnp.ones((2, 3, 32)), 2: jnp.arange(192.0).reshape(2, 3, 32)}
    np.testing.assert_array_equal(net.read_features(hidden), hidden[2])
    data = Dataset(
        tokens=np.ones((8, 8), np.int32),
        feats=np.zeros((8, 8, 32), np.float16),
        lengths=np.full(8, 8, np.int32),
        prompt_lens=np.full(8, 2, np.int32),
    )
    parts = target_parts(tiny_target, net.draft_vocab[...])
    with pytest.raises(ValueError, match=r"fuses the target layers \(1,\).*holds 0 fusion"):
        train(net, parts, data, TrainConfig(steps=1, batch=8), log=None)
    for bad in ((2,), (0,), (1, 1)):
        with pytest.raises(ValueError, match="fusion_layers must be increasing"):
            DrafterConfig(
                kind="mdc", target=tiny_target.config, draft_vocab_size=16, fusion_layers=bad
            )


@pytest.mark.slow
def test_readouts_at_scored_positions_give_the_same_loss(tiny_target):
    """Computing the readouts at the answer positions only (scored_positions) is the same loss
    and the same metrics as computing them everywhere and masking."""
    from specjax.train.data import teacher_forced_hidden
    from specjax.train.trainer import drafter_loss, scored_positions

    rng = np.random.default_rng(2)
    tokens = rng.integers(1, 16, size=(3, 16)).astype(np.int32)
    graphdef, params = nnx.split(tiny_target)
    last, lower = teacher_forced_hidden(graphdef, params, jnp.asarray(tokens), (1,))
    lengths, prompt_lens = np.array([16, 9, 12], np.int32), np.array([3, 5, 1], np.int32)
    batch = {
        "tokens": tokens,
        "feats": last,
        "fusion_feats": lower,
        "lengths": lengths,
        "prompt_lens": prompt_lens,
    }
    scored, mask = scored_positions(prompt_lens, lengths, 16)
    assert len(scored) % 12 == 0 and mask.sum() == (lengths - prompt_lens).sum()
    drafter = make_drafter("mdc2-fused", tiny_target, seed=3)
    parts = target_parts(tiny_target, drafter.net.draft_vocab[...])
    cfg = TrainConfig(steps=1, levels=3)
    everywhere = drafter_loss(drafter.net, parts, batch, cfg, 1.0)[1]
    picked = drafter_loss(
        drafter.net, parts, batch | {"scored": scored, "scored_mask": mask}, cfg, 1.0
    )[1]
    chex.assert_trees_all_close(picked, everywhere, rtol=1e-5)


# The mdc case (~20 s on a 2-core CPU) under `slow`; the eagle one keeps the default run's check.
@pytest.mark.parametrize(
    "kind, levels", [("eagle", 3), pytest.param("mdc4-fused", 6, marks=pytest.mark.slow)]
)
def test_answer_windows_give_the_same_loss_and_gradients(tiny_target, kind, levels):
    """Running every unrolled level's queries on each row's answer window only
    (answer_window) is the same loss, metrics and gradients as running them everywhere: rows
    whose window starts before their answer, one pushed earlier by the batch's end, one whose
    prompt is shorter than the levels."""
    from specjax.train.trainer import answer_window, drafter_loss, scored_positions

    rng = np.random.default_rng(4)
    width, m = 192, tiny_target.config.d_model
    lengths = np.array([150, 190, 120, 60], np.int32)
    prompt_lens = np.array([100, 140, 70, 2], np.int32)
    window = answer_window(prompt_lens, lengths, width, levels)
    assert window.shape == (4, 64)  # narrower than the batch: the levels skip the prompts
    assert window[1, 0] == width - 64 < prompt_lens[1] - levels and window[3, 0] == 0
    assert window[0, 0] == prompt_lens[0] - levels
    batch = {
        "tokens": rng.integers(1, 16, size=(4, width)).astype(np.int32),
        "feats": rng.normal(size=(4, width, m)).astype(np.float32),
        "fusion_feats": rng.normal(size=(4, width, 1, m)).astype(np.float32),
        "lengths": lengths,
        "prompt_lens": prompt_lens,
    }
    batch["scored"], batch["scored_mask"] = scored_positions(prompt_lens, lengths, width)
    drafter = make_drafter(kind, tiny_target, seed=5)
    parts = target_parts(tiny_target, drafter.net.draft_vocab[...])
    cfg = TrainConfig(steps=1, levels=levels)
    graphdef, params, rest = nnx.split(drafter.net, nnx.Param, ...)

    def loss(p, b):
        return drafter_loss(nnx.merge(graphdef, p, rest), parts, b, cfg, 1.0)

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (everywhere, m_all), g_all = value_and_grad(params, batch)
    (windowed, m_win), g_win = value_and_grad(params, batch | {"window": window})
    chex.assert_trees_all_close((windowed, m_win), (everywhere, m_all), rtol=1e-5)
    chex.assert_trees_all_close(g_win, g_all, rtol=1e-4, atol=1e-6)
    # The control: windows that start one level short of the answers change the loss.
    short = answer_window(prompt_lens, lengths, width, levels - 1)
    (shorted, _), _ = value_and_grad(params, batch | {"window": short})
    with pytest.raises(AssertionError):
        chex.assert_trees_all_close(shorted, everywhere, rtol=1e-5)


def test_batch_rows_cover_each_epoch_once_in_widths_that_hold_them():
    """The trainer's batches: every row of an epoch once (the rows past the last whole batch
    left out), each batch as wide as its longest row rounded up to 64 and no wider than the
    data, rows of similar length together."""
    from specjax.train.trainer import batch_rows

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 300, size=203)
    stream = batch_rows(lengths, 256, batch=8, seed=1)
    epoch = [next(stream) for _ in range(203 // 8)]
    seen = np.concatenate([idx for idx, _ in epoch])
    assert len(seen) == len(np.unique(seen)) == 200
    for idx, width in epoch:
        assert width % 64 == 0 and width <= 256
        assert min(lengths[idx].max(), 256) <= width < lengths[idx].max() + 64
    spread = np.mean([np.ptp(lengths[idx]) for idx, _ in epoch])
    assert spread < 0.5 * np.ptp(lengths)  # sorted within windows, not random draws


def test_drafter_switches_parse_alone_and_combined():
    from specjax.drafters.spec import split_drafter_switch

    assert split_drafter_switch("ckpt/d") == ("ckpt/d", {})
    assert split_drafter_switch("ckpt/d:nopv") == ("ckpt/d", {"pre_verifier": False})
    assert split_drafter_switch("ckpt/d:fresh2:nopv") == (
        "ckpt/d",
        {"fresh_slots": 2, "pre_verifier": False},
    )
    assert split_drafter_switch("ckpt/d:noreuse:nopv") == (
        "ckpt/d",
        {"reuse": False, "pre_verifier": False},
    )
    assert split_drafter_switch("ckpt/d:other") == ("ckpt/d:other", {})  # not a switch
    with pytest.raises(ValueError, match="twice"):
        split_drafter_switch("ckpt/d:fresh1:fresh2")


@pytest.mark.slow
def test_a_continuation_on_other_data_keeps_its_draft_vocabulary(tmp_path):
    """train_drafter(init_from=DIR) on data whose most frequent tokens differ trains DIR's
    drafter further: the saved vocabulary is DIR's, not the one the new data would give."""
    from specjax.paths import STORIES260K, shared_path
    from specjax.train.data import DistillConfig, draft_vocabulary, load_dataset
    from specjax.train.pipeline import DrafterRecipe, train_drafter

    def recipe(temperature, n):
        distill = DistillConfig(kind="story", n_prompts=n, temperatures=(temperature,),
                                max_new_tokens=8, batch=8)  # fmt: skip
        train = TrainConfig(steps=2, batch=4, levels=2)
        return DrafterRecipe(kind="eagle", data_kind="story", distill=distill, train=train,
                             draft_vocab=24)  # fmt: skip

    target = shared_path(STORIES260K)
    first = train_drafter(target, recipe(0.0, 8), tmp_path / "first", data_dir=tmp_path / "a",
                          eval_n=1, calibrate=False, log=lambda *_: None)  # fmt: skip
    other = recipe(1.0, 16)
    second = train_drafter(target, other, tmp_path / "second", data_dir=tmp_path / "b", eval_n=1,
                           calibrate=False, init_from=first, log=lambda *_: None)  # fmt: skip
    saved = np.asarray(load_drafter_net(first).draft_vocab[...])
    own = draft_vocabulary(load_dataset(tmp_path / "b"), 24, 512, (2,))
    assert not np.array_equal(own, saved)  # the new data alone would pick other tokens
    np.testing.assert_array_equal(np.asarray(load_drafter_net(second).draft_vocab[...]), saved)
    assert "those of the drafter it continues" in (second / "CARD.md").read_text()


def test_bfloat16_products_train_the_same_loss_with_a_float32_teacher(tiny_target, monkeypatch):
    """TrainConfig(products="bfloat16"): the drafter's products run on bfloat16 operands (the
    step's program multiplies bfloat16), the loss and its gradient stay close to float32's, and
    the teacher's readout (the distribution scored against) is still float32."""
    from jaxpr_checks import dot_operand_dtypes

    from specjax.models import precision
    from specjax.train import trainer
    from specjax.train.data import teacher_forced_hidden

    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(1, 16, size=(2, 12)), jnp.int32)
    graphdef, params = nnx.split(tiny_target)
    batch = {
        "tokens": tokens,
        "feats": teacher_forced_hidden(graphdef, params, tokens),
        "lengths": jnp.array([12, 10], jnp.int32),
        "prompt_lens": jnp.array([3, 3], jnp.int32),
    }
    drafter = make_drafter("mdc", tiny_target)
    parts = target_parts(tiny_target, drafter.net.draft_vocab[...])
    net_def, net_params, rest = nnx.split(drafter.net, nnx.Param, ...)
    teacher_dtypes = []

    def spy(*args, **kwargs):
        teacher_dtypes.append(precision.product_dtype())
        return trainer.readout.__wrapped__(*args, **kwargs)

    spy.__wrapped__ = trainer.readout
    monkeypatch.setattr(trainer, "readout", spy)
    results = {}
    for products in ("float32", "bfloat16"):
        cfg = TrainConfig(steps=1, levels=2, products=products)

        def loss(p, cfg=cfg):
            net = nnx.merge(net_def, p, rest)
            return trainer.drafter_loss(net, parts, batch, cfg, 2.0)[0]

        with precision.products_in(jnp.dtype(products)):  # as train_step does
            results[products] = jax.value_and_grad(loss)(net_params)
            dots = dot_operand_dtypes(jax.make_jaxpr(loss)(net_params).jaxpr)
        assert ("bfloat16" in dots) == (products == "bfloat16"), dots
    assert teacher_dtypes and all(d is None for d in teacher_dtypes)
    (l32, g32), (l16, g16) = results["float32"], results["bfloat16"]
    assert float(l16) != float(l32)
    np.testing.assert_allclose(float(l16), float(l32), rtol=2e-2)
    a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g32)])
    b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g16)])
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert cosine > 0.99, cosine


def test_far_ancestor_weight_learns_in_units_of_the_input_scale(tiny_target):
    """An mdc readout's far-ancestor norm weight starts at zero beside norm weights at the input
    scale; its updates are scaled by that scale, so it can grow to their size (Adam alone moves a
    weight by about lr a step: 500 steps left it ~1600x smaller than its siblings on SmolLM2)."""
    from specjax.train.data import teacher_forced_hidden

    rng = np.random.default_rng(4)
    tokens = rng.integers(1, 16, size=(8, 16)).astype(np.int32)
    graphdef, params = nnx.split(tiny_target)
    feats = 30.0 * np.asarray(teacher_forced_hidden(graphdef, params, jnp.asarray(tokens)))
    data = Dataset(tokens=tokens, feats=feats.astype(np.float16), lengths=np.full(8, 16, np.int32),
                   prompt_lens=np.full(8, 3, np.int32))  # fmt: skip
    cfg = DrafterConfig(kind="mdc", target=tiny_target.config,
                        draft_vocab_size=tiny_target.config.vocab_size, path_tokens=4)  # fmt: skip
    net = DrafterNet(cfg, np.arange(cfg.draft_vocab_size), rngs=nnx.Rngs(0), target=tiny_target)
    assert np.all(np.asarray(net.far_norm[...]) == 0)
    steps, lr = 3, 1e-3
    train(net, target_parts(tiny_target, net.draft_vocab[...]), data,
          TrainConfig(steps=steps, batch=4, levels=1, lr=lr, warmup=1), log=None)  # fmt: skip
    # Unscaled, no entry could move more than ~steps * lr.
    assert np.abs(np.asarray(net.far_norm[...])).max() > 5 * steps * lr
