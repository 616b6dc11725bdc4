"""The target's two weight layouts (specjax.models.layers.dense, Layers.out_in): the same
function either way, canonical arrays for everything that reads weights from outside the
forward pass, and the layout each way a model is built picks."""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jaxpr_checks import indexed_matrix_stacks, stack_slices

import specjax
from specjax.cache import init_cache
from specjax.config import TINY
from specjax.drafters import LMDrafter
from specjax.models.layers import (
    FEW_ROWS,
    dense,
    set_few_row_sums,
    set_row_padding,
    summed_rows,
    weight_leading_product,
)
from specjax.models.target import MATRICES, Llama, default_out_in, model_from_weights
from specjax.train.checkpoint import target_fingerprint
from specjax.tree import causal_mask


def both_layouts(seed: int = 0, *, sharpen: float = 3.0) -> tuple[Llama, Llama]:
    """One random model twice: canonical and out_in (weights x sharpen so tokens vary)."""
    canonical = Llama(TINY, rngs=nnx.Rngs(seed), out_in=False)
    graphdef, state = nnx.split(canonical)
    state = jax.tree.map(lambda x: x * sharpen if x.ndim >= 2 else x, state)
    canonical = nnx.merge(graphdef, state)
    swapped = nnx.clone(canonical)
    swapped.layers.set_layout(True)
    return canonical, swapped


def test_dense_gives_the_product_in_either_layout():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 16))
    w = jax.random.normal(jax.random.PRNGKey(1), (16, 24))
    chex.assert_trees_all_close(dense(x, w), x @ w, atol=1e-5)
    chex.assert_trees_all_close(dense(x, w.T.copy(), out_in=True), x @ w, atol=1e-5)
    chex.assert_shape(dense(x, w.T.copy(), out_in=True), (2, 3, 24))


