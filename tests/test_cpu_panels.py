"""The CPU panel kernel (specjax.kernels.cpu_panels) and the target layout that uses it
(Layers.panels): the kernel computes the product at every row count, a row's result does not
depend on the rows beside it, and a model with packed matrices is the same function, with the
same canonical arrays and fingerprint, as the other layouts."""

import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from specjax.kernels import cpu_panels
from test_weight_layout import _canonical_weights, assert_same_forward, both_layouts

import specjax
from specjax.config import TINY
from specjax.models.target import MATRICES, Llama, default_panels, model_from_weights
from specjax.train.checkpoint import target_fingerprint

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not cpu_panels.available(),
    reason="the panel kernel runs on the CPU backend where it builds",
)


def _weights(out: int, inner: int, layers: int = 3, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((out, inner)).astype(np.float32) for _ in range(layers)]


def test_pack_and_unpack_round_trip():
    (w,) = _weights(70, 45, layers=1)  # 70 is not a multiple of the 32-lane panel
    panels = cpu_panels.pack(w)
    chex.assert_shape(panels, (3, 45, 32))
    np.testing.assert_array_equal(cpu_panels.unpack(panels, 70), w)
    np.testing.assert_array_equal(np.asarray(panels)[2, :, 6:], 0.0)  # rows past O are zero
    assert cpu_panels.value_at(panels, 37, 11) == w[37, 11]
    traced = jax.jit(lambda w: cpu_panels.unpack(cpu_panels.pack(w), 70))(jnp.asarray(w))
    np.testing.assert_array_equal(np.asarray(traced), w)


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 9, 16, 33, 100])
def test_the_kernel_is_the_product_of_the_chosen_layer(rows):
    """Every row count (the kernel takes rows 8 at a time and splits 8+ over threads), a weight
    whose sizes are not multiples of the panel or of the kernel's 64-input blocks, and the layer
    picked by a traced index."""
    ws = _weights(70, 150)
    panels = tuple(cpu_panels.pack(w) for w in ws)
    x = np.random.default_rng(1).standard_normal((rows, 150)).astype(np.float32)
    product = jax.jit(lambda x, layer: cpu_panels.panel_product(x, layer, panels, 70))
    for layer, w in enumerate(ws):
        out = np.asarray(product(x, jnp.int32(layer)))
        chex.assert_shape(out, (rows, 70))
        want = x.astype(np.float64) @ w.T.astype(np.float64)
        np.testing.assert_allclose(out, want, atol=2e-4, rtol=1e-5)


def test_a_rows_result_does_not_depend_on_the_block():
    """Bit for bit: the same row alone, first or last in a block of any size (plain decoding's
    one-token forward and a verification block then read identical products)."""
    ws = _weights(96, 576, layers=1, seed=2)
    panels = tuple(cpu_panels.pack(w) for w in ws)
    block = np.random.default_rng(3).standard_normal((40, 576)).astype(np.float32)
    product = jax.jit(lambda x: cpu_panels.panel_product(x, 0, panels, 96))
    alone = np.asarray(product(block[:1]))[0]
    for rows in (2, 5, 8, 9, 17, 40):
        out = np.asarray(product(block[:rows]))
        np.testing.assert_array_equal(out[0], alone)
        np.testing.assert_array_equal(out[-1], np.asarray(product(block[rows - 1 : rows]))[0])


def test_leading_axes_are_rows():
    ws = _weights(40, 64, layers=1)
    panels = tuple(cpu_panels.pack(w) for w in ws)
    x = np.random.default_rng(4).standard_normal((2, 3, 64)).astype(np.float32)
    out = cpu_panels.panel_product(x, 0, panels, 40)
    chex.assert_shape(out, (2, 3, 40))
    np.testing.assert_allclose(np.asarray(out), x @ ws[0].T, atol=1e-4)


def _panel_model(seed: int = 0) -> tuple[Llama, Llama]:
    canonical, _ = both_layouts(seed)
    packed = nnx.clone(canonical)
    packed.layers.set_layout(True, panels=True)
    packed.pack_head()
    return canonical, packed


