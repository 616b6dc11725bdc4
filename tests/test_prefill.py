"""The packed prefill (large batches run as length-sorted [rows, chunk] work items) against the
one-block prefill, and end to end through generate and speculative_generate."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lively_models import lively_llama
from test_feature_drafter import make_drafter

import specjax
import specjax.prefill
from specjax.cache import init_cache
from specjax.config import TINY, SpecConfig, TreeConfig
from specjax.prefill import PACKED_MIN_BATCH, block_prefill, packed_prefill


@pytest.fixture(scope="module")
def tiny():
    # Weights 3x the random init, so that the logits are far from uniform and a misplaced
    # position or row changes them visibly.
    return lively_llama(TINY, 0)


def assert_close(got, want):
    """Equal up to float rounding, relative to the array's scale: the chunks change the matmul
    shapes, and the 3x weights make the last layer's values large (tens)."""
    scale = float(jnp.abs(want).max())
    chex.assert_trees_all_close(got, want, atol=1e-4 * max(scale, 1.0), rtol=1e-4)


def ragged(rng, batch, width):
    lens = rng.integers(1, width + 1, batch).astype(np.int32)
    lens[rng.integers(batch)] = width  # one row fills the block
    ids = rng.integers(0, TINY.vocab_size, (batch, width)).astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(lens)


# (batch, width, rows, chunk): rows dividing the batch or not (the last group overlaps), chunks
# tiling the width or not (the last chunk overlaps), a single group.
@pytest.mark.parametrize(
    ("batch", "width", "rows", "chunk"),
    [
        (9, 80, 4, 32),
        pytest.param(8, 64, 8, 64, marks=pytest.mark.slow),
        pytest.param(5, 48, 2, 20, marks=pytest.mark.slow),
    ],
)
def test_packed_prefill_equals_one_block(tiny, batch, width, rows, chunk):
    ids, lens = ragged(np.random.default_rng(batch), batch, width)
    cache = init_cache(TINY, batch, width + 1)  # no slack past the prompts
    layers = (1, TINY.n_layers)
    block = jax.jit(lambda ids, lens: block_prefill(tiny, ids, lens, cache, "reference", layers))
    packed = jax.jit(
        lambda ids, lens: packed_prefill(
            tiny, ids, lens, cache, "reference", layers, rows=rows, chunk=chunk
        )
    )
    ref_logits, ref_cache, ref_hidden = block(ids, lens)
    logits, out_cache, hidden = packed(ids, lens)
    assert_close(logits, ref_logits)
    np.testing.assert_array_equal(np.asarray(out_cache.lengths), np.asarray(lens))
    for r, n in enumerate(np.asarray(lens)):  # only positions inside each prompt are defined
        for got, want in ((out_cache.k, ref_cache.k), (out_cache.v, ref_cache.v)):
            assert_close(got[:, r, :n], want[:, r, :n])
        for i in layers:
            assert_close(hidden[i][r, :n], ref_hidden[i][r, :n])


def long_prompts(batch):
    """Ragged prompts whose longest exceeds one chunk, so generate takes the packed path."""
    rng = np.random.default_rng(7)
    lens = [90, 3, 65, 17, 40, 88, 1, 70][:batch]
    return [rng.integers(0, TINY.vocab_size, n).tolist() for n in lens]


@pytest.fixture
def packed_calls(monkeypatch):
    """Counts the packed prefills traced (so a test knows it exercised that path)."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[1].shape)
        return packed_prefill(*args, **kwargs)

    monkeypatch.setattr(specjax.prefill, "packed_prefill", spy)
    return calls


def test_generate_rows_through_packed_prefill_equal_rows_alone(tiny, packed_calls):
    prompts = long_prompts(PACKED_MIN_BATCH)
    batch = specjax.generate(tiny, prompts, max_new_tokens=10)
    assert packed_calls, "the batch did not take the packed prefill"
    # The two longest and two shortest rows, each alone (one block; two prompt widths compiled).
    for i in (0, 5, 1, 6):
        alone = specjax.generate(tiny, [prompts[i]], max_new_tokens=10)
        np.testing.assert_array_equal(np.asarray(batch.tokens[i]), np.asarray(alone.tokens[0]))


@pytest.mark.slow  # test_packed_prefill_equals_one_block checks the hidden states it reads
def test_speculative_greedy_through_packed_prefill(tiny, packed_calls):
    """A feature drafter reads the prefill's hidden states: greedy output still equals
    generate's at a batch that takes the packed prefill."""
    prompts = long_prompts(PACKED_MIN_BATCH)
    ref = specjax.generate(tiny, prompts, max_new_tokens=12)
    drafter = make_drafter("eagle-fused", tiny)
    out = specjax.speculative_generate(
        tiny, drafter, prompts, max_new_tokens=12,
        config=SpecConfig(tree=TreeConfig.dynamic(7, 3, 3)),
    )  # fmt: skip
    assert len(packed_calls) >= 2  # generate's and the verifier's
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
