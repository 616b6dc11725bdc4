"""speculative_generate end to end: greedy equality, batch independence, loop structure, errors."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jaxpr_checks import assert_one_loop_no_callbacks
from lively_models import lively_llama

import specjax
from specjax import speculative
from specjax.config import TINY, SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters.lm import LMDrafter
from specjax.paths import LLAMA2XS, SMOLLM2, STORIES260K

TREES = {
    "chain3": TreeConfig.chain(3),
    "tree_3_2_1": TreeConfig(branching=(3, 2, 1)),
}
RAGGED = [[1, 5, 7], [1, 2, 3, 4, 5, 6, 7, 8], [3], [9, 9, 2, 11, 4]]


@pytest.fixture(scope="module")
def tiny_pair():
    # Weights x3: at initialisation scale TINY repeats one token and every draft is accepted.
    target = lively_llama(TINY, 0)
    # A drafter that agrees with the target often but not always: the target's own first layer.
    return target, LMDrafter.self_draft(1)


@pytest.mark.parametrize("tree", list(TREES))
def test_greedy_equals_generate_tiny(tiny_pair, tree):
    target, drafter = tiny_pair
    ref = specjax.generate(target, RAGGED, max_new_tokens=20)
    out = specjax.speculative_generate(
        target, drafter, RAGGED, max_new_tokens=20, config=SpecConfig(tree=TREES[tree])
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    assert_stats_consistent(out, TREES[tree].max_depth + 1)
    # Steps end at every stage: rejections at the first draft, and whole drafts accepted (the
    # bonus token's K/V and the commit of a full path), so greedy equality covers both.
    hist = np.asarray(out.stats["accepted_hist"]).sum(0)
    assert hist[0] > 0 and hist[-1] > 0, hist


def assert_stats_consistent(out, path_slots: int) -> None:
    """The statistics agree with each other and with the output: one histogram entry per live
    step, every live step emits n_accepted + 1 tokens (only a row's last step may be cut short,
    by the EOS or the budget; the first token comes from the prefill), tau is their mean."""
    hist = np.asarray(out.stats["accepted_hist"])
    calls = np.asarray(out.stats["target_calls"])
    lengths = np.asarray(out.lengths)
    assert hist.shape == (len(lengths), path_slots), hist.shape
    np.testing.assert_array_equal(hist.sum(1), calls)
    emitted = hist @ np.arange(1, path_slots + 1)
    overshoot = emitted - (lengths - 1)
    assert ((overshoot >= 0) & (overshoot < path_slots)).all(), (emitted, lengths)
    np.testing.assert_allclose(
        np.asarray(out.stats["tau"]), emitted / np.maximum(calls, 1), rtol=1e-6
    )


# The default run keeps batch 1 with a chain; the tree and batch 4 run under `slow`.
@pytest.mark.parametrize(
    ("tree", "batch"),
    [("chain3", 1)] + [pytest.param(t, b, marks=pytest.mark.slow)
                       for t, b in (("tree_3_2_1", 1), ("chain3", 4), ("tree_3_2_1", 4))],
)  # fmt: skip
def test_fallback_to_plain_steps_keeps_greedy_output(tiny_pair, tree, batch):
    """SpecConfig.fallback_tau above any reachable tau: after fallback_after speculative steps
    the loop decodes plainly, with the same tokens as `generate` (also across the cache's
    reserved slots: the budget ends next to max_seq_len for the longest prompt). A break-even
    of 1 (never above tau) keeps every step speculative, tokens and stats as without it."""
    target, drafter = tiny_pair
    prompts = RAGGED[:batch]
    n = (
        TINY.max_seq_len
        - max(map(len, prompts))
        - specjax.cache.tree_reserve(TREES[tree].num_nodes, TREES[tree].max_depth)
    )
    ref = specjax.generate(target, prompts, max_new_tokens=n)
    plain = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=n,
        config=SpecConfig(tree=TREES[tree], fallback_tau=50.0, fallback_after=3))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(plain.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(plain.lengths), np.asarray(ref.lengths))
    assert_stats_consistent(plain, TREES[tree].max_depth + 1)
    calls, steps = np.asarray(plain.stats["target_calls"]), np.asarray(plain.stats["plain_steps"])
    np.testing.assert_array_equal(calls - steps, 3)
    assert (steps > 0).all(), steps
    spec = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=n,
                                        config=SpecConfig(tree=TREES[tree]))  # fmt: skip
    never = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=n,
        config=SpecConfig(tree=TREES[tree], fallback_tau=1.0, fallback_after=1))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(never.tokens), np.asarray(ref.tokens))
    assert int(np.asarray(never.stats["plain_steps"]).sum()) == 0
    for name in ("target_calls", "accepted_hist"):
        np.testing.assert_array_equal(np.asarray(never.stats[name]), np.asarray(spec.stats[name]))


def test_fallback_settings_are_checked():
    with pytest.raises(ValueError, match="fallback_tau must be > 0"):
        SpecConfig(fallback_tau=0.0)
    with pytest.raises(ValueError, match="fallback_after must be >= 1"):
        SpecConfig(fallback_tau=2.0, fallback_after=0)


def test_eos_and_lengths_match_generate(tiny_pair):
    target, drafter = tiny_pair
    ref = specjax.generate(target, RAGGED, max_new_tokens=16)
    eos = int(ref.tokens[1, 5])
    ref = specjax.generate(target, RAGGED, max_new_tokens=16, eos_id=eos)
    out = specjax.speculative_generate(
        target, drafter, RAGGED, max_new_tokens=16, eos_id=eos, config=SpecConfig()
    )
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert_stats_consistent(out, SpecConfig().tree.max_depth + 1)


# Under `slow` for every rule (rows are also checked independent in test_generate's ragged
# batches and row by row on device meshes in test_sharding).
@pytest.mark.slow
@pytest.mark.parametrize("rule", ["chain", "hsd", "tree_onehot", "tree_sampled"])
def test_row_output_independent_of_other_rows(tiny_pair, rule):
    target, drafter = tiny_pair
    tree = TreeConfig.chain(3) if rule in ("chain", "hsd") else TreeConfig(branching=(2, 2))
    cfg = SpecConfig(tree=tree, rule=rule)
    sampling = SamplingConfig(temperature=1.0)
    keys = jax.random.split(jax.random.key(7), 4)
    batch = specjax.speculative_generate(
        target, drafter, RAGGED, max_new_tokens=12, config=cfg, sampling=sampling, key=keys
    )
    other = [[4, 4], [12, 1, 1, 3, 5], RAGGED[2], [7]]  # row 2 kept, the others changed
    mixed = specjax.speculative_generate(
        target, drafter, other, max_new_tokens=12, config=cfg, sampling=sampling, key=keys
    )
    np.testing.assert_array_equal(np.asarray(batch.tokens[2]), np.asarray(mixed.tokens[2]))
    alone = specjax.speculative_generate(
        target,
        drafter,
        [RAGGED[2]],
        max_new_tokens=12,
        config=cfg,
        sampling=sampling,
        key=keys[2:3],
    )
    np.testing.assert_array_equal(np.asarray(batch.tokens[2]), np.asarray(alone.tokens[0]))


@pytest.mark.parametrize("temperature", [pytest.param(0.0, marks=pytest.mark.slow), 1.0])
def test_finished_rows_leave_the_speculative_batch_rows_equal_alone(temperature):
    """At B >= COMPACT_MIN_BATCH the speculative steps run in phases of fewer rows once rows
    finish (specjax.rows): each row's tokens, length and statistics still equal the row decoded
    alone, and greedy rows equal plain decoding."""
    # Sharper logits than the random init, so greedy rows do not all fall into one loop.
    target = lively_llama(TINY, 1)
    drafter = LMDrafter.self_draft(1)
    b, n = specjax.decode.COMPACT_MIN_BATCH, speculative.SPECULATIVE_PHASE_TOKENS
    # Reversed, so that the rows decoding longest sit last: the phases must gather them.
    prompts = [[1 + i, 3, (5 * i) % TINY.vocab_size] for i in reversed(range(b))]
    sampling = SamplingConfig(temperature=temperature)
    keys = jax.random.split(jax.random.key(11), b)[::-1]
    config = SpecConfig(tree=TreeConfig(branching=(2, 1)))
    free = specjax.generate(target, prompts, max_new_tokens=n, sampling=sampling, key=keys)
    eos = int(np.bincount(np.asarray(free.tokens).ravel()).argmax())  # the most common token
    kw = dict(max_new_tokens=n, config=config, sampling=sampling, eos_id=eos)
    batch = specjax.speculative_generate(target, drafter, prompts, key=keys, **kw)
    lengths = np.asarray(batch.lengths)
    # More than half the rows stop early, so the last phase ran on fewer rows.
    assert (lengths < n).sum() > b - specjax.decode.COMPACT_MIN_ROWS, lengths
    if temperature == 0.0:
        ref = specjax.generate(target, prompts, max_new_tokens=n, eos_id=eos)
        np.testing.assert_array_equal(np.asarray(batch.tokens), np.asarray(ref.tokens))
    for i, prompt in enumerate(prompts):
        alone = specjax.speculative_generate(target, drafter, [prompt], key=keys[i : i + 1], **kw)
        np.testing.assert_array_equal(np.asarray(batch.tokens[i]), np.asarray(alone.tokens[0]))
        assert lengths[i] == int(alone.lengths[0])
        for name in ("target_calls", "accepted_hist", "draft_len_hist"):
            np.testing.assert_array_equal(
                np.asarray(batch.stats[name][i]), np.asarray(alone.stats[name][0]), err_msg=name
            )
    assert_stats_consistent(batch, config.tree.max_depth + 1)


def test_no_recompile_and_single_while_loop(tiny_pair):
    target, drafter = tiny_pair
    statics = ("target_def", "drafter_def", "verifier_def", "max_new_tokens", "config", "sampling")
    jitted = jax.jit(
        chex.assert_max_traces(speculative._speculative.__wrapped__, n=1), static_argnames=statics
    )
    tdef, tparams = nnx.split(target)
    ddef, dparams = nnx.split(drafter)
    vdef, vparams = nnx.split(specjax.FullVerifier())
    cfg, sampling = SpecConfig(tree=TreeConfig(branching=(2, 1))), SamplingConfig(temperature=1.0)
    keys = specjax.decode.prepare_keys(jax.random.key(0), 2)
    kwargs = dict(max_new_tokens=6, config=cfg, sampling=sampling)
    for prompts in ([[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [2, 2, 2]]):
        ids, lens = specjax.decode.prepare_prompts(prompts, TINY, 6, 5)
        jitted(
            tdef, tparams, ddef, dparams, vdef, vparams, ids, lens, keys, jnp.int32(-1), **kwargs
        )
    ids, lens = specjax.decode.prepare_prompts([[1, 2, 3]], TINY, 6, 5)
    fn = speculative._speculative.__wrapped__
    jaxpr = jax.make_jaxpr(
        lambda tp, dp, i, l, k: fn(
            tdef, tp, ddef, dp, vdef, vparams, i, l, k, jnp.int32(-1), **kwargs
        )
    )(tparams, dparams, ids, lens, keys[:1])
    assert_one_loop_no_callbacks(jaxpr)


def test_vocab_mismatch_is_rejected():
    target = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    other = specjax.Llama(
        specjax.ModelConfig(**{**TINY.__dict__, "vocab_size": 32}), rngs=nnx.Rngs(1)
    )
    with pytest.raises(ValueError, match="vocab mismatch"):
        specjax.speculative_generate(target, LMDrafter(other), [[1, 2]], max_new_tokens=4)


def test_rule_needs_chain():
    with pytest.raises(ValueError, match="needs a chain"):
        SpecConfig(tree=TreeConfig(branching=(2, 1)), rule="hsd")


def test_prompt_too_long_counts_draft_slots():
    target = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="draft slots"):
        specjax.speculative_generate(
            target, LMDrafter.self_draft(1), [[1] * 105], max_new_tokens=20, config=SpecConfig()
        )


# --- real checkpoints ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def stories_pair(shared_dir):
    if not (shared_dir / STORIES260K).exists():
        pytest.skip("stories260K missing")
    target = specjax.load(shared_dir / STORIES260K)
    drafter = LMDrafter(specjax.load(shared_dir / LLAMA2XS).model)
    return target, drafter


def tinystories_prompts(shared_dir, tokenizer, n, words=8):
    text = (shared_dir / "data" / "tinystories_dev.txt").read_text()
    paras = [p.strip() for p in text.split("\n\n") if p.strip()]
    return [tokenizer.encode(" ".join(p.split()[:words]), bos=True) for p in paras[:n]]


# The default run keeps the tree (the tiny-model tests cover chains); the chain runs under slow.
@pytest.mark.parametrize(
    "tree",
    [
        pytest.param(TreeConfig.chain(4), id="chain4", marks=pytest.mark.slow),
        pytest.param(TreeConfig(branching=(4, 2, 1)), id="tree_4_2_1"),
    ],
)
def test_greedy_equals_generate_stories260k(stories_pair, shared_dir, tree):
    target, drafter = stories_pair
    prompts = tinystories_prompts(shared_dir, target.tokenizer, 16)
    ref = specjax.generate(target.model, prompts, max_new_tokens=64)
    out = specjax.speculative_generate(
        target.model, drafter, prompts, max_new_tokens=64, config=SpecConfig(tree=tree)
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert float(np.mean(out.stats["tau"])) > 1.5


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize(
    "tree", [TreeConfig.chain(4), TreeConfig(branching=(4, 2, 1))], ids=["chain4", "tree_4_2_1"]
)
def test_greedy_equals_generate_stories260k_50_prompts(stories_pair, shared_dir, tree, batch):
    target, drafter = stories_pair
    prompts = tinystories_prompts(shared_dir, target.tokenizer, 50)
    for i in range(0, 50, batch):
        chunk = prompts[i : i + batch]
        ref = specjax.generate(target.model, chunk, max_new_tokens=128)
        out = specjax.speculative_generate(
            target.model, drafter, chunk, max_new_tokens=128, config=SpecConfig(tree=tree)
        )
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


@pytest.mark.slow
def test_greedy_equals_generate_smollm2_self_draft(shared_dir):
    import json

    loaded = specjax.load(shared_dir / SMOLLM2)
    tok = loaded.tokenizer
    lines = (shared_dir / "data" / "mt_bench_question.jsonl").read_text().splitlines()[:10]
    prompts = [
        tok.encode(
            tok.apply_chat(
                [{"role": "user", "content": json.loads(x)["turns"][0]}], add_generation_prompt=True
            ),
            bos=False,
        )
        for x in lines
    ]
    drafter = LMDrafter.self_draft(8)
    for prompt in prompts:
        ref = specjax.generate(loaded.model, [prompt], max_new_tokens=64, eos_id=tok.eos_id)
        out = specjax.speculative_generate(
            loaded.model, drafter, [prompt], max_new_tokens=64, eos_id=tok.eos_id,
            config=SpecConfig(),
        )  # fmt: skip
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


@pytest.mark.slow
def test_pallas_kernel_interpret_gives_same_tokens_stories260k(stories_pair, shared_dir):
    """The Pallas tree-attention kernel (interpret mode on CPU) in prefill, draft and verify."""
    target, drafter = stories_pair
    prompts = tinystories_prompts(shared_dir, target.tokenizer, 2)
    kw = dict(max_new_tokens=24, sampling=SamplingConfig(temperature=1.0), key=jax.random.key(0))
    tree = TreeConfig(branching=(2, 2, 1))
    ref = specjax.speculative_generate(
        target.model, drafter, prompts, config=SpecConfig(tree=tree, attn_impl="reference"), **kw
    )
    out = specjax.speculative_generate(
        target.model, drafter, prompts, config=SpecConfig(tree=tree, attn_impl="interpret"), **kw
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
