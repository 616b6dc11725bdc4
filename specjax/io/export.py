"""Export a specjax model to a Hugging Face transformers Llama/Qwen2 (used as a reference peer in
tests and benchmarks; needs the [hf] extra)."""

from __future__ import annotations

import numpy as np

from specjax.config import ModelConfig
from specjax.models.target import LAYER_WEIGHTS


def model_weights(model) -> dict[str, np.ndarray]:
    """Canonical float32 numpy weights of a specjax Llama."""
    w = {n: np.asarray(v, np.float32) for n, v in model.layers.arrays().items()}
    w["embed"] = np.asarray(model.embed[...], np.float32)
    w["final_norm"] = np.asarray(model.final_norm[...], np.float32)
    if not model.config.tie_embeddings:
        w["lm_head"] = np.asarray(model.lm_head[...], np.float32)
    return w


def interleaved_to_half(kernel: np.ndarray, n_heads: int, head_dim: int) -> np.ndarray:
    """Permute the output columns [.., M, n_heads * D] of a Q/K kernel from RoPE on interleaved
    pairs (2i, 2i+1) to RoPE on half-split pairs (i, i + D/2)."""
    order = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    cols = (np.arange(n_heads)[:, None] * head_dim + order[None, :]).ravel()
    return kernel[..., cols]


def to_transformers(model):
    """A transformers LlamaForCausalLM (Qwen2ForCausalLM with qkv bias) with the same weights."""
    import torch
    import transformers

    cfg: ModelConfig = model.config
    w = model_weights(model)
    if cfg.rope_layout == "interleaved":
        for name, heads in (("wq", cfg.n_heads), ("wk", cfg.n_kv_heads)):
            w[name] = interleaved_to_half(w[name], heads, cfg.head_dim)
        for name, heads in (("bq", cfg.n_heads), ("bk", cfg.n_kv_heads)):
            if name in w:
                w[name] = interleaved_to_half(w[name], heads, cfg.head_dim)
    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_embeddings,
    )
    if cfg.qkv_bias:
        hf_cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    else:
        hf_cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    hf = cls(hf_cfg).eval()
    names = {
        "attn_norm": "input_layernorm.weight",
        "wq": "self_attn.q_proj.weight",
        "wk": "self_attn.k_proj.weight",
        "wv": "self_attn.v_proj.weight",
        "wo": "self_attn.o_proj.weight",
        "bq": "self_attn.q_proj.bias",
        "bk": "self_attn.k_proj.bias",
        "bv": "self_attn.v_proj.bias",
        "mlp_norm": "post_attention_layernorm.weight",
        "w_gate": "mlp.gate_proj.weight",
        "w_up": "mlp.up_proj.weight",
        "w_down": "mlp.down_proj.weight",
    }
    state = {"model.embed_tokens.weight": w["embed"], "model.norm.weight": w["final_norm"]}
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = w["lm_head"].T
    for name in LAYER_WEIGHTS:
        if name not in w:
            continue
        for i in range(cfg.n_layers):
            arr = w[name][i]
            state[f"model.layers.{i}.{names[name]}"] = arr.T if arr.ndim == 2 else arr
    tensors = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in state.items()}
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"export to transformers: missing {missing}, unexpected {unexpected}")
    if cfg.tie_embeddings:
        hf.tie_weights()
    return hf
