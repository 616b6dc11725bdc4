"""Random test models whose greedy output varies (shared by the test files and mesh_checks.py).

At initialisation scale a random Llama's layers barely change the residual stream: its greedy
output repeats one token, every draft is accepted and an untrained exit agrees with the last
layer, so a test on it cannot see a rejection or a misplaced position. Scaling every weight
matrix by 3 makes the next-token distributions far from uniform.
"""

import jax
from flax import nnx

import specjax
from specjax.config import ModelConfig


def lively_llama(cfg: ModelConfig, seed: int = 0, scale: float = 3.0) -> specjax.Llama:
    """specjax.Llama(cfg) from nnx.Rngs(seed) with every weight matrix (ndim >= 2) x scale; norm
    scales and other vectors unchanged."""
    graph, state = nnx.split(specjax.Llama(cfg, rngs=nnx.Rngs(seed)))
    return nnx.merge(graph, jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x, state))
