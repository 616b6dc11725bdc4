"""Early-exit heads (HiSpec): a light trained block that turns the residual stream entering layer
E of the target into next-token logits through the target's own final norm and LM head.

Axis letters: B batch, T tokens, M model dim, U exit vocabulary.

The target is not early-exit trained: its final norm and LM head read straight off the layer-E
residual agree with the last layer on few tokens (LayerSkip reports 1.9% acceptance for a model
without early-exit training; kind "identity" below measures it for ours), so each exit gets a
small residual block trained by distillation to the final distribution
(specjax.train.exit_heads). Kinds:

- "identity": no block, the untrained exit (the baseline the trained kinds are measured against);
- "linear":   h = x + W rms(x), W [M, M] starting at zero (so training starts from "identity");
- "mlp":      h = x + down(silu(gate rms(x)) * up rms(x)), width M, down starting at zero.

Neither reads other positions, so an exit needs no cache of its own: the target's K/V for layers
[0, E) are all it leaves behind. The readout is over an exit vocabulary [U] of target ids (the
most frequent answer tokens, as the feature drafters' draft vocabulary): q is zero outside it,
which keeps an exit exact as a drafter and costs U/V of the full LM head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.drafter import TargetParts, target_parts
from specjax.models.layers import rms_norm

EXIT_KINDS = ("identity", "linear", "mlp")


class ExitVocab(nnx.Variable):
    """Target ids of the exit vocabulary [U] (saved with the head, not trained)."""


class ExitHead(nnx.Module):
    """The trained block of one exit at layer `layer` (see the module docstring for kinds)."""

    def __init__(
        self,
        d_model: int,
        *,
        layer: int,
        kind: str,
        vocab: np.ndarray,
        eps: float,
        rngs: nnx.Rngs,
    ):
        if kind not in EXIT_KINDS:
            raise ValueError(f"unknown exit head kind {kind!r}; choose from {EXIT_KINDS}")
        self.layer, self.kind, self.eps = int(layer), kind, float(eps)
        self.vocab = ExitVocab(jnp.asarray(vocab, jnp.int32))
        init = nnx.initializers.normal(d_model**-0.5)
        if kind != "identity":
            self.norm = nnx.Param(jnp.ones((d_model,), jnp.float32))
        if kind == "linear":
            self.w = nnx.Param(jnp.zeros((d_model, d_model), jnp.float32))
        elif kind == "mlp":
            self.gate = nnx.Param(init(rngs.params(), (d_model, d_model), jnp.float32))
            self.up = nnx.Param(init(rngs.params(), (d_model, d_model), jnp.float32))
            self.down = nnx.Param(jnp.zeros((d_model, d_model), jnp.float32))

    def transform(self, x: jax.Array) -> jax.Array:
        """[..., M] residual stream entering layer E -> [..., M] its stand-in for the last
        layer's output (before the final norm)."""
        if self.kind == "identity":
            return x
        n = rms_norm(x, self.norm[...], self.eps)
        if self.kind == "linear":
            return x + n @ self.w[...]
        return x + (jax.nn.silu(n @ self.gate[...]) * (n @ self.up[...])) @ self.down[...]

    def __call__(self, x: jax.Array, parts: TargetParts) -> jax.Array:
        """Logits [..., U] over the exit vocabulary; parts: the target's final norm and LM head
        restricted to self.vocab (specjax.models.drafter.target_parts)."""
        h = rms_norm(self.transform(x), parts.final_norm, self.eps)
        return h.astype(jnp.float32) @ parts.head_u.astype(jnp.float32)


class ExitReadout(nnx.Variable):
    """The target's final norm and LM head columns of an exit vocabulary (not trained)."""


# What to do when exit heads do not fit the target they are given.
OTHER_TARGET = (
    "load the exit heads for this target (specjax.load_drafter(dir, target)) or train them for "
    "it (experiments/train_exit_heads.py)"
)


class ExitLogits(nnx.Module):
    """An exit head with its readout taken from the target once (the LM head columns of its
    vocabulary), returning logits over the target's whole vocabulary: -inf outside the exit
    vocabulary, so q is zero there. What the early-exit verifier and the exit drafter call."""

    def __init__(self, head: ExitHead, target):
        cfg = target.config
        if not 0 < head.layer < cfg.n_layers:
            raise ValueError(
                f"exit layer {head.layer} must lie in [1, {cfg.n_layers - 1}]: {OTHER_TARGET}"
            )
        vocab = np.asarray(head.vocab[...])
        if vocab.size == 0 or vocab.min() < 0 or vocab.max() >= cfg.vocab_size:
            raise ValueError(
                f"the exit vocabulary holds ids outside the target's vocabulary: {OTHER_TARGET}"
            )
        parts = target_parts(target, jnp.asarray(vocab))
        self.head, self.vocab_size = head, cfg.vocab_size
        self.final_norm = ExitReadout(parts.final_norm)
        self.head_u = ExitReadout(parts.head_u)

    @property
    def layer(self) -> int:
        return self.head.layer

    def check_compatible(self, target) -> None:
        """ValueError, saying what to do, when these exits cannot read `target`'s layers."""
        cfg = target.config
        fix = OTHER_TARGET
        if not self.layer < cfg.n_layers:
            raise ValueError(
                f"exit layer {self.layer} lies past this target's {cfg.n_layers} layers: {fix}"
            )
        width = self.final_norm[...].shape[-1]
        if (self.vocab_size, width) != (cfg.vocab_size, cfg.d_model):
            raise ValueError(
                f"these exit heads read a target of vocabulary {self.vocab_size} and width "
                f"{width}, this target has {cfg.vocab_size} and {cfg.d_model}: {fix}"
            )

    def __call__(self, x: jax.Array) -> jax.Array:
        """[..., M] residual stream entering the exit layer -> [..., V] float32 logits."""
        parts = TargetParts(embed=None, final_norm=self.final_norm[...], head_u=self.head_u[...])
        logits_u = self.head(x, parts)
        full = jnp.full(logits_u.shape[:-1] + (self.vocab_size,), -jnp.inf, jnp.float32)
        return full.at[..., self.head.vocab[...]].set(logits_u)
