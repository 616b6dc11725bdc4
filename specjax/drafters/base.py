"""The Drafter protocol the speculative engine calls.

Axis letters: B batch, N tree nodes, S cache length, T prompt tokens, M model dim.

A drafter is an `nnx.Module` (split outside jit, merged inside, like the target) whose methods
are all traced inside the engine's `lax.while_loop`. The engine's convention: the target cache
holds positions [0, lengths); the root (the last emitted token) is pending at position `lengths`;
the verified tree block is written at [lengths, lengths + N).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import flax.struct
import jax

from specjax.config import SamplingConfig, SpecConfig
from specjax.tree import Acceptance, DraftTree


@flax.struct.dataclass
class RootContext:
    """What a drafter may know about each row when it proposes.

    root [B]: pending token at position lengths; prev [B]: committed token at lengths - 1;
    lengths [B]: committed positions in the target cache.
    """

    root: jax.Array
    prev: jax.Array
    lengths: jax.Array


@runtime_checkable
class Drafter(Protocol):
    """What the engine needs from a drafter.

    feature_layers: indices of the target hidden states the drafter reads (hidden[i] = the
        residual stream entering layer i; hidden[L] = the last layer's output before the final
        norm); () for drafters that read none. The engine computes exactly these during the
        prefill and every verification and passes them as `target_hidden` {i: [B, T or N, M]}.
    samples_children: False for drafters whose children are their top-k (sampled decoding then
        verifies with the one-hot tree rule).
    dynamic_trees: whether it chooses the topology of a TreeConfig.dynamic budget.
    text_chains (optional, False when absent): whether it adds TreeConfig.text_chain's branch
        drafted from the row's own text (its commit then reads accepted tokens from it too).
    An optional `stats(state) -> dict` of per-row [B] statistics is merged into the output's.
    """

    feature_layers: tuple[int, ...]
    samples_children: bool
    dynamic_trees: bool

    def check_compatible(self, target) -> None:
        """Raise ValueError (before anything is compiled) if it cannot draft for `target`."""

    def init_state(
        self,
        target,
        prompt_ids: jax.Array,
        prompt_lens: jax.Array,
        cache_len: int,
        *,
        config: SpecConfig,
        target_hidden: dict,
    ):
        """State after the target's prefill; the committed sequence is
        prompt_ids[b, :prompt_lens[b]] ([B, T], [B]); target_hidden {i: [B, T, M]}."""

    def propose(
        self,
        state,
        target,
        ctx: RootContext,
        keys: jax.Array,
        *,
        config: SpecConfig,
        sampling: SamplingConfig,
    ) -> tuple[DraftTree, object]:
        """A tree within config.tree's budget whose node 0 is ctx.root; keys [B] per row."""

    def commit(
        self,
        state,
        acceptance: Acceptance,
        advance: jax.Array,
        *,
        live: jax.Array,
        config: SpecConfig,
        target,
        target_hidden: dict,
    ):
        """Update after verification: advance [B] committed positions (0 for finished rows and
        for rows finishing in this step); live [B] rows that were live in this step (count
        their statistics); target_hidden {i: [B, N, M]} at the verified tree's nodes."""
