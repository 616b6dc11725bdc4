"""bfloat16 products with float32 accumulation for training (specjax.models.precision)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import precision
from specjax.models.layers import dense
from specjax.train.trainer import TrainConfig


def _operands(seed=0, rows=6, inner=40, out=24):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((2, rows, inner)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((inner, out)), jnp.float32)
    return x, w


def _bf16_product(a, b):
    """a @ b with both rounded to bfloat16 first, summed in float64 (the exact products)."""

    def rounded(v):
        return np.asarray(jnp.asarray(v).astype(jnp.bfloat16).astype(jnp.float32), np.float64)

    return rounded(a) @ rounded(b)


def test_low_precision_matmul_multiplies_rounded_operands_forward_and_backward():
    x, w = _operands()
    out = precision.low_precision_matmul(x, w, jnp.dtype(jnp.bfloat16))
    chex.assert_shape(out, (2, 6, 24))
    assert out.dtype == jnp.float32
    # The products of the rounded operands, accumulated in float32 (not bfloat16: ~1e-6 off
    # the exact sum, where a bfloat16 sum would be ~1e-2 off).
    np.testing.assert_allclose(out, _bf16_product(x, w), rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(out) - np.asarray(x @ w)).max() > 1e-3  # the rounding happened

    g = jnp.asarray(np.random.default_rng(1).standard_normal(out.shape), jnp.float32)
    dx, dw = jax.grad(lambda x, w: jnp.sum(precision.low_precision_matmul(x, w, jnp.bfloat16) * g),
                      argnums=(0, 1))(x, w)  # fmt: skip
    assert dx.dtype == dw.dtype == jnp.float32
    np.testing.assert_allclose(dx, _bf16_product(g, w.T), rtol=1e-5, atol=1e-5)
    flat_x, flat_g = np.asarray(x).reshape(-1, 40), np.asarray(g).reshape(-1, 24)
    np.testing.assert_allclose(dw, _bf16_product(flat_x.T, flat_g), rtol=1e-5, atol=1e-5)
    # and close to the float32 gradients (bfloat16 keeps 8 bits)
    ref_dx, ref_dw = jax.grad(lambda x, w: jnp.sum((x @ w) * g), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(dx, ref_dx, rtol=0.05, atol=0.1)
    np.testing.assert_allclose(dw, ref_dw, rtol=0.05, atol=0.1)


def test_products_in_applies_while_tracing_and_restores():
    x, w = _operands(2)
    exact = np.asarray(dense(x, w))
    with precision.products_in(jnp.bfloat16):
        assert precision.product_dtype() == jnp.bfloat16
        inside = jax.jit(dense)(x, w)
        with precision.products_in(None):  # a float32 part inside a bfloat16 one
            np.testing.assert_array_equal(dense(x, w), exact)
        assert precision.product_dtype() == jnp.bfloat16
    assert precision.product_dtype() is None
    np.testing.assert_allclose(inside, _bf16_product(x, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(dense(x, w), exact)
    with precision.products_in(jnp.float32):  # float32 means: as written
        np.testing.assert_array_equal(dense(x, w), exact)


def test_train_config_names_a_bad_products_value():
    with pytest.raises(ValueError, match="products must be"):
        TrainConfig(steps=1, products="float16")


def test_training_products_pick_bfloat16_only_on_a_cpu_with_amx(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: X\nflags\t\t: avx2 avx512f amx_tile amx_bf16\n")
    assert precision.has_amx(str(info))
    info.write_text("model name\t: X\nflags\t\t: avx2 avx512f avx512_bf16\n")
    assert not precision.has_amx(str(info))
    assert not precision.has_amx(str(tmp_path / "missing"))
    for amx, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(precision, "has_amx", lambda amx=amx: amx)
        assert precision.training_products() == expected
        assert precision.training_products("float32") == "float32"
        assert precision.training_products("bfloat16") == "bfloat16"