def test_packed_layers_read_back_canonical_with_the_same_fingerprint():
    canonical, packed = _panel_model()
    assert packed.layers.panels and packed.head_panels is not None
    stored = packed.layers.compute_arrays()
    for name, arr in canonical.layers.arrays().items():
        np.testing.assert_array_equal(np.asarray(packed.layers.arrays()[name]), np.asarray(arr))
        if name in MATRICES:
            out = arr.shape[-1]
            assert packed.layers.panel_out(name) == out
            chex.assert_shape(stored[name][0], (-(-out // 32), arr.shape[1], 32))
    assert target_fingerprint(packed) == target_fingerprint(canonical)
    packed.layers.set_layout(False)  # back to the canonical stack
    for name, arr in canonical.layers.compute_arrays().items():
        np.testing.assert_array_equal(np.asarray(packed.layers.compute_arrays()[name]), arr)
    with pytest.raises(ValueError, match="needs out_in"):
        packed.layers.set_layout(False, panels=True)


def test_forward_is_the_same_function_with_packed_matrices():
    assert_same_forward(*_panel_model())


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_decoding_equal_with_packed_matrices(batch):
    """generate on the canonical target, generate and speculative decoding (a 3-chain and a
    tree of a draft model) on the packed one: the same tokens."""
    canonical, packed = _panel_model(3)
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11], [5]][:batch]
    ref = specjax.generate(canonical, prompts, max_new_tokens=24)
    out = specjax.generate(packed, prompts, max_new_tokens=24)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    drafter = specjax.LMDrafter.self_draft(1)
    for tree in (specjax.TreeConfig.chain(3), specjax.TreeConfig(branching=(3, 2))):
        config = specjax.SpecConfig(tree=tree)
        spec = specjax.speculative_generate(
            packed, drafter, prompts, max_new_tokens=24, config=config
        )
        np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ref.tokens))
    assert all(len(set(row.tolist())) > 5 for row in np.asarray(ref.tokens))  # tokens vary


def test_loaded_float32_models_pack_and_bfloat16_ones_do_not():
    assert default_panels()
    canonical = Llama(TINY, rngs=nnx.Rngs(0), out_in=False)
    weights = {k: np.asarray(v) for k, v in _canonical_weights(canonical)}
    loaded = model_from_weights(TINY, weights)
    assert loaded.layers.panels and loaded.head_panels is not None
    np.testing.assert_array_equal(
        cpu_panels.unpack(loaded.head_panels[...], TINY.vocab_size),
        np.asarray(canonical.embed[...]),
    )
    for name, arr in canonical.layers.arrays().items():
        np.testing.assert_array_equal(np.asarray(loaded.layers.arrays()[name]), arr)
    bf16 = TINY.__class__(**{**TINY.__dict__, "dtype": "bfloat16"})
    assert not Llama(bf16, rngs=nnx.Rngs(0)).layers.panels


def test_switching_the_kernel_off_keeps_xlas_products():
    code = (
        "from specjax.kernels import cpu_panels; from specjax.config import TINY; "
        "from specjax.models.target import Llama; from flax import nnx; "
        "m = Llama(TINY, rngs=nnx.Rngs(0)); "
        "print(cpu_panels.available(), m.layers.out_in, m.layers.panels, m.head_panels)"
    )
    env = dict(os.environ, **{cpu_panels.ENV_SWITCH: "0"})
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False", "True", "False", "None"], done.stdout


def test_the_product_is_differentiable_in_its_input_and_weights():
    ws = _weights(40, 64)
    panels = tuple(cpu_panels.pack(w) for w in ws)
    x = jnp.asarray(np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32))

    def loss(x, panels):
        return jnp.sum(jnp.sin(cpu_panels.panel_product(x, jnp.int32(1), panels, 40)))

    grad_x, grad_panels = jax.grad(loss, argnums=(0, 1))(x, panels)
    want_x, want_w = jax.grad(lambda x, w: jnp.sum(jnp.sin(x @ w.T)), argnums=(0, 1))(
        x, jnp.asarray(ws[1])
    )
    np.testing.assert_allclose(np.asarray(grad_x), np.asarray(want_x), atol=1e-4)
    np.testing.assert_allclose(cpu_panels.unpack(grad_panels[1], 40), want_w, atol=1e-4)
    for k in (0, 2):  # the other layers' weights get no gradient
        np.testing.assert_array_equal(np.asarray(grad_panels[k]), 0.0)


