"""Language-model drafters: a separate small draft model, or self-drafting with the target's
first layers (standard speculative decoding).

Axis letters: B batch, N tree nodes, W frontier nodes, S cache length, V vocab, T prompt tokens.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax import token_choice
from specjax.cache import KVCache, commit_path, init_cache
from specjax.config import SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters.base import RootContext
from specjax.sampling import apply_sampling
from specjax.tree import (
    NODE_STATS,
    Acceptance,
    DraftTree,
    causal_mask,
    children_stats,
    static_ancestor_mask,
)


def tree_constants(tree_cfg: TreeConfig, batch: int) -> tuple[jax.Array, jax.Array]:
    """parents [B, N] and depth [B, N] of the static topology."""
    parents = jnp.asarray(tree_cfg.parents(), jnp.int32)
    depth = jnp.asarray(tree_cfg.depths(), jnp.int32)
    n = tree_cfg.num_nodes
    return jnp.broadcast_to(parents, (batch, n)), jnp.broadcast_to(depth, (batch, n))


def choose_children(
    logits: jax.Array, n_children: int, sample: bool, sampling: SamplingConfig, keys: jax.Array
):
    """Children of W frontier nodes from draft logits [B, W, V]; keys [B] per-row PRNG keys.

    Returns (tokens [B, W, c], prob [B, W, c] = q(token), q [B, W, V]). Sampled children are drawn
    i.i.d. from q (with replacement); otherwise they are the top-c tokens of q (deterministic).
    """
    if sampling.greedy:
        q = jax.nn.one_hot(token_choice.argmax(logits), logits.shape[-1], dtype=jnp.float32)
        # Top-c of the logits so a tree still has distinct candidates under greedy decoding.
        _, tokens = jax.lax.top_k(logits, n_children)
    else:
        q = apply_sampling(logits, sampling)
        if sample:
            keys = jax.vmap(lambda k: jax.random.split(k, logits.shape[1]))(keys)  # [B, W]
            tokens = jax.vmap(
                jax.vmap(lambda k, p: jax.random.categorical(k, jnp.log(p), shape=(n_children,)))
            )(keys, q)
        else:
            _, tokens = jax.lax.top_k(q, n_children)
    prob = jnp.take_along_axis(q, tokens, axis=-1)
    return tokens.astype(jnp.int32), prob, q


@flax.struct.dataclass
class LMDrafterState:
    cache: KVCache  # the drafter's own cache: [Ld, B, S, K, D], lengths = target lengths


class LMDrafter(nnx.Module):
    """Standard speculative decoding with a language model as drafter.

    Either a separate small LM with the target's vocabulary (`LMDrafter(draft_model)`, e.g.
    llama2xs-279K drafting for stories260K), or self-drafting with the target's first `n_layers`
    layers and its own LM head (`LMDrafter.self_draft(n_layers)`), or with the target's layers
    below a trained exit head and that head (`LMDrafter.self_draft_exit(head, target)`: HiSpec's
    draft exit, specjax.models.exit_head).

    Drafting a tree: the topology is static (TreeConfig.branching); at each depth the drafter runs
    on the whole block [prev, root, nodes...] with the ancestor mask and expands the frontier with
    children chosen from its distribution (top-c or sampled). Running the full block at every depth
    recomputes shallower nodes, which keeps every call one fixed shape; for the small drafters this
    library targets the extra FLOPs are cheaper than extra shapes. `prev` (the last committed token)
    is refed so the drafter's cache never has a hole after a fully accepted draft.
    """

    feature_layers: tuple[int, ...] = ()  # reads no target hidden states
    samples_children = True
    dynamic_trees = False  # drafts the static topology of TreeConfig.branching

    def __init__(self, draft_model=None, *, n_layers: int | None = None, exit_logits=None):
        self.draft_model = draft_model
        self.self_draft_layers = n_layers
        self.exit_logits = exit_logits  # ExitLogits, or None: the target's own final norm + head
        # A trained PreVerifier (specjax.models.pre_verifier) may be set here later; declared as
        # data so that a module can replace the None.
        self.pre_verifier = nnx.data(None)

    @classmethod
    def self_draft(cls, n_layers: int) -> LMDrafter:
        if n_layers < 1:
            raise ValueError(f"self-drafting needs at least one layer, got {n_layers}")
        return cls(None, n_layers=n_layers)

    @classmethod
    def self_draft_exit(cls, head, target) -> LMDrafter:
        """Self-drafting with the target's layers [0, head.layer) and the trained exit head
        (specjax.models.exit_head.ExitHead of `target`)."""
        from specjax.models.exit_head import ExitLogits

        return cls(None, n_layers=head.layer, exit_logits=ExitLogits(head, target))

    def check_compatible(self, target) -> None:
        """Raise ValueError if this drafter cannot draft for `target`."""
        if self.draft_model is None:
            if self.self_draft_layers > target.config.n_layers:
                raise ValueError(
                    f"self-draft uses {self.self_draft_layers} layers but the target "
                    f"has only {target.config.n_layers}"
                )
            return
        dv, tv = self.draft_model.config.vocab_size, target.config.vocab_size
        if dv != tv:
            raise ValueError(
                f"vocab mismatch between target ({tv}) and drafter ({dv}): a draft "
                "model must share the target's tokenizer"
            )

    def _model_and_layers(self, target):
        if self.draft_model is None:
            return target, self.self_draft_layers
        return self.draft_model, self.draft_model.config.n_layers

    def _forward(self, target, tokens, positions, cache, tree_mask, attn_impl, rows=None):
        """The drafter on a block written at cache.lengths; logits [B, R, V] of block rows
        rows = (start, count) only (the frontier: the LM head is the costly part of a small
        drafter), or None for no logits."""
        model, n = self._model_and_layers(target)
        out = model(
            tokens,
            attn_impl=attn_impl,
            positions=positions,
            cache=cache,
            tree_mask=tree_mask,
            layer_range=(0, n),
            return_hidden=(n,),
            compute_logits=False,
        )
        if rows is None:
            return None, out.cache
        start, count = rows
        frontier = out.hidden[n][:, start : start + count]
        if self.exit_logits is not None:
            return self.exit_logits(frontier), out.cache
        return model.head(frontier), out.cache

    def init_state(
        self, target, prompt_ids, prompt_lens, cache_len, *, config: SpecConfig, target_hidden=None
    ) -> LMDrafterState:
        del target_hidden
        model, n = self._model_and_layers(target)
        b, t = prompt_ids.shape
        cache = init_cache(dataclasses.replace(model.config, n_layers=n), b, cache_len)
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        _, cache = self._forward(
            target, prompt_ids, positions, cache, causal_mask(b, t), config.attn_impl
        )
        return LMDrafterState(cache=cache.replace(lengths=prompt_lens))

    def propose(
        self,
        state: LMDrafterState,
        target,
        ctx: RootContext,
        keys,
        *,
        config: SpecConfig,
        sampling: SamplingConfig,
    ) -> tuple[DraftTree, LMDrafterState]:
        tree_cfg = config.tree
        sample_children = config.children_sampled(sampling)
        b = ctx.root.shape[0]
        n = tree_cfg.num_nodes
        parents, depth = tree_constants(tree_cfg, b)
        # Block = [prev, node 0 = root, nodes 1..N-1], written from lengths - 1.
        anc = jnp.asarray(static_ancestor_mask(tree_cfg.parents()))
        block_mask = jnp.ones((n + 1, n + 1), bool).at[1:, 1:].set(anc).at[0, 1:].set(False)
        block_mask = jnp.broadcast_to(block_mask, (b, n + 1, n + 1))
        positions = jnp.concatenate(
            [(ctx.lengths - 1)[:, None], ctx.lengths[:, None] + depth], axis=1
        )
        cache = state.cache.replace(lengths=ctx.lengths - 1)
        tokens = jnp.zeros((b, n), jnp.int32).at[:, 0].set(ctx.root)
        prob = jnp.ones((b, n), jnp.float32)
        vocab = target.config.vocab_size
        dist = jnp.zeros((b, n, vocab), jnp.float32)
        cum = jnp.zeros((b, n), jnp.float32)  # cumulative draft log q of each node's path
        stats = jnp.zeros((b, n, len(NODE_STATS)), jnp.float32)
        keys = jax.vmap(lambda k: jax.random.split(k, tree_cfg.max_depth))(keys)  # [B, D]
        for d, c in enumerate(tree_cfg.branching):
            block = jnp.concatenate([ctx.prev[:, None], tokens], axis=1)
            lo, width = tree_cfg.level_start(d), tree_cfg.level_sizes[d]
            frontier_logits, cache = self._forward(  # [B, W, V]
                target, block, positions, cache, block_mask, config.attn_impl, rows=(1 + lo, width)
            )
            child_tokens, child_prob, q = choose_children(
                frontier_logits, c, sample_children, sampling, keys[:, d]
            )
            start = tree_cfg.level_start(d + 1)
            tokens = tokens.at[:, start : start + width * c].set(child_tokens.reshape(b, -1))
            prob = prob.at[:, start : start + width * c].set(child_prob.reshape(b, -1))
            dist = dist.at[:, lo : lo + width].set(q)
            # The pre-verifier's statistics, from the untempered distribution when greedy (q is
            # one-hot there).
            logq = jnp.log(q) if not sampling.greedy else jax.nn.log_softmax(frontier_logits)
            child_logq = jnp.take_along_axis(logq, child_tokens, axis=-1)  # [B, W, c]
            level_stats = children_stats(child_logq, cum[:, lo : lo + width], logq, d + 1)
            stats = stats.at[:, start : start + width * c].set(
                level_stats.reshape(b, width * c, -1)
            )
            cum = cum.at[:, start : start + width * c].set(level_stats[..., 1].reshape(b, -1))
        tree = DraftTree(
            tokens=tokens,
            parents=parents,
            depth=depth,
            valid=jnp.ones((b, n), bool),
            draft_prob=prob,
            draft_dist=dist,
            node_stats=stats,
        )
        # The last forward wrote every node's K/V except the deepest level's; commit moves the
        # accepted ones into place (a fully accepted deepest node is refed next step as `prev`).
        return tree, LMDrafterState(cache=cache.replace(lengths=ctx.lengths))

    def commit(
        self,
        state: LMDrafterState,
        acceptance: Acceptance,
        advance,
        *,
        live=None,
        config: SpecConfig,
        target=None,
        target_hidden=None,
    ) -> LMDrafterState:
        del live, target, target_hidden
        # The drafter's block mirrors the target's: node i at lengths + i.
        cache = commit_path(
            state.cache,
            acceptance.path,
            advance,
            num_nodes=config.tree.num_nodes,
            is_chain=config.tree.is_chain,
        )
        return LMDrafterState(cache=cache)
