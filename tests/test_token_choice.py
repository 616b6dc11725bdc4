"""A row's argmax and a draw from a row's distribution (specjax.token_choice): on the CPU they run
as the row_choice kernel, which is jnp.argmax on every shape and value (ties, NaN, infinities)
and draws by the inverse CDF of its random bits, with the distribution's frequencies (a sampler
biased by 2% fails the same check); decoding programs call it."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxpr_checks import primitive_names
from specjax.kernels import cpu_panels
from specjax.kernels.cpu_panels.row_choice import row_argmax, row_draw

from specjax import token_choice
from specjax.config import SamplingConfig
from specjax.decode import choose_tokens

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not cpu_panels.available(),
    reason="the row_choice kernel runs on the CPU backend where it builds",
)


def _rows(shape, seed=0):
    """Logits with ties (small integers), and rows holding NaN, +inf and only -inf."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    flat[0] = rng.standard_normal(shape[-1])
    if flat.shape[0] > 3:
        flat[1, [shape[-1] // 2, shape[-1] - 1]] = np.nan
        flat[2, :] = -np.inf
        flat[3, shape[-1] - 1] = np.inf
    return jnp.asarray(x)


@pytest.mark.parametrize("shape", [(1, 49152), (3, 8, 1000), (2, 5), (6, 17), (4, 3, 64)])
def test_the_argmax_kernel_is_jnp_argmax(shape):
    x = _rows(shape)
    got = jax.jit(row_argmax)(x)
    chex.assert_shape(got, shape[:-1])
    chex.assert_type(got, jnp.int32)
    np.testing.assert_array_equal(got, jnp.argmax(x, axis=-1))
    np.testing.assert_array_equal(jax.vmap(row_argmax)(x), jnp.argmax(x, axis=-1))


def _inverse_cdf(probs: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """The reference draw in float64: the first index whose running sum exceeds u * total."""
    u = ((bits[..., 0].astype(np.uint64) << 21) ^ (bits[..., 1].astype(np.uint64) >> 11)) * 2.0**-53
    p = probs.astype(np.float64)
    running = np.cumsum(p, axis=-1)
    goal = u[..., None] * running[..., -1:]
    return np.argmax((running > goal) & (p > 0), axis=-1)


@pytest.mark.parametrize("vocab", [7, 64, 1000, 49152])
def test_a_draw_is_the_inverse_cdf_of_its_bits(vocab):
    rng = np.random.default_rng(vocab)
    probs = rng.random((32, vocab)).astype(np.float32) ** 4
    probs[:, rng.random(vocab) < 0.3] = 0.0  # entries never to draw
    bits = rng.integers(0, 2**32, (32, 2), dtype=np.uint64).astype(np.uint32)
    got = np.asarray(jax.jit(row_draw)(jnp.asarray(probs), jnp.asarray(bits)))
    np.testing.assert_array_equal(got, _inverse_cdf(probs, bits))
    assert np.all(probs[np.arange(32), got] > 0)


def test_the_ends_of_the_uniform_and_an_empty_row():
    probs = jnp.asarray([[0.0, 0.25, 0.0, 0.75, 0.0], [0.0] * 5], jnp.float32)
    lowest = jnp.zeros((2, 2), jnp.uint32)
    highest = jnp.full((2, 2), 2**32 - 1, jnp.uint32)
    np.testing.assert_array_equal(row_draw(probs, lowest), [1, 0])  # first positive entry; 0
    np.testing.assert_array_equal(row_draw(probs, highest), [3, 0])  # last positive entry


def _largest_z(draws, probs) -> float:
    """The largest |z| of the draws' frequencies against probs (binomial standard errors)."""
    n = draws.shape[0]
    freq = np.bincount(np.asarray(draws), minlength=probs.shape[0]) / n
    sd = np.sqrt(np.maximum(probs * (1 - probs), 1e-12) / n)
    return float(np.max(np.abs(freq - probs) / sd))


def test_draws_follow_the_distribution_and_a_biased_sampler_fails():
    probs = np.asarray([0.1, 0.0, 0.2, 0.3, 0.0, 0.4, 0.0, 0.0], np.float32)
    keys = jax.random.split(jax.random.key(7), 1_000_000)
    sample = jax.jit(jax.vmap(token_choice.draw, in_axes=(0, None)))
    draws = sample(keys, jnp.asarray(probs))
    assert np.all(probs[np.asarray(draws)] > 0)
    assert _largest_z(draws, probs) < 4.5
    # The control: entry 5 made 2% more likely is caught by the same check.
    tilted = probs.copy()
    tilted[5] *= 1.02
    assert _largest_z(sample(keys, jnp.asarray(tilted)), probs) > 4.5


def test_decoding_calls_the_kernel_and_its_fallback_agrees(monkeypatch):
    logits = _rows((3, 300), seed=1)
    keys = jax.random.split(jax.random.key(0), 3)
    greedy, sampled = SamplingConfig(), SamplingConfig(temperature=1.0)
    for sampling in (greedy, sampled):
        program = jax.make_jaxpr(lambda x, k, s=sampling: choose_tokens(x, k, 0, s))(logits, keys)
        assert "ffi_call" in primitive_names(program.jaxpr)
    with_kernel = choose_tokens(logits, keys, 0, greedy)
    monkeypatch.setattr(token_choice, "_kernel_runs", lambda: False)
    program = jax.make_jaxpr(lambda x: choose_tokens(x, keys, 0, greedy))(logits)
    assert "ffi_call" not in primitive_names(program.jaxpr)
    np.testing.assert_array_equal(choose_tokens(logits, keys, 0, greedy), with_kernel)
    finite = jnp.nan_to_num(logits[:, None], posinf=5.0, neginf=-5.0)[:, 0]
    draws = choose_tokens(finite, keys, 0, sampled)  # jax.random.categorical
    chex.assert_shape(draws, (3,))
    assert np.all(np.asarray(draws) < finite.shape[-1])