def test_products_in_flight_at_once_do_not_wait_on_each_other():
    """Products of 8+ rows hand chunks of panels to XLA's thread pool. One that waited for its
    scheduled tasks to start hung as soon as every pool thread sat in such a wait (many
    computations in flight, several threads dispatching: the first version of the kernel hung
    here, and once in the test suite on a 2-core machine). Run in a subprocess with a deadline."""
    code = """
import threading, jax, jax.numpy as jnp, numpy as np
from specjax.kernels import cpu_panels
assert cpu_panels.available()
rng = np.random.default_rng(0)
panels = [(cpu_panels.pack(rng.standard_normal((256, 128)).astype(np.float32)),) for _ in range(12)]
f = jax.jit(lambda x: sum(cpu_panels.panel_product(x, 0, p, 256) for p in panels))
g = jax.jit(lambda x: jnp.stack(
    [cpu_panels.panel_product(x + i, 0, p, 256) for i, p in enumerate(panels)]))
x = jnp.ones((16, 128), jnp.float32)
jax.block_until_ready([f(x) for _ in range(50)] + [g(x) for _ in range(50)])
def dispatch():
    for _ in range(30):
        jax.block_until_ready(g(x))
threads = [threading.Thread(target=dispatch) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print("done")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.split()[-1] == "done"


@pytest.mark.parametrize("kind", ["eagle", "mdc"])
def test_feature_drafters_bound_to_a_packed_target_pack_their_matrices(kind):
    """A feature drafter bound to a packed target packs its layer, its own matrices and its
    readout head, drafts trees the target accepts as before (greedy output equal to plain
    decoding), reads back canonical parameters, and trains: a packed net's gradients are its
    canonical net's."""
    from specjax.drafters import EagleDrafter, HiddenStateDrafter
    from specjax.models.drafter import DrafterConfig, DrafterNet, target_parts, unrolled_outputs

    canonical, packed = _panel_model(3)
    cfg = DrafterConfig(kind=kind, target=TINY, draft_vocab_size=TINY.vocab_size)
    net = DrafterNet(cfg, np.arange(TINY.vocab_size), rngs=nnx.Rngs(5), target=canonical)
    cls = HiddenStateDrafter if kind == "mdc" else EagleDrafter
    plain, fast = cls(nnx.clone(net), canonical), cls(nnx.clone(net), packed)
    assert fast.net.panels and fast.net.layers.panels and fast.head_panels is not None
    assert fast.net.fc[...].ndim == 3  # [P, I, 32]
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11]]
    ref = specjax.generate(canonical, prompts, max_new_tokens=20)
    config = specjax.SpecConfig(tree=specjax.TreeConfig.dynamic(6, 3, 2))
    out = specjax.speculative_generate(packed, fast, prompts, max_new_tokens=20, config=config)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    chex.assert_trees_all_close(fast.net.canonical_params(), plain.net.canonical_params())

    tokens = jnp.asarray([[1, 5, 7, 9, 2, 3]], jnp.int32)
    feats = jax.random.normal(jax.random.key(0), (1, 6, TINY.d_model))
    parts = target_parts(canonical, plain.net.draft_vocab[...])

    def loss(net):
        return sum(jnp.mean(o**2) for o in unrolled_outputs(net, parts, tokens, feats, 2))

    grads = {}
    for name, d in (("plain", plain), ("fast", fast)):
        graphdef, params, rest = nnx.split(d.net, nnx.Param, ...)
        g = jax.grad(lambda p, gd=graphdef, r=rest: loss(nnx.merge(gd, p, r)))(params)
        grads[name] = nnx.merge(graphdef, g, rest)

    # The packed net's gradients, unpacked, are the canonical net's.
    # Gradients reach ~3000 here and small entries come from cancellation, so two summation
    # orders differ by up to ~1e-5 of each tensor's scale: compared at 1e-4 of it (a wrong or
    # missing gradient differs by the order of the scale).
    def close_to_scale(a, b):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 1e-4 * np.max(np.abs(b)) + 1e-6

    jax.tree.map(
        close_to_scale, grads["fast"].canonical_params(), grads["plain"].canonical_params()
    )
    fast.set_layout(False)  # back to canonical in place
    chex.assert_trees_all_close(fast.net.canonical_params(), plain.net.canonical_params())
    assert fast.head_panels is None and not fast.net.panels


