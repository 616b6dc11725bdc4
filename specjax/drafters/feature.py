"""The feature drafters behind the Drafter protocol: HiddenStateDrafter (mdc) and EagleDrafter.

Axis letters: B batch, N tree nodes, P = depth + 1 path slots, S cache length, W frontier slots,
M model dim, K kv heads, D head dim (in shapes of the chain: Dp = the drafter's tree depth), U
draft vocab.

Both read the target's last hidden state (the engine passes it from the prefill and from every
verification) and draft EAGLE-2 style dynamic trees with static shapes (specjax.tree.expand_topk):
the TreeConfig is read as a budget (TreeConfig.dynamic(nodes, depth, topk), or a static
config's node count, depth and widest branching) -- N = tree.drafter_nodes nodes, depth =
tree.drafter_depth, and top-k as both the frontier width and the children per frontier node.
Children are the top-k of the drafter (deterministic), so sampled decoding uses the one-hot tree
rule. With TreeConfig.text_chain = K the tree gets one more branch of the root, K nodes drafted
from the row's own text (specjax.drafters.text_chain), numbered after the drafter's: the step
keeps whichever branch the target accepts further, and the commit reads the accepted tokens
from either.

The drafter keeps its own one-layer KV cache in step with the target's: after every verification
`commit` recomputes the accepted path's entries from the *target's* hidden states, so the context
the drafter attends to is never its own guess.

Draft reuse (HiddenStateDrafter, on by default): the mdc chain h_1..h_depth predicts hidden states
at positions lengths .. lengths + depth - 1 without consuming any draft token. After the target
accepts a tokens, the new root sits at old depth a + 1; the chain slots of old depths a + 2 ..
depth are predictions for exactly the new positions, uncontaminated by the rejected token, so the
next tree injects the corrected token into them instead of recomputing them: only the root's
slot (where the target's verified hidden state enters) and the missing deeper slots are computed,
the latter continuing the recurrence from the last reused state. A step where
every row can reuse a slot skips that layer call (lax.cond); stats count, per row, the draft nodes
whose distribution came from a reused hidden state and the chain layer calls made.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax.attention import attend, cpu_kernel_ok, resolve_impl
from specjax.cache import KVCache, init_cache
from specjax.config import SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters.base import RootContext
from specjax.drafters.text_chain import (
    LONGEST,
    RowText,
    chain_node_logp,
    commit_row_text,
    draft_text_chain,
    init_row_text,
    shared_prefix,
)
from specjax.kernels import cpu_panels
from specjax.models.drafter import DrafterNet, TargetParts, one_layer_weights, shift_right
from specjax.models.layers import decoder_layer, rope_angles, write_block
from specjax.sampling import apply_sampling
from specjax.tree import NODE_STATS, Acceptance, DraftTree, causal_mask, expand_topk


class TargetHead(nnx.Variable):
    """The target's LM head restricted to the draft vocabulary [M, U]: a cached slice of the
    target's weights, rebuilt from the target at load time (never saved with the drafter)."""


@flax.struct.dataclass
class FeatureDrafterState:
    """cache: the drafter's one-layer KV cache [1, B, S, K, D], lengths = the target's (S the
    target's cache length plus the room its tree levels' keys take, tree_keys_in_cache).
    last_feature [B, M]: the feature the drafter read at position lengths - 1 (the target's
    last hidden state, with the fused lower layers when the drafter fuses some); last_tokens
    [B, A]: the tokens at positions lengths - A .. lengths - 1 (the root's parent last; -1
    before the sequence's start), the ancestors an mdc readout injects (A = its path_tokens - 1,
    at least 1).
    tree_tokens [B, N]: the last proposed tree, its text chain included (commit reads the
    accepted tokens from it). row_text: the committed text (empty unless the tree has a text
    chain).
    chain_h [B, Dp, M], chain_k / chain_v [B, Dp, K, D]: the mdc chain, slot d at position
    lengths + d (empty for eagle); chain_valid [B, Dp]: slots reusable by the next proposal.
    drafted / reused / chain_calls [B]: statistics over the steps the row was live (draft nodes
    proposed, nodes drafted from a reused hidden state, chain layer calls made); pending [B, 3]:
    the last proposal's counts, added to the totals by commit when the row was live (the loop
    keeps proposing for finished rows while others run)."""

    cache: KVCache
    last_feature: jax.Array
    last_tokens: jax.Array
    tree_tokens: jax.Array
    chain_h: jax.Array
    chain_k: jax.Array
    chain_v: jax.Array
    chain_valid: jax.Array
    drafted: jax.Array
    reused: jax.Array
    chain_calls: jax.Array
    pending: jax.Array
    row_text: RowText


