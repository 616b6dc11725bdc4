"""HiSpec's exit heads (specjax.models.exit_head, specjax.train.exit_heads) on a random tiny
target: the kinds' readouts, that training moves an exit toward the last layer, and the
checkpoint round trip with its refusals."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lively_models import lively_llama

import specjax
from specjax.config import TINY
from specjax.models.exit_head import ExitHead
from specjax.models.layers import rms_norm
from specjax.train.exit_heads import (
    ExitTrainConfig,
    agreement,
    collect,
    exit_parts,
    load_exit_heads,
    save_exit_heads,
    train_exit_head,
)

VOCAB = np.arange(TINY.vocab_size, dtype=np.int32)


@pytest.fixture(scope="module")
def target():
    # Weights scaled by 3: at initialisation scale a random model's layers barely change the
    # residual stream, and its untrained exits already agree with the last layer.
    return lively_llama(TINY, 0)


@pytest.fixture(scope="module")
def data(target):
    rng = np.random.default_rng(0)
    rows = [rng.integers(1, TINY.vocab_size, int(rng.integers(8, 40))).tolist() for _ in range(48)]
    return collect(target, rows, [1] * len(rows), (1,), batch=8)


def make(kind, layer=1, vocab=VOCAB, seed=0):
    return ExitHead(TINY.d_model, layer=layer, kind=kind, vocab=vocab, eps=TINY.norm_eps,
                    rngs=nnx.Rngs(seed))  # fmt: skip


def test_collect_counts_positions_and_matches_the_target(target, data):
    chex.assert_shape(data.hidden[1], (data.size, TINY.d_model))
    chex.assert_shape(data.teacher, (data.size, TINY.d_model))
    # target_next is the target's own argmax: its logits from the teacher features.
    head = target.lm_head[...] if not TINY.tie_embeddings else target.embed[...].T
    logits = rms_norm(jnp.asarray(data.teacher, jnp.float32), target.final_norm[...],
                      TINY.norm_eps) @ head  # fmt: skip
    agree = np.mean(np.asarray(jnp.argmax(logits, -1)) == data.target_next)
    assert agree > 0.99  # float16 storage may flip a near tie
    with pytest.raises(ValueError, match="exit layers must lie in"):
        collect(target, [[1, 2, 3]], [0], (TINY.n_layers,))


def test_untrained_kinds_start_as_the_plain_exit(target):
    parts = exit_parts(target, VOCAB)
    x = jax.random.normal(jax.random.key(1), (5, TINY.d_model))
    plain = make("identity")(x, parts)
    expected = rms_norm(x, parts.final_norm, TINY.norm_eps) @ parts.head_u
    np.testing.assert_allclose(plain, expected, rtol=1e-5, atol=1e-5)
    for kind in ("linear", "mlp"):  # the residual block's last projection starts at zero
        np.testing.assert_allclose(make(kind)(x, parts), plain, rtol=1e-5, atol=1e-5)
    sub = np.array([0, 3, 7], np.int32)  # a smaller exit vocabulary reads those LM-head columns
    np.testing.assert_allclose(make("identity", vocab=sub)(x, exit_parts(target, sub)),
                               plain[:, sub], rtol=1e-5, atol=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match="unknown exit head kind"):
        make("attention")


def test_training_moves_the_exit_toward_the_last_layer(target, data):
    parts = exit_parts(target, VOCAB)
    before = agreement(make("identity"), parts, data)
    head = make("mlp")
    losses = train_exit_head(head, parts, data, ExitTrainConfig(steps=300, batch=256), log=None)
    assert losses[-1] < losses[0] - 0.3, losses  # cross-entropy: floored at the teacher entropy
    after = agreement(head, parts, data)
    assert after > before + 0.05, (before, after)  # 0.34 -> 0.44 here
    # A run shorter than the warmup still trains (optax refused a decay of no steps).
    short = train_exit_head(make("mlp"), parts, data, ExitTrainConfig(steps=20), log=None)
    assert len(short) == 2 and np.isfinite(short).all()  # losses at steps 0 and 19
    assert ExitTrainConfig(steps=20).warmup_steps == 5
    with pytest.raises(ValueError, match="steps and batch must be >= 1"):
        ExitTrainConfig(steps=0)


def test_checkpoint_round_trip_and_refusals(target, tmp_path):
    heads = {"draft": make("linear", seed=1), "verify": make("mlp", seed=2)}
    # Non-trivial weights, so the round trip is checked on values that differ from the init.
    for h in heads.values():
        state = nnx.state(h, nnx.Param)
        nnx.update(h, jax.tree.map(lambda x: x + 0.01 * jnp.arange(x.size).reshape(x.shape) % 3,
                                   state))  # fmt: skip
    out = save_exit_heads(heads, tmp_path / "hs", target=target, target_name="tiny",
                          dtype="float32")  # fmt: skip
    loaded = load_exit_heads(out, target)
    x = jax.random.normal(jax.random.key(2), (4, TINY.d_model))
    parts = exit_parts(target, VOCAB)
    for role, h in heads.items():
        assert (loaded[role].layer, loaded[role].kind) == (h.layer, h.kind)
        np.testing.assert_allclose(loaded[role](x, parts), h(x, parts), rtol=1e-6, atol=1e-6)
    other = specjax.Llama(TINY, rngs=nnx.Rngs(5))
    with pytest.raises(ValueError, match="trained for another target"):
        load_exit_heads(out, other)
    with pytest.raises(ValueError, match="no readable hispec.json"):
        load_exit_heads(tmp_path, target)
    # The three-level settings written after measuring them survive a retrain into the folder.
    header = json.loads((out / "hispec.json").read_text())
    (out / "hispec.json").write_text(json.dumps({**header, "settings": {"buffer": 3}}))
    save_exit_heads(heads, out, target=target, target_name="tiny", dtype="float32")
    assert json.loads((out / "hispec.json").read_text())["settings"] == {"buffer": 3}
    header = json.loads((out / "hispec.json").read_text())
    del header["exits"]["verify"]
    (out / "hispec.json").write_text(json.dumps(header))
    with pytest.raises(ValueError, match=r"missing \['exits.verify'\]: copy the directory again"):
        load_exit_heads(out, target)
    with pytest.raises(ValueError, match="share one exit vocabulary"):
        save_exit_heads({"draft": make("linear"), "verify": make("linear", vocab=VOCAB[:5])},
                        tmp_path / "bad", target=target, target_name="tiny")  # fmt: skip