def test_sharding_a_packed_model_unpacks_it():
    """The sharding rules name the canonical axes: shard_model unpacks the matrices and drops
    the packed LM head, and the forward stays the same function."""
    from specjax.sharding import shard_model

    canonical = Llama(TINY, rngs=nnx.Rngs(0), out_in=False)
    loaded = model_from_weights(TINY, {k: np.asarray(v) for k, v in _canonical_weights(canonical)})
    assert loaded.layers.panels and loaded.head_panels is not None
    shard_model(loaded, specjax.make_mesh(data=1, model=1))
    assert not loaded.layers.out_in and not loaded.layers.panels and loaded.head_panels is None
    assert_same_forward(canonical, loaded)


def test_bfloat16_panels_give_the_float32_products_bit_for_bit():
    """Weights whose values are bfloat16 (a drafter's checkpoint) packed in bfloat16 give the
    products of the same weights packed in float32, bit for bit, at every row count; pack_exact
    packs them so, and other weights in float32."""
    ws = [w.astype(jnp.bfloat16).astype(np.float32) for w in _weights(70, 150, layers=2)]
    half = tuple(cpu_panels.pack(w, jnp.bfloat16) for w in ws)
    full = tuple(cpu_panels.pack(w) for w in ws)
    assert half[0].dtype == jnp.bfloat16 and full[0].dtype == jnp.float32
    np.testing.assert_array_equal(cpu_panels.unpack(half[1], 70), ws[1])
    assert cpu_panels.unpack(half[1], 70).dtype == np.float32
    for rows in (1, 3, 8, 9, 33):
        x = np.random.default_rng(rows).standard_normal((rows, 150)).astype(np.float32)
        for layer in range(2):
            a = cpu_panels.panel_product(x, layer, half, 70)
            b = cpu_panels.panel_product(x, layer, full, 70)
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert cpu_panels.pack_exact(ws[0]).dtype == jnp.bfloat16
    (other,) = _weights(70, 150, layers=1, seed=3)  # float32 values: not exactly bfloat16
    assert cpu_panels.pack_exact(other).dtype == jnp.float32


@pytest.mark.parametrize("kind", ["eagle", "mdc"])
def test_a_bfloat16_drafter_packs_bfloat16_panels_and_drafts_the_same(kind, monkeypatch):
    """A feature drafter whose weights are bfloat16 (as load_drafter restores a checkpoint)
    packs its matrices in bfloat16 and drafts exactly what the same drafter packed in float32
    does: the same accepted counts at every step, and greedy output equal to plain decoding.
    (Both keep the readout head in bfloat16: a copy of the target's float32 head.)"""
    from specjax.drafters import EagleDrafter, HiddenStateDrafter
    from specjax.models.drafter import DrafterConfig, DrafterNet

    canonical, packed = _panel_model(3)
    cfg = DrafterConfig(kind=kind, target=TINY, draft_vocab_size=TINY.vocab_size)
    net = DrafterNet(cfg, np.arange(TINY.vocab_size), rngs=nnx.Rngs(5), target=canonical)
    params = nnx.state(net, nnx.Param)
    nnx.update(net, jax.tree.map(lambda p: p.astype(jnp.bfloat16), params))
    cls = HiddenStateDrafter if kind == "mdc" else EagleDrafter
    half = cls(nnx.clone(net), packed)
    assert half.net.fc[...].dtype == jnp.bfloat16 and half.net.panels
    with monkeypatch.context() as m:
        m.setattr(cpu_panels, "pack_exact", cpu_panels.pack)
        full = cls(nnx.clone(net), packed)
    assert full.net.fc[...].dtype == jnp.float32
    assert half.head_panels[...].dtype == full.head_panels[...].dtype == jnp.bfloat16
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11]]
    config = specjax.SpecConfig(tree=specjax.TreeConfig.dynamic(6, 3, 2))
    outs = [
        specjax.speculative_generate(packed, d, prompts, max_new_tokens=20, config=config)
        for d in (half, full)
    ]
    ref = specjax.generate(packed, prompts, max_new_tokens=20)
    np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(
        np.asarray(outs[0].stats["accepted_hist"]), np.asarray(outs[1].stats["accepted_hist"])
    )
