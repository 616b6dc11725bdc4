"""Frozen, hashable configuration dataclasses (passed to jitted functions as static arguments).

Axis letters used throughout specjax: B batch, T query tokens in this call, S cache length,
N tree nodes, H query heads, K kv heads, D head dim, M model dim, F ffn dim, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

RopeLayout = Literal["interleaved", "half"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder.

    rope_layout: "interleaved" rotates (even, odd) pairs of each head (llama2.c, GGUF as stored by
    llama.cpp); "half" rotates (i, i + D/2) pairs (Hugging Face). The two are the same model up to a
    permutation of the Q/K output rows, so each reader keeps the layout its file was written in.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_layout: RopeLayout = "half"
    tie_embeddings: bool = True
    qkv_bias: bool = False
    max_seq_len: int = 2048
    dtype: str = "float32"

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.rope_layout not in ("interleaved", "half"):
            raise ValueError(
                f"rope_layout must be 'interleaved' or 'half', got {self.rope_layout!r}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")


# A tiny random model for unit tests (never for measurements).
TINY = ModelConfig(
    vocab_size=16,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    ffn_dim=64,
    max_seq_len=128,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """Sampling transform applied identically to target and drafter.

    temperature == 0 means greedy (argmax). top_k == 0 disables top-k; top_p == 1 disables top-p.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
