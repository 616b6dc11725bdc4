"""Reader for Hugging Face safetensors directories (Llama, Mistral, Qwen2).

Hugging Face applies RoPE to half-split pairs (i, i + D/2): rope_layout="half". Linear weights
are stored [out, in] and transposed to specjax's [in, out].
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specjax.config import ModelConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
_REQUIRED_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"
)  # fmt: skip
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo",
    "self_attn.q_proj.bias": "bq",
    "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv",
    "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
}


def hf_config(cfg_json: dict, where: str) -> ModelConfig:
    model_type = cfg_json.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{where}: model_type {model_type!r} is not supported "
            f"(supported: {SUPPORTED_MODEL_TYPES})"
        )
    if cfg_json.get("rope_scaling"):
        raise ValueError(f"{where}: rope_scaling {cfg_json['rope_scaling']} is not supported yet")
    rope_type = (cfg_json.get("rope_parameters") or {}).get("rope_type", "default")
    if rope_type != "default":  # newer transformers keep the scaling under rope_parameters
        raise ValueError(f"{where}: RoPE scaling ({rope_type}) is not supported yet")
    if cfg_json.get("hidden_act", "silu") != "silu" or cfg_json.get("mlp_bias"):
        raise ValueError(
            f"{where}: an MLP with hidden_act {cfg_json.get('hidden_act')!r}"
            f"{' and biases' if cfg_json.get('mlp_bias') else ''} is not supported (specjax's "
            "is SwiGLU without biases)"
        )
    missing = [k for k in _REQUIRED_KEYS if k not in cfg_json]
    if missing:
        raise ValueError(f"{where}: config.json lacks {missing}: is it a Llama-family config?")
    n_heads = cfg_json["num_attention_heads"]
    d_model = cfg_json["hidden_size"]
    rope_theta = cfg_json.get("rope_theta")
    if rope_theta is None:  # newer transformers keep it under rope_parameters
        rope_theta = (cfg_json.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return ModelConfig(
        vocab_size=cfg_json["vocab_size"],
        d_model=d_model,
        n_layers=cfg_json["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=cfg_json.get("num_key_value_heads") or n_heads,
        head_dim=cfg_json.get("head_dim") or d_model // n_heads,
        ffn_dim=cfg_json["intermediate_size"],
        norm_eps=cfg_json.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta),
        rope_layout="half",
        tie_embeddings=bool(cfg_json.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(cfg_json.get("attention_bias", False)),
        max_seq_len=_context_length(cfg_json),
    )


def _context_length(cfg_json: dict) -> int:
    """max_position_embeddings, capped at the sliding window where one applies: up to the
    window, attention over the whole context is the same as the window's, and past it specjax
    would attend where the model does not."""
    length = cfg_json.get("max_position_embeddings", 2048)
    window = cfg_json.get("sliding_window")
    if window and cfg_json.get("use_sliding_window", True) is not False:
        length = min(length, int(window))
    return length


def check_all_read(where: str, names, cfg: ModelConfig) -> None:
    """ValueError naming the tensors of a checkpoint that the Llama layout would not read (an
    output-projection bias, a model of another layout): loading without them would compute
    something else. Names without their "model." prefix."""
    read = {"embed_tokens.weight", "norm.weight", "lm_head.weight"}  # lm_head: tied copies too
    for hf_name, name in _LAYER_NAMES.items():
        if not (name.startswith("b") and not cfg.qkv_bias):
            read.update(f"layers.{i}.{hf_name}" for i in range(cfg.n_layers))
    unread = sorted(n for n in set(names) - read if not n.endswith("rotary_emb.inv_freq"))
    if unread:
        more = f" and {len(unread) - 3} more" if len(unread) > 3 else ""
        raise ValueError(
            f"{where}: tensors the Llama layout does not use ({unread[:3]}{more}): this "
            "architecture variant is not supported"
        )


class LazyTensor:
    """A canonical weight left in its safetensors file(s): `shape`, and numpy-style indexing that
    reads only the requested slice (per layer for stacked [L, ...] weights, transposed from
    Hugging Face's [out, in] when `transpose`). What a sharded load hands to
    jax.make_array_from_callback, so each device's shard is read on its own."""

    def __init__(self, parts: list[tuple[Path, str]], shape: tuple, *, transpose, stacked):
        self.parts, self.shape = parts, tuple(shape)
        self.transpose, self.stacked = transpose, stacked

    def _read(self, part: tuple[Path, str], index: tuple) -> np.ndarray:
        from safetensors import safe_open

        file, name = part
        stored = index[::-1] if self.transpose else index
        with safe_open(str(file), framework="flax") as st:
            x = np.asarray(st.get_slice(name)[stored], np.float32)
        return x.T if self.transpose else x

    def __getitem__(self, index) -> np.ndarray:
        index = index if isinstance(index, tuple) else (index,)
        index = index + (slice(None),) * (len(self.shape) - len(index))
        if not self.stacked:
            return self._read(self.parts[0], index)
        layers = range(self.shape[0])[index[0]]
        return np.stack([self._read(self.parts[i], index[1:]) for i in layers])


def _lazy_weights(path: Path, cfg: ModelConfig, files: list[Path]) -> dict[str, LazyTensor]:
    """Canonical weights as LazyTensors: only the safetensors headers are read here."""
    from safetensors import safe_open

    where = {}
    for f in files:
        with safe_open(str(f), framework="flax") as st:
            for name in st.keys():
                where[name.removeprefix("model.")] = (
                    f,
                    name,
                    tuple(st.get_slice(name).get_shape()),
                )

    def lazy(names: list[str], transpose: bool, stacked: bool) -> LazyTensor:
        missing = [n for n in names if n not in where]
        if missing:
            raise ValueError(f"{path}: missing tensors {missing[:3]}")
        shape = where[names[0]][2]
        shape = shape[::-1] if transpose else shape
        shape = (len(names), *shape) if stacked else shape
        parts = [where[n][:2] for n in names]
        return LazyTensor(parts, shape, transpose=transpose, stacked=stacked)

    check_all_read(str(path), where, cfg)
    weights = {
        "embed": lazy(["embed_tokens.weight"], False, False),
        "final_norm": lazy(["norm.weight"], False, False),
    }
    if not cfg.tie_embeddings:
        weights["lm_head"] = lazy(["lm_head.weight"], True, False)
    for hf_name, name in _LAYER_NAMES.items():
        if name.startswith("b") and not cfg.qkv_bias:
            continue
        names = [f"layers.{i}.{hf_name}" for i in range(cfg.n_layers)]
        weights[name] = lazy(names, hf_name.endswith("proj.weight"), True)
    return weights


def read_hf_dir(
    path: str | Path, *, lazy: bool = False
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Return (config, canonical weights) from a directory with config.json + *.safetensors.

    lazy: return LazyTensors instead of arrays (nothing but the headers is read until a slice
    is asked for): the sharded load's path, which never holds a whole checkpoint anywhere."""
    from safetensors import safe_open

    path = Path(path)
    cfg = hf_config(json.loads((path / "config.json").read_text()), str(path))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no *.safetensors files next to config.json")
    if lazy:
        return cfg, _lazy_weights(path, cfg, files)
    names = []
    for f in files:  # the headers first: a refused checkpoint costs no tensor read
        with safe_open(str(f), framework="flax") as st:
            names += [name.removeprefix("model.") for name in st.keys()]
    check_all_read(str(path), names, cfg)
    raw = {}
    for f in files:
        with safe_open(str(f), framework="flax") as st:
            for name in st.keys():
                raw[name.removeprefix("model.")] = np.asarray(st.get_tensor(name), np.float32)

    def get(name):
        if name not in raw:
            raise ValueError(f"{path}: missing tensors [{name!r}]")
        return raw[name]

    weights = {"embed": get("embed_tokens.weight"), "final_norm": get("norm.weight")}
    if not cfg.tie_embeddings:
        weights["lm_head"] = get("lm_head.weight").T
    for hf_name, name in _LAYER_NAMES.items():
        if name.startswith("b") and not cfg.qkv_bias:
            continue
        stacked = np.stack([get(f"layers.{i}.{hf_name}") for i in range(cfg.n_layers)])
        weights[name] = stacked.transpose(0, 2, 1) if stacked.ndim == 3 else stacked
    return cfg, weights
