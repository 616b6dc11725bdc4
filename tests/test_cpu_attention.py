"""The CPU attention kernel (specjax.kernels.cpu_panels.cache_attention), the CPU default of
attn_impl "auto": it is the reference attention of specjax.attention's contract on every shape,
reads only the positions a query may see, gives a token the same output alone or in a block,
is differentiable, and decoding with it is greedy-equal to decoding with XLA's attention."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lively_models import lively_llama
from specjax.kernels import cpu_panels
from specjax.kernels.cpu_panels.cache_attention import cache_attention

import specjax
from specjax import attention
from specjax.attention import (
    CPU_KERNEL_MAX_QUERIES,
    attend_cache,
    cpu_kernel_ok,
    reference_attention,
    resolve_impl,
)
from specjax.config import TINY

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not cpu_panels.available(),
    reason="the CPU attention kernel runs on the CPU backend where it builds",
)

# (B, N, H, K, D, S, L): one row and a verification block of SmolLM2's heads; ragged rows with
# grouped heads and a head dim below the kernel's 16-float lanes (stories260K's D = 8); decoding
# over a long cache; a block of 16 with as many kv heads as heads; a head dim neither a multiple
# of 16 nor 8 (the scalar sums).
SHAPES = [
    (1, 8, 9, 3, 64, 141, 4),
    (3, 5, 4, 2, 8, 40, 2),
    (2, 1, 9, 3, 64, 300, 3),
    (2, 16, 8, 8, 48, 64, 2),
    (2, 3, 4, 2, 12, 37, 2),
]


def _inputs(b, n, h, k, d, s, layers, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, n, h, d)), jnp.float32)
    keys = jnp.asarray(rng.standard_normal((layers, b, s, k, d)), jnp.float32)
    values = jnp.asarray(rng.standard_normal((layers, b, s, k, d)), jnp.float32)
    lengths = rng.integers(0, s - n + 1, b)
    lengths[0] = 0  # a row with no committed context sees only its block
    mask = np.tril(rng.random((b, n, n)) < 0.5) | np.eye(n, dtype=bool)[None]
    return q, keys, values, jnp.asarray(lengths, jnp.int32), jnp.asarray(mask)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_kernel_is_the_reference_attention_of_the_chosen_layer(shape):
    *dims, layers = shape
    q, k, v, lengths, mask = _inputs(*dims, layers)
    run = jax.jit(cache_attention)
    for layer in range(layers):
        out = run(q, k, v, jnp.int32(layer), lengths, mask)
        chex.assert_shape(out, q.shape)
        want = reference_attention(q, k[layer], v[layer], lengths, mask)
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(("n", "m"), [(4, 12), (1, 6), (3, 2)])
def test_a_block_mask_wider_or_narrower_than_the_queries(n, m):
    """mask [B, N, M] with M != N (a drafter's tree level over the keys its earlier levels
    wrote past the context): the reference attention of the same mask, at D = 8 and 64, and
    keys past the block's M slots are never read."""
    for h, kh, d in ((8, 4, 8), (9, 3, 64)):
        q, k, v, lengths, _ = _inputs(2, n, h, kh, d, 40, 1, seed=n + m)
        lengths = jnp.minimum(lengths, 40 - m)
        rng = np.random.default_rng(m)
        own = np.arange(m)[None, None, :] == (np.arange(n) % m)[None, :, None]
        mask = jnp.asarray((rng.random((2, n, m)) < 0.5) | own)  # every query sees a key
        out = jax.jit(cache_attention)(q, k, v, jnp.int32(0), lengths, mask)
        want = reference_attention(q, k[0], v[0], lengths, mask)
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-6, rtol=1e-5)
        k_np = np.array(k)
        k_np[0][np.arange(40)[None, :] >= np.asarray(lengths)[:, None] + m] = np.nan
        dirty = cache_attention(q, jnp.asarray(k_np), v, 0, lengths, mask)
        np.testing.assert_array_equal(np.asarray(dirty), np.asarray(out))


def test_positions_a_query_may_not_see_are_never_read():
    """NaN in the other layers and past each row's block: the output is unchanged."""
    q, k, v, lengths, mask = _inputs(2, 6, 4, 2, 16, 50, 3, seed=3)
    clean = cache_attention(q, k, v, 1, lengths, mask)
    past_block = np.arange(50)[None, :] >= np.asarray(lengths)[:, None] + 6  # [B, S]
    k_np, v_np = np.array(k), np.array(v)
    for x in (k_np, v_np):
        x[[0, 2]] = np.nan
        x[1][past_block] = np.nan
    dirty = cache_attention(q, jnp.asarray(k_np), jnp.asarray(v_np), 1, lengths, mask)
    np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean))