@pytest.mark.parametrize("rows", [1, 2, 4, 5, 12, 31, 32, 33])
def test_weight_leading_product_is_the_product_at_every_row_count(rows):
    """2-32 float32 rows are a multiply-and-sum (above 4 rows over zero rows up to a multiple
    of 8), other counts a dot; all give x @ w."""
    x = jax.random.normal(jax.random.PRNGKey(0), (1, rows, 48))
    w = jax.random.normal(jax.random.PRNGKey(1), (40, 48))
    out = weight_leading_product(w, x)
    chex.assert_shape(out, (40, 1, rows))
    chex.assert_trees_all_close(out, jnp.einsum("oi,bti->obt", w, x), atol=1e-4)
    jaxpr = str(jax.make_jaxpr(weight_leading_product)(w, x))
    assert ("dot_general" in jaxpr) == (rows not in FEW_ROWS)
    padded = rows in FEW_ROWS and rows > 4 and rows % 8 != 0
    assert ("pad[" in jaxpr) == padded, jaxpr
    assert summed_rows(rows) == (-(-rows // 8) * 8 if rows > 4 else rows)
    if padded:  # unpadded when turned off, the same product
        before = set_row_padding(False)
        jax.clear_caches()
        try:
            assert "pad[" not in str(jax.make_jaxpr(weight_leading_product)(w, x))
            chex.assert_trees_all_close(weight_leading_product(w, x), out, atol=1e-5)
        finally:
            set_row_padding(before)
            jax.clear_caches()
    before = set_few_row_sums(False)
    jax.clear_caches()  # the setting is read at trace time
    try:
        assert "dot_general" in str(jax.make_jaxpr(weight_leading_product)(w, x))
    finally:
        set_few_row_sums(before)
        jax.clear_caches()
    # Other dtypes keep the dot (a bfloat16 sum would accumulate in bfloat16).
    as_bf16 = (w.astype(jnp.bfloat16), x.astype(jnp.bfloat16))
    assert "dot_general" in str(jax.make_jaxpr(weight_leading_product)(*as_bf16))


def test_layouts_store_swapped_matrices_and_read_back_canonical():
    canonical, swapped = both_layouts()
    assert not canonical.layers.out_in and swapped.layers.out_in
    stored = swapped.layers.compute_arrays()
    for name, arr in canonical.layers.arrays().items():
        back = swapped.layers.arrays()[name]
        np.testing.assert_array_equal(np.asarray(back), np.asarray(arr))
        if name in MATRICES:  # one [out, in] buffer per layer
            assert isinstance(stored[name], tuple) and len(stored[name]) == arr.shape[0]
            for layer, w in zip(stored[name], np.asarray(arr), strict=True):
                np.testing.assert_array_equal(np.asarray(layer), w.T)
        else:
            assert stored[name].shape == arr.shape
    assert target_fingerprint(swapped) == target_fingerprint(canonical)
    swapped.layers.set_layout(False)
    for name, arr in canonical.layers.compute_arrays().items():
        np.testing.assert_array_equal(np.asarray(swapped.layers.compute_arrays()[name]), arr)


def assert_same_forward(reference: Llama, other: Llama) -> None:
    """Both models give the same logits, hidden states and cached keys on a prefill block."""
    cache = init_cache(TINY, 2, 24)
    tokens = jnp.asarray([[1, 5, 7, 9, 2, 3], [4, 4, 8, 1, 0, 6]], jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))
    mask = causal_mask(2, 6)
    a = reference(tokens, positions=positions, cache=cache, tree_mask=mask, return_hidden=(1,))
    b = other(tokens, positions=positions, cache=cache, tree_mask=mask, return_hidden=(1,))
    chex.assert_trees_all_close(b.logits, a.logits, atol=1e-4, rtol=1e-4)
    # The layouts sum the products in different orders; with AVX-512 kernels the hidden states
    # (magnitudes up to ~400 here) and the cached keys differ by up to ~5e-5. A wrong layout
    # differs by O(1).
    chex.assert_trees_all_close(b.hidden, a.hidden, atol=1e-4, rtol=1e-4)
    chex.assert_trees_all_close(b.cache.k, a.cache.k, atol=1e-4, rtol=1e-4)


def test_forward_is_the_same_function_in_both_layouts():
    assert_same_forward(*both_layouts())


@pytest.mark.parametrize("out_in", [False, True])
def test_a_layer_range_indexes_the_weight_stack_instead_of_slicing_it(out_in):
    """Every layer range (HiSpec's three, self-drafting's first layers, the segments between
    returned hidden states) reads each layer's weights out of the whole stack by index inside
    the layer loop. A static slice of the stack is a copy of those layers' weights on every
    call: on XLA:CPU it made layers [8, 30) of SmolLM2 cost 3-3.6x the whole forward
    (experiments/results/layer_range_before.md)."""
    cfg = dataclasses.replace(TINY, n_layers=4)
    model = Llama(cfg, rngs=nnx.Rngs(0), out_in=out_in)
    graphdef, params = nnx.split(model)
    cache = init_cache(cfg, 1, 16)
    positions = jnp.arange(3, dtype=jnp.int32)[None]

    def forward(params, tokens, hidden, layer_range, return_hidden):
        out = nnx.merge(graphdef, params)(
            tokens, hidden=hidden, positions=positions, cache=cache, tree_mask=causal_mask(1, 3),
            layer_range=layer_range, return_hidden=return_hidden,
        )  # fmt: skip
        return out.hidden, out.cache.k

    tokens = jnp.ones((1, 3), jnp.int32)
    hidden = jnp.zeros((1, 3, cfg.d_model), jnp.float32)
    for tok, hid, layer_range, returned in [
        (None, hidden, (1, 3), (3,)),  # a middle range
        (tokens, None, (0, 2), (2,)),  # the first layers (self-draft, a draft exit)
        (None, hidden, (2, 4), ()),  # the last layers (a flush)
        (tokens, None, (0, 4), (1, 3)),  # the whole stack in three segments
    ]:
        jaxpr = jax.make_jaxpr(
            functools.partial(forward, layer_range=layer_range, return_hidden=returned)
        )(params, tok, hid)
        assert not stack_slices(jaxpr.jaxpr, cfg.n_layers), (layer_range, returned)
        # out_in: the products read each layer's own buffer (no layer taken out of a stack)
        assert bool(indexed_matrix_stacks(jaxpr.jaxpr, cfg.n_layers)) == (not out_in)
    # the check sees a slice of the stack where there is one
    sliced = jax.make_jaxpr(lambda p: jax.tree.map(lambda w: w[1:3], p))(
        Llama(cfg, rngs=nnx.Rngs(0), out_in=False).layers.compute_arrays()
    )
    assert stack_slices(sliced.jaxpr, cfg.n_layers)


@pytest.mark.parametrize("batch", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_greedy_decoding_equal_in_both_layouts(batch):
    """generate and speculative decoding (a 3-chain self-draft) give the same tokens whichever
    layout the target holds."""
    canonical, swapped = both_layouts(3)
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11], [5]][:batch]
    ref = specjax.generate(canonical, prompts, max_new_tokens=20)
    out = specjax.generate(swapped, prompts, max_new_tokens=20)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    config = specjax.SpecConfig(tree=specjax.TreeConfig.chain(3))
    spec = specjax.speculative_generate(
        swapped, LMDrafter.self_draft(1), prompts, max_new_tokens=20, config=config
    )
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ref.tokens))
    assert all(len(set(row.tolist())) > 5 for row in np.asarray(ref.tokens))  # tokens vary


