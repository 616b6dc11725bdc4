"""The Verifier protocol: what the speculative engine asks of the target's side of a step.

Axis letters: B batch, T prompt tokens, N tree nodes, S cache length, V vocab, M model dim.

A verifier owns the target's cache (its state) and the acceptance rule. It is an `nnx.Module`
(split outside jit, merged inside, like the drafter) so verifiers with weights of their own (an
early-exit head) fit the same seam as the full target. One step calls `verify` (forward over the
draft tree + rule) and then `commit` (keep the accepted path), with the engine deciding in between
how far each row advances (EOS and the token budget are the engine's business).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import flax.struct
import jax

from specjax.config import SamplingConfig, SpecConfig
from specjax.tree import Acceptance, DraftTree


@flax.struct.dataclass
class Verification:
    """What verify returns.

    acceptance: the rule's Acceptance (path [B, P], n_accepted [B], next_token [B]).
    state: the verifier state with the tree block written as scratch (not yet committed).
    hidden: {i: [B, N, M]} the target hidden states the drafter asked for (feature_layers).
    nonfinite: [B] bool, the target produced NaN/inf logits for the row in this step.
    """

    acceptance: Acceptance
    state: object
    hidden: dict
    nonfinite: jax.Array


@runtime_checkable
class Verifier(Protocol):
    def prefill(
        self,
        target,
        ids: jax.Array,
        prompt_lens: jax.Array,
        cache_len: int,
        *,
        feature_layers: tuple[int, ...],
        attn_impl: str,
    ) -> tuple[jax.Array, object, dict]:
        """Run the prompts ids [B, T] (right-padded, prompt_lens [B]) into a fresh state with
        cache_len positions. Returns (logits at each row's last prompt token [B, V], state,
        {i: [B, T, M]} hidden states for feature_layers)."""

    def lengths(self, state) -> jax.Array:
        """[B] committed positions per row."""

    def verify(
        self,
        state,
        target,
        tree: DraftTree,
        tree_mask: jax.Array,
        keys: jax.Array,
        *,
        rule: str,
        config: SpecConfig,
        sampling: SamplingConfig,
        feature_layers: tuple[int, ...],
    ) -> Verification:
        """Score the tree (node 0 = the pending root at position lengths; tree_mask [B, N, N]
        its ancestor mask) and accept a path with `rule` (a name in specjax.verify.RULES);
        keys [B] the rows' keys for this step."""

    def commit(self, state, acceptance: Acceptance, advance: jax.Array, *, config: SpecConfig):
        """Keep the accepted path and advance each row by advance [B] (0 for finished rows)."""
