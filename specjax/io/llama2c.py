"""Reader for llama2.c model files: legacy (7-int header) and version 1 ("ak42" magic) fp32.

llama2.c stores matrices as [out, in] row-major and applies RoPE to interleaved (even, odd) pairs,
so weights are transposed to specjax's [in, out] and the config keeps rope_layout="interleaved".
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from specjax.config import ModelConfig

MAGIC_V1 = 0x616B3432  # "ak42"


def _config(dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab_size,
        d_model=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=dim // n_heads,
        ffn_dim=hidden_dim,
        norm_eps=1e-5,
        rope_theta=10000.0,
        rope_layout="interleaved",
        tie_embeddings=True,
        max_seq_len=seq_len,
    )


def read_llama2c(path: str | Path) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Return (config, canonical weights) from a llama2.c .bin checkpoint."""
    path = Path(path)
    raw = path.read_bytes()
    if len(raw) < 28:
        raise ValueError(f"{path}: too small to be a llama2.c checkpoint ({len(raw)} bytes)")
    magic = struct.unpack_from("<I", raw, 0)[0]
    if magic == MAGIC_V1:
        version = struct.unpack_from("<i", raw, 4)[0]
        if version != 1:
            raise ValueError(
                f"{path}: llama2.c format version {version} is not supported "
                "(only legacy and version 1 fp32 files are; re-export with version 1)"
            )
        header = struct.unpack_from("<7i", raw, 8)
        shared = bool(raw[36])
        offset = 256
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = header
    else:
        header = struct.unpack_from("<7i", raw, 0)
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = header
        shared = vocab > 0
        vocab = abs(vocab)
        offset = 28
    if min(dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len) <= 0 or dim % n_heads:
        raise ValueError(f"{path}: not a llama2.c checkpoint (implausible header {header})")
    cfg = _config(dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len)
    cfg = ModelConfig(**{**cfg.__dict__, "tie_embeddings": shared})
    hd, kd, L = n_heads * cfg.head_dim, n_kv * cfg.head_dim, n_layers

    if magic == MAGIC_V1:
        layout = [
            ("attn_norm", (L, dim)),
            ("mlp_norm", (L, dim)),
            ("final_norm", (dim,)),
            ("embed", (vocab, dim)),
            ("wq", (L, hd, dim)),
            ("wk", (L, kd, dim)),
            ("wv", (L, kd, dim)),
            ("wo", (L, dim, hd)),
            ("w_gate", (L, hidden, dim)),
            ("w_down", (L, dim, hidden)),
            ("w_up", (L, hidden, dim)),
        ]
        tail = []
    else:
        layout = [
            ("embed", (vocab, dim)),
            ("attn_norm", (L, dim)),
            ("wq", (L, hd, dim)),
            ("wk", (L, kd, dim)),
            ("wv", (L, kd, dim)),
            ("wo", (L, dim, hd)),
            ("mlp_norm", (L, dim)),
            ("w_gate", (L, hidden, dim)),
            ("w_down", (L, dim, hidden)),
            ("w_up", (L, hidden, dim)),
            ("final_norm", (dim,)),
        ]
        # The legacy format stores the RoPE tables (unused: recomputed) after the weights.
        tail = [("freq_cis", (seq_len, cfg.head_dim))]
    if not shared:
        tail.append(("lm_head", (vocab, dim)))
    n_floats = sum(int(np.prod(s)) for _, s in layout + tail)
    expected_bytes = offset + 4 * n_floats
    if len(raw) != expected_bytes:
        raise ValueError(
            f"{path}: header {header} implies {expected_bytes} bytes but the file has {len(raw)}: "
            "shape mismatch between header and data (truncated or not a llama2.c fp32 file)"
        )
    data = np.frombuffer(raw, dtype="<f4", offset=offset)
    weights, pos = {}, 0
    for name, shape in layout + tail:
        size = int(np.prod(shape))
        weights[name] = data[pos : pos + size].reshape(shape)
        pos += size
    weights.pop("freq_cis", None)
    # [out, in] -> [in, out] for the projections.
    for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
        weights[name] = np.ascontiguousarray(weights[name].transpose(0, 2, 1))
    if "lm_head" in weights:
        weights["lm_head"] = np.ascontiguousarray(weights["lm_head"].T)
    return cfg, weights
