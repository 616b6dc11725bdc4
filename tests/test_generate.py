"""Autoregressive generate: batching, recompiles, loop structure, and input validation."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jaxpr_checks import assert_one_loop_no_callbacks
from lively_models import lively_llama

import specjax
from specjax import decode
from specjax.cache import init_cache
from specjax.config import TINY, ModelConfig, SamplingConfig
from specjax.tree import causal_mask


@pytest.fixture(scope="module")
def tiny():
    return specjax.Llama(TINY, rngs=nnx.Rngs(0))


RAGGED = [[1, 5, 7], [1, 2, 3, 4, 5, 6, 7, 8], [3], [9, 9, 2, 11, 4]]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ragged_batch_rows_equal_single_rows(tiny, temperature):
    sampling = SamplingConfig(temperature=temperature)
    keys = jax.random.split(jax.random.key(3), len(RAGGED))
    batch = specjax.generate(tiny, RAGGED, max_new_tokens=12, sampling=sampling, key=keys)
    chex.assert_shape(batch.tokens, (4, 12))
    for i, prompt in enumerate(RAGGED):
        alone = specjax.generate(
            tiny, [prompt], max_new_tokens=12, sampling=sampling, key=keys[i : i + 1]
        )
        np.testing.assert_array_equal(batch.tokens[i], alone.tokens[0])


@pytest.mark.parametrize("temperature", [pytest.param(0.0, marks=pytest.mark.slow), 1.0])
def test_finished_rows_leave_the_batch_rows_equal_alone(temperature):
    """At B >= COMPACT_MIN_BATCH rows that stop early leave decoding in phases (the live rows
    and their caches are gathered into a smaller batch): each row's tokens and length still
    equal the row decoded alone."""
    # Sharper logits than the random init, so greedy rows do not all fall into one loop.
    model = lively_llama(TINY, 1)
    b, n = decode.COMPACT_MIN_BATCH, 24
    # Reversed, so that the rows decoding longest sit last: the phases must gather them.
    prompts = [[1 + i, 3, (5 * i) % TINY.vocab_size] for i in reversed(range(b))]
    sampling = SamplingConfig(temperature=temperature)
    keys = jax.random.split(jax.random.key(11), b)[::-1]
    free = specjax.generate(model, prompts, max_new_tokens=n, sampling=sampling, key=keys)
    eos = int(np.bincount(np.asarray(free.tokens).ravel()).argmax())  # the most common token
    batch = specjax.generate(model, prompts, max_new_tokens=n, sampling=sampling, key=keys,
                             eos_id=eos)  # fmt: skip
    lengths = np.asarray(batch.lengths)
    # More than half the rows stop before the budget, so the last phase ran on fewer rows.
    assert (lengths < n).sum() > b - decode.COMPACT_MIN_ROWS, lengths
    for i, prompt in enumerate(prompts):
        alone = specjax.generate(model, [prompt], max_new_tokens=n, sampling=sampling,
                                 key=keys[i : i + 1], eos_id=eos)  # fmt: skip
        np.testing.assert_array_equal(np.asarray(batch.tokens[i]), np.asarray(alone.tokens[0]))
        assert lengths[i] == int(alone.lengths[0])


def test_greedy_matches_full_recompute():
    """Each greedy token equals the argmax of a fresh full forward over the sequence so far (one
    causal forward over prompt + output gives all of them: position i sees tokens <= i only).
    Every greedy-equality test compares with `generate`: this checks `generate` itself, on a
    model whose output varies (the random init repeats one token, which a cache or position
    bug would still repeat), over 20 tokens past a padded prompt."""
    model = lively_llama(TINY, 0)
    prompt = [1, 4, 2, 8, 5]
    out = specjax.generate(model, [prompt], max_new_tokens=20)
    tokens = np.asarray(out.tokens[0]).tolist()
    assert len(set(tokens)) > 3, tokens
    seq = prompt + tokens
    t = len(seq) - 1  # the last token is never fed
    res = model(
        jnp.asarray([seq[:t]]),
        positions=jnp.arange(t)[None],
        cache=init_cache(TINY, 1, t),
        tree_mask=causal_mask(1, t),
    )
    expected = np.asarray(jnp.argmax(res.logits[0], axis=-1))[len(prompt) - 1 :]
    np.testing.assert_array_equal(np.asarray(out.tokens[0]), expected)


def test_eos_stops_row_and_lengths(tiny):
    out = specjax.generate(tiny, RAGGED, max_new_tokens=10)
    eos = int(out.tokens[0, 2])  # pretend the third token of row 0 is EOS
    stopped = specjax.generate(tiny, RAGGED, max_new_tokens=10, eos_id=eos)
    for row in range(4):
        toks = np.asarray(out.tokens[row])
        hits = np.flatnonzero(toks == eos)
        n = hits[0] + 1 if hits.size else 10
        assert int(stopped.lengths[row]) == n
        np.testing.assert_array_equal(np.asarray(stopped.tokens[row, :n]), toks[:n])
        assert not np.asarray(stopped.tokens[row, n:]).any()


def test_no_recompile_for_new_prompts_of_same_shape(tiny):
    traced = chex.assert_max_traces(decode._generate.__wrapped__, n=1)
    jitted = jax.jit(
        traced, static_argnames=("graphdef", "max_new_tokens", "sampling", "attn_impl")
    )
    graphdef, params = nnx.split(tiny)
    keys = decode.prepare_keys(jax.random.key(0), 2)
    for prompts in ([[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [2, 2, 2]]):
        ids, lens = decode.prepare_prompts(prompts, TINY, 5)
        jitted(
            graphdef,
            params,
            ids,
            lens,
            keys,
            jnp.int32(-1),
            max_new_tokens=5,
            sampling=SamplingConfig(),
            attn_impl="reference",
        )


def test_jaxpr_has_one_while_loop_and_no_callbacks(tiny):
    graphdef, params = nnx.split(tiny)
    ids, lens = decode.prepare_prompts([[1, 2, 3]], TINY, 5)
    fn = decode._generate.__wrapped__
    jaxpr = jax.make_jaxpr(
        lambda p, i, l, k: fn(
            graphdef,
            p,
            i,
            l,
            k,
            jnp.int32(-1),
            max_new_tokens=5,
            sampling=SamplingConfig(temperature=1.0),
            attn_impl="reference",
        )
    )(params, ids, lens, decode.prepare_keys(jax.random.key(0), 1))
    assert_one_loop_no_callbacks(jaxpr)


# --- input validation: a clear ValueError before anything is compiled -----------------------


def test_prompt_plus_new_tokens_beyond_context(tiny):
    with pytest.raises(ValueError, match="prompt too long"):
        specjax.generate(tiny, [[1] * 100], max_new_tokens=TINY.max_seq_len)


def test_empty_prompt(tiny):
    with pytest.raises(ValueError, match="empty prompt"):
        specjax.generate(tiny, [[1, 2], []], max_new_tokens=3)


def test_token_outside_vocab(tiny):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        specjax.generate(tiny, [[1, TINY.vocab_size]], max_new_tokens=3)


def test_negative_temperature():
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-0.5)


@pytest.mark.parametrize("top_p", [0.0, -0.1, 1.5])
def test_top_p_outside_unit_interval(top_p):
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(temperature=1.0, top_p=top_p)


def test_bad_max_new_tokens(tiny):
    with pytest.raises(ValueError, match="max_new_tokens"):
        specjax.generate(tiny, [[1, 2]], max_new_tokens=0)


def test_inconsistent_config():
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        ModelConfig(
            vocab_size=8, d_model=8, n_layers=1, n_heads=3, n_kv_heads=2, head_dim=4, ffn_dim=8
        )