def tree_budget(tree: TreeConfig) -> tuple[int, int, int]:
    """(num_nodes, depth, top-k) of the dynamic tree a feature drafter builds for `tree` (its
    text chain left out)."""
    return tree.drafter_nodes, tree.drafter_depth, tree.topk


class FeatureDrafter(nnx.Module):
    """Shared machinery of the two feature drafters (see the module docstring)."""

    samples_children = False  # children are top-k: sampled decoding uses the one-hot tree rule
    dynamic_trees = True  # chooses the topology within the TreeConfig's budget
    text_chains = True  # adds TreeConfig.text_chain's branch drafted from the row's text
    # True: proposals record each node's parent drafter state (DraftTree.node_hidden), for
    # studies of what predicts acceptance (specjax.train.pre_verifier.record_steps); static.
    record_hidden = False

    def __init__(self, net: DrafterNet, target):
        self.net = net
        self.check_compatible(target)
        # A trained PreVerifier (specjax.models.pre_verifier) may be set here later (load_drafter
        # does when the checkpoint has one); declared as data so that a module can replace None.
        self.pre_verifier = nnx.data(None)
        # The target's hidden states the drafter reads (the last one before the final norm, and
        # the lower layers it fuses in), at the prompt and every node.
        self.feature_layers = net.config.feature_layers
        # The drafter's products take the target's weight layout (specjax.models.layers.dense):
        # on the CPU its layer and readout run on a few frontier rows per level, where a weight
        # leading the product costs ~0.7x (NOTES.md, "Sixteenth session"). The net is switched
        # in place; its checkpoints stay canonical (save_drafter writes canonical_params()).
        self.head_out_in = False
        w = target.embed[...].T if target.config.tie_embeddings else target.lm_head[...]
        self.head_u = TargetHead(jnp.take(w, net.draft_vocab[...], axis=1))  # [M, U]
        self.head_panels = nnx.data(None)  # a packed TargetHead with a packed target
        self.set_layout(
            bool(getattr(target.layers, "out_in", False)),
            panels=bool(getattr(target.layers, "panels", False)),
        )

    def set_layout(self, out_in: bool, panels: bool = False) -> None:
        """Store the net's matrices and the readout head [out, in] (out_in) or canonically, in
        place (the same drafts either way); binding to a target picks the target's layout.
        panels: the net's matrices packed for the CPU kernel, and the readout head kept packed
        too (as a target with packed layers does: specjax.kernels.cpu_panels); a drafting
        level's products run over a few frontier rows. The packed head is a bfloat16 copy of
        the target's float32 head: a level's readout reads half the bytes (~2% of a SmolLM2
        call), and drafts change only at the noise level (greedy tau on all 80 MT-bench first
        turns 2.2581 against 2.2580 with the float32 head: NOTES.md, "Forty-first session").
        Only the drafts can change: the target verifies them, so the output is the same."""
        self.net.set_layout(out_in, panels)
        if out_in != self.head_out_in:
            self.head_u.set_value(self.head_u[...].T)
            self.head_out_in = out_in
        if not panels:
            self.head_panels = None
        elif self.head_panels is None:
            head = self.head_u[...] if out_in else self.head_u[...].T  # [U, M]
            self.head_panels = TargetHead(cpu_panels.pack(head, jnp.bfloat16))

    @property
    def kind(self) -> str:
        return self.net.config.kind

    def check_compatible(self, target) -> None:
        """Raise ValueError if this drafter was not built for `target`'s shapes."""
        mine, theirs = self.net.config.target, target.config
        # n_layers too: the drafter reads the hidden state after the target's last layer.
        fields = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                  "ffn_dim")  # fmt: skip
        diff = [f for f in fields if getattr(mine, f) != getattr(theirs, f)]
        if diff:
            detail = ", ".join(f"{f} {getattr(mine, f)} vs {getattr(theirs, f)}" for f in diff)
            raise ValueError(
                f"this {self.kind} drafter was trained for another target ({detail}; drafter vs "
                "target): load the drafter trained for this target"
            )

    def _parts(self, target) -> TargetParts:
        return TargetParts(
            embed=target.embed[...],
            final_norm=target.final_norm[...],
            head_u=self.head_u[...],
            head_out_in=self.head_out_in,
            head_panels=None if self.head_panels is None else self.head_panels[...],
        )

    def _block(self, x, positions, cache: KVCache, mask, attn_impl) -> tuple[jax.Array, KVCache]:
        """Run the drafter layer on a block x [B, T, M] written into its cache at cache.lengths
        (prefill and commits: the same contract as the target's layers)."""
        cfg = self.net.config.layer
        p = one_layer_weights(self.net.layers)
        cos, sin = rope_angles(positions, cfg.head_dim, cfg.rope_theta)
        out, k, v = decoder_layer(
            p, x, cos, sin, cache.k[0], cache.v[0], cache.lengths, mask, cfg, attn_impl,
            self.net.out_in,
        )  # fmt: skip
        return out, cache.replace(k=k[None], v=v[None])

    def _draft_logp(self, logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
        """Scores for tree expansion: log q over the draft vocabulary, q after the sampling
        transform when sampling (greedy trees rank by the untempered distribution)."""
        if sampling.greedy:
            return jax.nn.log_softmax(logits, axis=-1)
        return jnp.log(apply_sampling(logits, sampling))

    # -- Drafter protocol ----------------------------------------------------------------------

    def init_state(
        self, target, prompt_ids, prompt_lens, cache_len, *, config: SpecConfig, target_hidden
    ) -> FeatureDrafterState:
        """target_hidden {i: [B, T, M]}: the target's hidden states at every prompt position,
        for every i in feature_layers."""
        target_hidden = self.net.read_features(target_hidden)
        b, t = prompt_ids.shape
        parts = self._parts(target)
        x = self.net.fuse(shift_right(target_hidden, 1), jnp.take(parts.embed, prompt_ids, 0))
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        extra = self.tree_keys_in_cache(config)
        cache = init_cache(self.net.config.layer, b, cache_len + extra, dtype=jnp.float32)
        _, cache = self._block(x, positions, cache, causal_mask(b, t), config.attn_impl)
        last = jnp.take_along_axis(target_hidden, (prompt_lens - 1)[:, None, None], axis=1)[:, 0]
        _, depth, _ = tree_budget(config.tree)
        slots = depth if self.kind == "mdc" else 0
        cfg = self.net.config.target
        zeros_b = jnp.zeros((b,), jnp.int32)
        return FeatureDrafterState(
            cache=cache.replace(lengths=prompt_lens),
            last_feature=last.astype(jnp.float32),
            last_tokens=self._last_tokens(prompt_ids, prompt_lens),
            tree_tokens=jnp.zeros((b, config.tree.num_nodes), jnp.int32),
            chain_h=jnp.zeros((b, slots, cfg.d_model), jnp.float32),
            chain_k=jnp.zeros((b, slots, cfg.n_kv_heads, cfg.head_dim), jnp.float32),
            chain_v=jnp.zeros((b, slots, cfg.n_kv_heads, cfg.head_dim), jnp.float32),
            chain_valid=jnp.zeros((b, slots), bool),
            drafted=zeros_b,
            reused=zeros_b,
            chain_calls=zeros_b,
            pending=jnp.zeros((b, 3), jnp.int32),
            row_text=init_row_text(
                prompt_ids,
                prompt_lens,
                cache_len,
                config.tree.max_depth,
                keep=config.tree.text_chain > 0,
            ),  # fmt: skip
        )

    def propose(
        self,
        state: FeatureDrafterState,
        target,
        ctx: RootContext,
        keys,
        *,
        config: SpecConfig,
        sampling: SamplingConfig,
    ) -> tuple[DraftTree, FeatureDrafterState]:
        del keys  # top-k trees are deterministic
        parts = self._parts(target)
        n_nodes, depth, topk = tree_budget(config.tree)
        root_emb = jnp.take(parts.embed, ctx.root, axis=0)  # [B, M]
        step, root_state, shared = self._expansion(state, parts, ctx, root_emb, sampling, config)
        b = ctx.root.shape[0]
        # Drafting is not stopped early with a text chain: a threshold pre-verifier is off then,
        # and a cost-aware one (specjax.pre_verify.keep_mask) weighs the chain's nodes against
        # the whole drafted tree after drafting.
        pv = self.pre_verifier if config.pre_verify and not config.tree.text_chain else None
        pv = pv if pv is not None and pv.prunes(n_nodes) else None
        # With a pre-verifier, drafting stops once no frontier node is worth verifying.
        stop = None if pv is None else (pv.node_logp, pv.keep_logp(n_nodes), pv.shape.block)
        # expand_topk works in draft-vocabulary ids; the root is not one (index 0 stands for it
        # and the step functions read the root's embedding from depth == 0).
        tree, _, shared = expand_topk(
            step,
            root_state,
            jnp.zeros((b,), jnp.int32),
            depth=depth,
            width=topk,
            topk=topk,
            num_nodes=n_nodes,
            stop=stop,
            shared=shared,
            hidden=(lambda child: child["feat"]) if self.record_hidden else None,
        )
        state, reused_slots, calls = self._after_expansion(state, shared)
        node = jnp.arange(n_nodes)[None, :]
        tokens = jnp.where(node == 0, ctx.root[:, None], self.net.draft_vocab[...][tree.tokens])
        tree = tree.replace(tokens=tokens.astype(jnp.int32))
        drafted = tree.valid & (node > 0)
        # A node at depth d + 1 was drafted from chain slot d.
        slot_reused = jnp.pad(reused_slots, ((0, 0), (0, depth - reused_slots.shape[1])))
        from_reuse = drafted & jnp.take_along_axis(
            slot_reused, jnp.clip(tree.depth - 1, 0, depth - 1), axis=1
        )
        counts = jnp.stack([jnp.sum(drafted, 1), jnp.sum(from_reuse, 1), calls], axis=1)
        if config.tree.text_chain:
            tree = with_text_chain(
                tree, state.row_text, ctx.root, config.tree.text_chain,
                max(config.tree.text_min_match, 1),
            )  # fmt: skip
        state = state.replace(tree_tokens=tree.tokens, pending=counts.astype(jnp.int32))
        return tree, state

    def commit(
        self,
        state: FeatureDrafterState,
        acceptance: Acceptance,
        advance,
        *,
        live,
        config: SpecConfig,
        target,
        target_hidden,
    ) -> FeatureDrafterState:
        """Recompute the accepted path's cache entries from the target's hidden states
        target_hidden {i: [B, N, M]} (the verification pass, i in feature_layers), advance
        lengths by `advance` [B]."""
        del config
        path, n_acc = acceptance.path, acceptance.n_accepted
        b, p = path.shape
        counted = jnp.where(live[:, None], state.pending, 0)
        moving = advance > 0  # rows that move on (a row finishing now keeps its state)
        tokens = jnp.take_along_axis(state.tree_tokens, path, axis=1)  # [B, P], slot 0 = root
        on_path = {
            i: jnp.take_along_axis(h, path[:, :, None], axis=1) for i, h in target_hidden.items()
        }
        feats = self.net.read_features(on_path)  # [B, P, M]
        prev = jnp.concatenate([state.last_feature[:, None], feats[:, :-1]], axis=1)
        x = self.net.fuse(prev, jnp.take(target.embed[...], tokens, axis=0))
        positions = state.cache.lengths[:, None] + jnp.arange(p, dtype=jnp.int32)[None, :]
        _, cache = self._block(x, positions, state.cache, causal_mask(b, p), "reference")
        last = jnp.take_along_axis(feats, n_acc[:, None, None], axis=1)[:, 0]
        state = state.replace(
            cache=cache.replace(lengths=cache.lengths + advance),
            last_feature=jnp.where(moving[:, None], last.astype(jnp.float32), state.last_feature),
            last_tokens=jnp.where(
                moving[:, None],
                self._advance_last_tokens(state.last_tokens, tokens, n_acc),
                state.last_tokens,
            ),  # fmt: skip
            drafted=state.drafted + counted[:, 0],
            reused=state.reused + counted[:, 1],
            chain_calls=state.chain_calls + counted[:, 2],
            row_text=commit_row_text(state.row_text, tokens, advance),
        )
        return self._shift_chain(state, n_acc + 1, moving)

    def _last_tokens(self, prompt_ids, prompt_lens) -> jax.Array:
        """[B, A] the prompts' last A tokens (-1 before their start), A = path_tokens - 1 (at
        least 1)."""
        a = max(self.net.config.path_tokens - 1, 1)
        pos = prompt_lens[:, None] - a + jnp.arange(a)[None, :]  # [B, A]
        tokens = jnp.take_along_axis(prompt_ids, jnp.maximum(pos, 0), axis=1)
        return jnp.where(pos >= 0, tokens, -1).astype(jnp.int32)

    @staticmethod
    def _advance_last_tokens(last_tokens, tokens, n_acc) -> jax.Array:
        """[B, A] the last A tokens once the path tokens [B, P] (slot 0 the root) up to slot
        n_acc [B] are committed after last_tokens [B, A]."""
        a = last_tokens.shape[1]
        joined = jnp.concatenate([last_tokens, tokens], axis=1)  # [B, A + P]
        idx = n_acc[:, None] + 1 + jnp.arange(a)[None, :]  # slot n_acc sits at A + n_acc
        return jnp.take_along_axis(joined, idx, axis=1)

    def stats(self, state: FeatureDrafterState) -> dict:
        return {
            "drafted": state.drafted,
            "reused": state.reused,
            "chain_calls": state.chain_calls,
        }

    # -- kind-specific hooks -------------------------------------------------------------------

    def tree_keys_in_cache(self, config: SpecConfig) -> int:
        """Cache positions past the context that a proposal writes its tree levels' keys to
        (0: the levels carry their ancestors' keys themselves)."""
        del config
        return 0

    def _expansion(self, state, parts, ctx, root_emb, sampling, config: SpecConfig):
        """(step, root_state, shared) for tree.expand_topk, step taking the shared carry and the
        level: the drafter's layer calls happen inside the levels, so that levels an early stop
        never reaches cost nothing."""
        raise NotImplementedError

    def _after_expansion(self, state, shared):
        """(state, reused_slots [B, Dp] bool, layer calls [B]) from the shared carry after the
        last level expand_topk ran."""
        raise NotImplementedError

    def _shift_chain(self, state, shift, live):
        """Carry what survives a commit of shift [B] positions (nothing, for eagle)."""
        return state


def with_text_chain(tree: DraftTree, row_text: RowText, root, k: int, min_match: int) -> DraftTree:
    """tree [B, N] with the text's chain of k nodes appended as one more branch of the root
    (nodes N .. N + k - 1, each the child of the one before; valid while the text's match is
    at least min_match tokens long). Where the drafter's tree already spells the chain's first
    j tokens, those chain nodes are not valid and node N + j hangs from the drafter's node that
    ends them (text_chain.shared_prefix): verifying them twice would cost nodes for nothing, and
    under the one-hot rule the drafter's node, tried first, would leave the chain's rest
    unreachable. Its tokens are deterministic (draft_prob 1, as for the
    drafter's top-k children under the one-hot rule); hidden states are zeros there. Recorded
    statistics: the node's log acceptance given its parent's by the match it was drafted from
    (text_chain.CHAIN_NODE_LOGP) as logq, their sum along the chain as cum_logq, the depth; the
    rest zeros (a cost-aware pre-verifier reads the first two, specjax.pre_verify)."""
    b, n = tree.tokens.shape
    tokens, valid, matches = draft_text_chain(
        row_text, root, k, LONGEST, min_match, with_matches=True
    )
    anchor, shared = shared_prefix(tree.tokens, tree.parents, tree.depth, tree.valid, tokens, valid)
    chain = jnp.arange(k, dtype=jnp.int32)[None, :]
    valid = valid & (chain >= shared[:, None])
    parents = jnp.where(
        chain == shared[:, None], anchor[:, None], jnp.where(chain == 0, 0, n + chain - 1)
    )
    depth = jnp.broadcast_to(chain + 1, (b, k))

    def pad(x):
        return None if x is None else jnp.pad(x, ((0, 0), (0, k)) + ((0, 0),) * (x.ndim - 2))

    node_stats = None
    if tree.node_stats is not None:
        logq = chain_node_logp(matches)
        stats = {"logq": logq, "cum_logq": jnp.cumsum(logq, axis=1), "depth": depth}
        chain_stats = jnp.stack(
            [stats.get(name, jnp.zeros((b, k))) for name in NODE_STATS], axis=-1
        ).astype(tree.node_stats.dtype)
        node_stats = jnp.concatenate([tree.node_stats, chain_stats], axis=1)

    return tree.replace(
        tokens=jnp.concatenate([tree.tokens, tokens], axis=1),
        parents=jnp.concatenate([tree.parents, parents.astype(tree.parents.dtype)], axis=1),
        depth=jnp.concatenate([tree.depth, depth.astype(tree.depth.dtype)], axis=1),
        valid=jnp.concatenate([tree.valid, valid], axis=1),
        draft_prob=jnp.concatenate(
            [tree.draft_prob, jnp.ones((b, k), tree.draft_prob.dtype)], axis=1
        ),
        node_stats=node_stats,
        node_hidden=pad(tree.node_hidden),
    )


class EagleDrafter(FeatureDrafter):
    """EAGLE-style feature drafter: every tree node is one layer call on
    fuse(parent's predicted feature, embedding of the node's token), attending to the committed
    cache and to the node's ancestors.

    Where the CPU attention kernel runs (specjax.attention.cpu_kernel_ok), each level writes its
    W frontier keys into the drafter's cache past the context (level d at lengths + d * W + w,
    room the cache was given by tree_keys_in_cache) and its queries attend through the kernel with
    a mask of their ancestors' slots: one custom call a level over the visible context, where
    XLA's attention scores every cache position and costs ~15 us a level even at stories260K's
    size. Elsewhere each frontier slot carries its ancestors' keys and values and attends to them
    next to the committed cache (attend_context_and_extra). The two are the same attention over
    the same keys (summed in another order)."""

    def tree_keys_in_cache(self, config: SpecConfig) -> int:
        _, depth, topk = tree_budget(config.tree)
        impl = resolve_impl(config.attn_impl, self.net.config.target.head_dim)
        return depth * topk if cpu_kernel_ok(impl, topk, jnp.float32) else 0

    def _expansion(self, state, parts, ctx, root_emb, sampling, config: SpecConfig):
        net, cache = self.net, state.cache
        cfg = net.config.target
        b = ctx.root.shape[0]
        s = cache.max_len
        vocab = net.draft_vocab[...]
        _, depth, topk = tree_budget(config.tree)
        room = self.tree_keys_in_cache(config)  # > 0: the levels' keys go into the cache

        def inputs(st, tokens):
            d = st["depth"]  # [B, W]: every frontier slot of a level has the same depth
            emb = jnp.where(
                (d == 0)[..., None], root_emb[:, None], jnp.take(parts.embed, vocab[tokens], 0)
            )
            return d, emb, net.fuse(st["feat"], emb), cache.lengths[:, None] + d

        def in_cache(st, tokens, shared, level):  # leaves [B, W, ...], tokens [B, W] (draft ids)
            calls, k_cache, v_cache = shared
            d, emb, x, pos = inputs(st, tokens)
            q, k, v = net.qkv(x, pos)
            start = cache.lengths + level * topk  # the W = topk frontier slots of this level
            k_cache, v_cache = write_block(k_cache, k, start), write_block(v_cache, v, start)
            slots = jnp.arange(room)[None, None, :]
            own = slots == (level * topk + jnp.arange(topk))[None, :, None]  # [1, W, depth * W]
            sees = st["sees"] | own
            attn = attend(q, k_cache, v_cache, cache.lengths, sees, "cpu")
            out = net.finish(x, attn)
            logp = self._draft_logp(net.logits(parts, out, emb), sampling)
            child = {"feat": out, "sees": sees, "depth": d + 1}
            return logp, child, (calls + 1, k_cache, v_cache)

        def carried(st, tokens, calls, level):
            del level
            d, emb, x, pos = inputs(st, tokens)
            ctx_mask = jnp.broadcast_to(
                jnp.arange(s)[None, None, :] < cache.lengths[:, None, None], d.shape + (s,)
            )
            ext_mask = jnp.arange(depth)[None, None, :] < d[..., None]
            out, k, v = net.step(
                x, pos, cache.k[0], cache.v[0], ctx_mask, st["hk"], st["hv"], ext_mask
            )
            logp = self._draft_logp(net.logits(parts, out, emb), sampling)
            here = (jnp.arange(depth)[None, None, :] == d[..., None])[..., None, None]
            child = {
                "feat": out,
                "hk": jnp.where(here, k[:, :, None], st["hk"]),
                "hv": jnp.where(here, v[:, :, None], st["hv"]),
                "depth": d + 1,
            }
            return logp, child, calls + 1  # one (frontier-wide) layer call per level

        root_state = {"feat": state.last_feature, "depth": jnp.zeros((b,), jnp.int32)}
        calls = jnp.zeros((b,), jnp.int32)
        if room:
            root_state["sees"] = jnp.zeros((b, room), bool)
            return in_cache, root_state, (calls, cache.k[0], cache.v[0])
        kv = jnp.zeros((b, depth, cfg.n_kv_heads, cfg.head_dim), jnp.float32)
        root_state.update(hk=kv, hv=kv)
        return carried, root_state, calls

    def _after_expansion(self, state, shared):
        if isinstance(shared, tuple):  # the levels wrote their keys into the cache
            calls, k_cache, v_cache = shared
            state = state.replace(cache=state.cache.replace(k=k_cache[None], v=v_cache[None]))
            return state, jnp.zeros((calls.shape[0], 0), bool), calls
        return state, jnp.zeros((shared.shape[0], 0), bool), shared


# Leading chain slots recomputed every step by default (see HiddenStateDrafter).
DEFAULT_FRESH_SLOTS = 3


class HiddenStateDrafter(FeatureDrafter):
    """Hidden-state drafter (Make Every Draft Count): a chain of predicted hidden states, one layer
    call per depth (never consuming a draft token), token information injected at the readout,
    and reuse of the chain after a rejection.

    reuse=False recomputes the whole chain every step (the ablation). fresh_slots: how many
    leading chain slots are recomputed every step even with reuse on. Slot 0 is where the
    target's verified hidden state and the corrected token enter, and the slots after it were
    predicted from the previous root, under the drafter's own guess of the tokens the target
    just rejected; recomputing the first few trades a few layer calls for fresher hidden states
    where acceptance matters most (the trade is measured in experiments/results/drafters.md).
    fresh_slots=0 reuses every valid slot, fresh_slots >= depth is the same as reuse=False.
    Chain slot d is computed when tree level d is expanded, so a pre-verifier's early stop saves
    the deeper slots' layer calls; the slots it never reached are not carried over.

    stale_logits: the paper's variant for the slots recomputed after a rejection: the draft
    distribution there reads both hidden states, the fresh one and the stale one carried from
    the previous step (predicted under the rejected guess), as the mean of their log-probabilities
    with the same parent tokens injected (the public notes say the stale logits are added to the
    fresh ones; the mean keeps the same ranking of children and a distribution of the usual
    sharpness). It costs a second readout at those slots and never a layer call."""

    def __init__(
        self,
        net: DrafterNet,
        target,
        *,
        reuse: bool = True,
        fresh_slots: int = DEFAULT_FRESH_SLOTS,
        stale_logits: bool = False,
    ):
        if fresh_slots < 0:
            raise ValueError(f"fresh_slots must be >= 0, got {fresh_slots}")
        if stale_logits and not reuse:
            raise ValueError("stale_logits needs reuse=True: without reuse no slot is carried over")
        super().__init__(net, target)
        self.reuse = reuse
        self.fresh_slots = fresh_slots
        self.stale_logits = stale_logits

    def _reusable_slots(self, state) -> jax.Array:
        """[B, Dp] bool: carried chain slots this step keeps instead of recomputing."""
        reusable = state.chain_valid if self.reuse else jnp.zeros_like(state.chain_valid)
        return reusable.at[:, : self.fresh_slots].set(False)

    def _chain_slot(self, state, chain, x, d, *, first: bool):
        """Chain slot d (h_{d+1} at position lengths + d) computed from the layer input x [B, M],
        in the rows that cannot reuse it; skipped (lax.cond) when none needs it. d may be
        traced."""
        net, cache = self.net, state.cache
        h, k_hist, v_hist = chain["h"], chain["k"], chain["v"]
        b, depth = h.shape[0], h.shape[1]
        ctx_mask = (jnp.arange(cache.max_len)[None, :] < cache.lengths[:, None])[:, None, :]

        def compute():
            out, k, v = net.step(
                x[:, None],
                (cache.lengths + d)[:, None],
                cache.k[0],
                cache.v[0],
                ctx_mask,
                k_hist[:, None],
                v_hist[:, None],
                jnp.broadcast_to(jnp.arange(depth) < d, (b, 1, depth)),
                chain=not first,
            )
            return out[:, 0], k[:, 0], v[:, 0]

        def keep():
            return h[:, d], k_hist[:, d], v_hist[:, d]

        r = chain["reusable"][:, d]
        new_h, new_k, new_v = jax.lax.cond(jnp.all(r), keep, compute)
        return {
            **chain,
            "h": h.at[:, d].set(jnp.where(r[:, None], h[:, d], new_h)),
            "k": k_hist.at[:, d].set(jnp.where(r[:, None, None], k_hist[:, d], new_k)),
            "v": v_hist.at[:, d].set(jnp.where(r[:, None, None], v_hist[:, d], new_v)),
            "ready": chain["ready"].at[:, d].set(True),
            "calls": chain["calls"] + (~r).astype(jnp.int32),
        }

    def _chain_start(self, state, root_emb):
        """The chain carry with slot 0 computed: it starts from the target's own last hidden
        state and the root token (every tree expands the root, so it is always needed).
        Carry: h [B, Dp, M], k / v [B, Dp, K, D], reusable [B, Dp] (slots carried over that
        this step keeps), ready [B, Dp] (slots holding a valid state), calls [B]."""
        reusable = self._reusable_slots(state)
        chain = {
            "h": state.chain_h,
            "k": state.chain_k,
            "v": state.chain_v,
            "reusable": reusable,
            "ready": reusable,
            "calls": jnp.zeros_like(state.chain_calls),
        }
        x = self.net.fuse(state.last_feature, root_emb)
        return self._chain_slot(state, chain, x, 0, first=True)

    def _expansion(self, state, parts, ctx, root_emb, sampling, config: SpecConfig):
        net = self.net
        vocab = net.draft_vocab[...]
        # The carried hidden states before any recomputation, and the slots recomputed although
        # a carried one was valid (read by stale_logits).
        stale = state.chain_h
        recomputed_stale = state.chain_valid & ~self._reusable_slots(state)

        def step(st, tokens, chain, level):  # the children of a depth-d node read chain slot d
            # Slot `level` continues the recurrence on the previous slot's predicted hidden
            # state; it is computed here, when the level is expanded, so that an early stop
            # saves the deeper slots' layer calls (slot 0 is computed before the levels).
            prev = chain["h"][:, jnp.maximum(level - 1, 0)]
            chain = jax.lax.cond(
                level > 0,
                lambda: self._chain_slot(state, chain, net.fuse(prev, None), level, first=False),
                lambda: chain,
            )
            h = chain["h"]
            d = st["depth"]  # [B, W], all equal to level
            hd = jnp.take_along_axis(h, d[..., None], axis=1)  # [B, W, M]
            parent = jnp.where(
                (d == 0)[..., None], root_emb[:, None], jnp.take(parts.embed, vocab[tokens], 0)
            )
            anc = st["ancestors"]  # [B, W, A, M]
            logp = self._draft_logp(net.logits(parts, hd, parent, anc), sampling)
            if self.stale_logits:
                hs = jnp.take_along_axis(stale, d[..., None], axis=1)
                logp_stale = self._draft_logp(net.logits(parts, hs, parent, anc), sampling)
                both = jnp.take_along_axis(recomputed_stale, d, axis=1)[..., None]  # [B, W, 1]
                mixed = jax.nn.log_softmax((logp + logp_stale) / 2, axis=-1)
                # Under top-k / top-p the two kept sets may not meet: every entry -inf, the
                # softmax NaN; such a row keeps its fresh distribution.
                met = jnp.isfinite(mixed).any(axis=-1, keepdims=True)
                logp = jnp.where(both & met, mixed, logp)
            # The frontier node's token is its children's parent and their children's nearest
            # ancestor.
            child = {
                "depth": d + 1,
                "ancestors": jnp.concatenate([parent[..., None, :], anc[..., :-1, :]], axis=-2),
            }
            if self.record_hidden:  # the chain slot every child at this level is read from
                child["feat"] = hd
            return logp, child, chain

        root_state = {
            "depth": jnp.zeros((ctx.root.shape[0],), jnp.int32),
            # The root's ancestors, nearest first (zero before the sequence's start).
            "ancestors": jnp.where(
                (state.last_tokens >= 0)[..., None],
                jnp.take(parts.embed, jnp.maximum(state.last_tokens, 0), axis=0),
                0.0,
            )[:, ::-1],
        }
        if self.record_hidden:
            root_state["feat"] = jnp.zeros_like(state.chain_h[:, 0])
        return step, root_state, self._chain_start(state, root_emb)

    def _after_expansion(self, state, chain):
        """Slots the levels never reached (an early stop) hold no valid state for the next step."""
        state = state.replace(
            chain_h=chain["h"], chain_k=chain["k"], chain_v=chain["v"], chain_valid=chain["ready"]
        )
        return state, chain["reusable"], chain["calls"]

    def _shift_chain(self, state, shift, live):
        """After accepting shift - 1 tokens, old slot d + shift is new slot d (same position)."""
        dp = state.chain_h.shape[1]
        src = jnp.arange(dp)[None, :] + shift[:, None]  # [B, Dp]
        idx = jnp.minimum(src, dp - 1)

        def take(x):
            return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)

        ok = (src < dp) & live[:, None] & take(state.chain_valid)

        return state.replace(
            chain_h=jnp.where(live[:, None, None], take(state.chain_h), state.chain_h),
            chain_k=jnp.where(live[:, None, None, None], take(state.chain_k), state.chain_k),
            chain_v=jnp.where(live[:, None, None, None], take(state.chain_v), state.chain_v),
            chain_valid=jnp.where(live[:, None], ok, state.chain_valid),
        )
