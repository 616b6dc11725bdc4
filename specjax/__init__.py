"""specjax: lossless speculative decoding for Llama-family models in JAX.

Public API: load, load_drafter, generate, score, speculative_generate, the drafters (HiSpec: the
three-level early-exit drafter) and the config dataclasses; make_mesh and shard_model put the
target on a ('data', 'model') device mesh; enable_compilation_cache keeps compiled programs on
disk for later processes.
"""

from specjax.api import speculative_generate
from specjax.compile_cache import enable_compilation_cache
from specjax.config import TINY, ModelConfig, SamplingConfig, SpecConfig, TreeConfig
from specjax.decode import GenerateOutput, generate, score
from specjax.drafters import Drafter, EagleDrafter, HiddenStateDrafter, LMDrafter, load_drafter
from specjax.hispec import HiSpec
from specjax.io import Loaded, load
from specjax.memory_maps import watch as _watch_memory_maps
from specjax.models.target import Llama
from specjax.sharding import make_mesh, shard_model
from specjax.verifiers import EarlyExitVerifier, FullVerifier, Verifier

# Warn before XLA:CPU's compiled programs use up the process's memory mappings (a compile past
# vm.max_map_count crashes far from the cause): one check after each compile.
_watch_memory_maps()

__all__ = [
    "EarlyExitVerifier",
    "TINY",
    "Drafter",
    "FullVerifier",
    "Verifier",
    "EagleDrafter",
    "HiddenStateDrafter",
    "HiSpec",
    "GenerateOutput",
    "LMDrafter",
    "Llama",
    "Loaded",
    "ModelConfig",
    "SamplingConfig",
    "SpecConfig",
    "TreeConfig",
    "enable_compilation_cache",
    "generate",
    "load",
    "load_drafter",
    "make_mesh",
    "score",
    "shard_model",
    "speculative_generate",
]
__version__ = "0.1.0"
