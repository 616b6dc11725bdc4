"""specjax: lossless speculative decoding for Llama-family models in JAX.

Public API: load, load_drafter, generate, score, speculative_generate, the drafters and the
config dataclasses.
"""

from specjax.api import speculative_generate
from specjax.config import TINY, ModelConfig, SamplingConfig, SpecConfig, TreeConfig
from specjax.decode import GenerateOutput, generate, score
from specjax.drafters import Drafter, EagleDrafter, HiddenStateDrafter, LMDrafter, load_drafter
from specjax.io import Loaded, load
from specjax.models.target import Llama
from specjax.verifiers import EarlyExitVerifier, FullVerifier, Verifier

__all__ = [
    "EarlyExitVerifier",
    "TINY",
    "Drafter",
    "FullVerifier",
    "Verifier",
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