@pytest.mark.parametrize("heads", [(9, 3, 64), (8, 4, 8), (4, 2, 12)])
def test_a_tokens_output_does_not_depend_on_the_block(heads):
    """A chain of 4 verified at once and each of its tokens decoded alone after the tokens
    before it were committed (the same keys in the same positions): bit for bit the same, for
    each of the kernel's weighted-sum paths (heads of 16-float vectors, of 8, and scalar)."""
    q, k, v, _, _ = _inputs(1, 4, *heads, 64, 1, seed=5)
    chain = jnp.tril(jnp.ones((1, 4, 4), bool))
    block = cache_attention(q, k, v, 0, jnp.array([10]), chain)
    for i in range(4):
        alone = cache_attention(q[:, i : i + 1], k, v, 0, jnp.array([10 + i]), chain[:, :1, :1])
        np.testing.assert_array_equal(np.asarray(alone[:, 0]), np.asarray(block[:, i]))


def test_the_kernel_is_differentiable_like_the_reference():
    q, k, v, lengths, mask = _inputs(2, 5, 4, 2, 16, 30, 2, seed=7)

    def kernel_loss(q, k, v):
        return jnp.sum(jnp.sin(cache_attention(q, k, v, 1, lengths, mask)))

    def reference_loss(q, k, v):
        return jnp.sum(jnp.sin(reference_attention(q, k[1], v[1], lengths, mask)))

    got = jax.grad(kernel_loss, (0, 1, 2))(q, k, v)
    want = jax.grad(reference_loss, (0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-6)
    assert float(jnp.max(jnp.abs(got[1][0]))) == 0.0  # nothing flows into the other layer


def test_auto_takes_the_kernel_for_float32_blocks_up_to_its_width(monkeypatch):
    assert resolve_impl("auto", 64) == "cpu"
    assert cpu_kernel_ok("cpu", CPU_KERNEL_MAX_QUERIES, jnp.float32)
    assert not cpu_kernel_ok("cpu", CPU_KERNEL_MAX_QUERIES + 1, jnp.float32)  # a prefill
    assert not cpu_kernel_ok("cpu", 8, jnp.bfloat16)
    assert not cpu_kernel_ok("reference", 8, jnp.float32)
    # Blocks it does not take go through the reference attention, with the same result.
    q, k, v, lengths, mask = _inputs(1, 3, 4, 2, 16, 20, 2)
    wide = attend_cache(q.astype(jnp.bfloat16), k, v, 1, lengths, mask, "cpu")
    want = reference_attention(q.astype(jnp.bfloat16), k[1], v[1], lengths, mask)
    np.testing.assert_array_equal(np.asarray(wide, np.float32), np.asarray(want, np.float32))
    monkeypatch.setenv(attention.CPU_ATTENTION_SWITCH, "0")
    assert resolve_impl("auto", 64) == "reference"
    with pytest.raises(ValueError, match="needs the CPU kernel.*use 'auto' or 'reference'"):
        resolve_impl("cpu", 64)


# The default run keeps the ragged batch (rows of three prompt lengths); batch 1 is under slow.
@pytest.mark.parametrize("batch", [pytest.param(1, marks=pytest.mark.slow), 3])
def test_decoding_is_greedy_equal_with_xlas_attention(batch):
    """generate with XLA's attention, and generate and speculative decoding (a chain and a tree)
    with the kernel, at caches of different sizes: the same tokens."""
    model = lively_llama(TINY, seed=3)
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11], [5]][:batch]
    ref = specjax.generate(model, prompts, max_new_tokens=40, attn_impl="reference")
    for new in (40, 24):
        out = specjax.generate(model, prompts, max_new_tokens=new, attn_impl="cpu")
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens)[:, :new])
    drafter = specjax.LMDrafter.self_draft(1)
    for tree in (specjax.TreeConfig.chain(3), specjax.TreeConfig(branching=(3, 2))):
        config = specjax.SpecConfig(tree=tree, attn_impl="cpu")
        spec = specjax.speculative_generate(
            model, drafter, prompts, max_new_tokens=40, config=config
        )
        np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ref.tokens))
    assert all(len(set(row.tolist())) > 5 for row in np.asarray(ref.tokens))  # tokens vary
