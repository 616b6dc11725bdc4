"""Logits parity with Hugging Face transformers on random tiny configs (fp32, CPU)."""

import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import specjax  # noqa: E402
from specjax.cache import init_cache  # noqa: E402
from specjax.tree import causal_mask  # noqa: E402

pytestmark = pytest.mark.hf

CONFIGS = {
    "llama_mha_tied": dict(kind="llama", heads=4, kv_heads=4, tied=True),
    "llama_gqa_untied": dict(kind="llama", heads=4, kv_heads=2, tied=False),
    "llama_gqa_tied": dict(kind="llama", heads=6, kv_heads=2, tied=True),
    "mistral_gqa": dict(kind="mistral", heads=4, kv_heads=1, tied=False),
    "qwen2_bias": dict(kind="qwen2", heads=4, kv_heads=2, tied=True),
}


def make_hf_model(kind, heads, kv_heads, tied, seed=0):
    common = dict(
        vocab_size=67,
        hidden_size=8 * heads,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        tie_word_embeddings=tied,
    )
    cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    extra = {"sliding_window": None} if kind in ("mistral", "qwen2") else {}
    torch.manual_seed(seed)
    model = cls[1](cls[0](**common, **extra)).eval()
    with torch.no_grad():  # random biases/norms so that every parameter matters
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    hf = make_hf_model(**CONFIGS[request.param])
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, specjax.load(path).model


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor(ids)).logits.numpy()


def test_prefill_logits_match(pair):
    hf, model = pair
    ids = np.random.default_rng(0).integers(0, 67, size=(2, 11))
    cache = init_cache(model.config, 2, 16)
    out = model(
        jnp.asarray(ids),
        positions=jnp.broadcast_to(jnp.arange(11), (2, 11)),
        cache=cache,
        tree_mask=causal_mask(2, 11),
    )
    np.testing.assert_allclose(np.asarray(out.logits), hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_stepwise_decode_with_cache_matches(pair):
    hf, model = pair
    ids = np.random.default_rng(1).integers(0, 67, size=(2, 9))
    expected = hf_logits(hf, ids)
    cache = init_cache(model.config, 2, 16)
    # Prefill 4 tokens, then feed the rest one by one through the cache.
    out = model(
        jnp.asarray(ids[:, :4]),
        positions=jnp.broadcast_to(jnp.arange(4), (2, 4)),
        cache=cache,
        tree_mask=causal_mask(2, 4),
    )
    cache = out.cache.replace(lengths=jnp.full((2,), 4, jnp.int32))
    got = [np.asarray(out.logits)]
    for t in range(4, 9):
        out = model(
            jnp.asarray(ids[:, t : t + 1]),
            positions=cache.lengths[:, None],
            cache=cache,
            tree_mask=jnp.ones((2, 1, 1), bool),
        )
        cache = out.cache.replace(lengths=cache.lengths + 1)
        got.append(np.asarray(out.logits))
    np.testing.assert_allclose(np.concatenate(got, axis=1), expected, atol=1e-4, rtol=0)
