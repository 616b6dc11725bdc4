"""specjax: lossless speculative decoding for Llama-family models in JAX.

Public API: load, generate, score, speculative_generate (and the config dataclasses).
"""

from specjax.config import TINY, ModelConfig, SamplingConfig
from specjax.decode import GenerateOutput, generate, score
from specjax.io import Loaded, load
from specjax.models.target import Llama

__all__ = [
    "TINY",
    "GenerateOutput",
    "Llama",
    "Loaded",
    "ModelConfig",
    "SamplingConfig",
    "generate",
    "load",
    "score",
]
__version__ = "0.1.0"
