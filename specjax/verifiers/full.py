"""FullVerifier: the whole target scores every tree node (standard speculative decoding).

Axis letters: B batch, T prompt tokens, N tree nodes, S cache length, V vocab, M model dim.

State = the target's KVCache [L, B, S, K, D]. verify writes the tree block at [lengths,
lengths + N) with the ancestor mask; commit moves the accepted nodes into place
(cache.commit_path: nothing moves for chains).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from specjax import verify as rules
from specjax.cache import KVCache, commit_path, init_cache
from specjax.config import SamplingConfig, SpecConfig
from specjax.prefill import prefill
from specjax.sampling import apply_sampling
from specjax.sharding import gather_logits
from specjax.tree import Acceptance, DraftTree
from specjax.verifiers.base import Verification


def nonfinite_rows(logits) -> jnp.ndarray:
    """[B] bool: the row's logits [B, ..., V] hold a NaN or an inf."""
    return ~jnp.all(jnp.isfinite(logits), axis=tuple(range(1, logits.ndim)))


class FullVerifier(nnx.Module):
    """The target model alone verifies (no weights of its own)."""

    def prefill(self, target, ids, prompt_lens, cache_len, *, feature_layers, attn_impl):
        cache = init_cache(target.config, ids.shape[0], cache_len)
        return prefill(target, ids, prompt_lens, cache, attn_impl, return_hidden=feature_layers)

    def lengths(self, state: KVCache):
        return state.lengths

    def verify(
        self,
        state: KVCache,
        target,
        tree: DraftTree,
        tree_mask,
        keys,
        *,
        rule: str,
        config: SpecConfig,
        sampling: SamplingConfig,
        feature_layers: tuple[int, ...],
    ) -> Verification:
        out = target(
            tree.tokens,
            positions=state.lengths[:, None] + tree.depth,
            cache=state,
            tree_mask=tree_mask,
            return_hidden=feature_layers,
            attn_impl=config.attn_impl,
        )
        # Greedy reads only the argmax: no sampling transform over the vocabulary. On a mesh the
        # vocabulary is gathered first, so the rules run as on one device.
        logits = gather_logits(out.logits)
        p = logits if rule == "greedy" else apply_sampling(logits, sampling)
        acceptance = rules.RULES[rule](tree, p, keys, config.tree.max_depth)
        return Verification(
            acceptance=acceptance,
            state=out.cache,
            hidden=out.hidden,
            nonfinite=nonfinite_rows(out.logits),
        )

    def commit(self, state: KVCache, acceptance: Acceptance, advance, *, config: SpecConfig):
        return commit_path(
            state,
            acceptance.path,
            advance,
            num_nodes=config.tree.num_nodes,
            is_chain=config.tree.is_chain,
        )
