"""specjax: lossless speculative decoding for Llama-family models in JAX.

Public API: load, load_drafter, generate, score, speculative_generate, the drafters and the
config dataclasses.
"""

from specjax.config import TINY, ModelConfig, SamplingConfig, SpecConfig, TreeConfig
from specjax.decode import GenerateOutput, generate, score
from specjax.drafting import LMDrafter
from specjax.feature_drafter import EagleDrafter, HiddenStateDrafter
from specjax.io import Loaded, load
from specjax.models.target import Llama
from specjax.speculative import speculative_generate
from specjax.train.checkpoint import load_drafter

__all__ = [
    "TINY",
    "EagleDrafter",
    "HiddenStateDrafter",
    "GenerateOutput",
    "LMDrafter",
    "Llama",
    "Loaded",
    "ModelConfig",
    "SamplingConfig",
    "SpecConfig",
    "TreeConfig",
    "generate",
    "load",
    "load_drafter",
    "score",
    "speculative_generate",
]
__version__ = "0.1.0"