def test_built_models_pick_the_backend_layout():
    assert default_out_in() == (jax.default_backend() == "cpu")
    assert Llama(TINY, rngs=nnx.Rngs(0)).layers.out_in == default_out_in()
    canonical = Llama(TINY, rngs=nnx.Rngs(0), out_in=False)
    loaded = model_from_weights(TINY, {k: np.asarray(v) for k, v in _canonical_weights(canonical)})
    assert loaded.layers.out_in == default_out_in()
    for name, arr in canonical.layers.arrays().items():
        np.testing.assert_array_equal(np.asarray(loaded.layers.arrays()[name]), arr)


def _canonical_weights(model):
    yield "embed", model.embed[...]
    yield "final_norm", model.final_norm[...]
    if not model.config.tie_embeddings:
        yield "lm_head", model.lm_head[...]
    yield from model.layers.arrays().items()


@pytest.mark.parametrize("kind", ["eagle", pytest.param("mdc", marks=pytest.mark.slow)])
def test_feature_drafters_follow_the_target_layout(kind):
    """A feature drafter takes its target's layout (its layers and readout, see FeatureDrafter)
    and drafts the same trees in either: same tokens, same tokens per call."""
    from specjax.drafters import EagleDrafter, HiddenStateDrafter
    from specjax.models.drafter import DrafterConfig, DrafterNet

    canonical, swapped = both_layouts(3)
    cfg = DrafterConfig(kind=kind, target=TINY, draft_vocab_size=TINY.vocab_size)
    net = DrafterNet(cfg, np.arange(TINY.vocab_size), rngs=nnx.Rngs(5), target=canonical)
    cls = HiddenStateDrafter if kind == "mdc" else EagleDrafter
    plain, fast = cls(nnx.clone(net), canonical), cls(nnx.clone(net), swapped)
    assert not plain.net.out_in and fast.net.out_in
    assert fast.head_u.shape == plain.head_u.shape[::-1]
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11]]
    ref = specjax.generate(canonical, prompts, max_new_tokens=20)
    config = specjax.SpecConfig(tree=specjax.TreeConfig.dynamic(6, 3, 2))
    outs = [
        specjax.speculative_generate(t, d, prompts, max_new_tokens=20, config=config)
        for t, d in ((canonical, plain), (swapped, fast))
    ]
    for out in outs:
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(
        np.asarray(outs[0].stats["target_calls"]), np.asarray(outs[1].stats["target_calls"])
    )
    fast.set_layout(False)  # back to canonical in place: the same arrays as the plain binding
    chex.assert_trees_all_equal(fast.net.canonical_params(), plain.net.canonical_params())
    chex.assert_trees_all_equal(
        nnx.to_pure_dict(nnx.state(fast.net, nnx.Param)),
        nnx.to_pure_dict(nnx.state(plain.net, nnx.Param)),
    )
    np.testing.assert_array_equal(np.asarray(fast.head_u[...]), np.asarray(plain.head_u[...]))
