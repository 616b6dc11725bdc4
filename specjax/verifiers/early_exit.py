"""EarlyExitVerifier: HiSpec's intermediate verification applied to a whole draft tree.

Axis letters: B batch, N tree nodes, P path slots (max depth + 1), S cache length, V vocab,
U exit vocab, M model dim.

One step, for a tree from any drafter:
1. Layers [0, E) run on all N tree nodes (tree attention, K/V written as scratch at
   [lengths, lengths + N) as the full verifier does); the trained exit head at layer E
   (specjax.models.exit_head) gives every node a next-token distribution p_E.
2. The step's rule judges the tree against p_E as if the exit model were the target: it returns
   an accepted path a_0 (the root) .. a_n and one more token c, an exact sample of the exit
   model's continuation c_1..c_m (m = n + 1: the path tokens, then c).
3. Layers [E, L) run on the path only (P positions a_0 .. a_n, in order at [lengths,
   lengths + P)), on the layer-E hidden states kept from step 1, and the target judges
   c_1..c_m as a chain drafted by the exit model (q = p_E): greedy or standard speculative
   sampling. It accepts a prefix c_1..c_j and adds its own correction, or accepts all m and
   stops there (the last chain token c has no upper-layer pass of its own, so no bonus token is
   drawn; leaving it out keeps every emitted token exact).

Why it is lossless: step 2 emits an exact sample of the exit model, token by token; step 3 is
speculative decoding of the target with the exit model as its drafter, so its output is an
exact sample of the target (the chain length m depends only on what came before each token,
which is the condition speculative sampling's per-token argument needs). tests/
test_early_exit.py checks greedy equality and the sampled distribution by exact enumeration.

Why it saves compute: the layers above the exit run on P = max depth + 1 positions instead of
N nodes (a 31-node tree of depth 6: 7 positions), which is where the cost of tree verification
grows on hardware whose cost grows with the nodes.

Cache: the layers below the exit commit the accepted path like the full verifier
(cache.commit_path restricted to [0, E)); the layers above already hold the path in order.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax import verify as rules
from specjax.cache import KVCache, commit_path
from specjax.config import SamplingConfig, SpecConfig
from specjax.models.exit_head import ExitHead, ExitLogits
from specjax.sampling import apply_sampling
from specjax.sharding import gather_logits
from specjax.tree import Acceptance, DraftTree, causal_mask
from specjax.verifiers.base import Verification
from specjax.verifiers.full import FullVerifier, nonfinite_rows


@flax.struct.dataclass
class EarlyExitState:
    """cache: the target's KVCache; exit_accepted [B]: the exit's accepted draft tokens summed
    over counted steps, exit_steps [B]: the steps counted; exit_last [B]: this step's (set by
    verify, counted by commit)."""

    cache: KVCache
    exit_accepted: jax.Array
    exit_steps: jax.Array
    exit_last: jax.Array


class EarlyExitVerifier(nnx.Module):
    """Verifies a draft tree with an exit head at layer head.layer screening it first (see the
    module docstring). head: a trained ExitHead of `target` (specjax.train.exit_heads)."""

    def __init__(self, head: ExitHead, target):
        self.exit = ExitLogits(head, target)

    @classmethod
    def from_checkpoint(cls, path, target) -> EarlyExitVerifier:
        """The verify exit of an exit-heads directory (checkpoints/<target>-hispec)."""
        from specjax.train.exit_heads import load_exit_heads

        model = getattr(target, "model", target)  # a specjax.load() result: its model
        return cls(load_exit_heads(path, model)["verify"], model)

    def check_compatible(self, target) -> None:
        """ValueError, saying what to do, when the exit cannot read `target`'s layers."""
        self.exit.check_compatible(target)

    def prefill(self, target, ids, prompt_lens, cache_len, *, feature_layers, attn_impl):
        logits, cache, hidden = FullVerifier().prefill(
            target, ids, prompt_lens, cache_len, feature_layers=feature_layers,
            attn_impl=attn_impl,
        )  # fmt: skip
        zeros = jnp.zeros(ids.shape[:1], jnp.int32)
        state = EarlyExitState(cache=cache, exit_accepted=zeros, exit_steps=zeros, exit_last=zeros)
        return logits, state, hidden

    def lengths(self, state: EarlyExitState):
        return state.cache.lengths

    def verify(
        self,
        state: EarlyExitState,
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
        cfg = target.config
        e, n_layers = self.exit.layer, cfg.n_layers
        b, n = tree.tokens.shape
        depth = config.tree.max_depth
        p_slots = depth + 1
        lengths = state.cache.lengths
        greedy = rule == "greedy"

        # 1. Layers [0, E) over the whole tree, and the exit's distribution at every node.
        low_layers = tuple(i for i in feature_layers if i <= e)
        low = target(
            tree.tokens,
            positions=lengths[:, None] + tree.depth,
            cache=state.cache,
            tree_mask=tree_mask,
            layer_range=(0, e),
            return_hidden=(e, *low_layers),
            compute_logits=False,
            attn_impl=config.attn_impl,
        )
        h_e = low.hidden[e]  # [B, N, M]
        # [B, N, V], -inf outside the exit vocabulary; gathered over V on a mesh.
        exit_logits = gather_logits(self.exit(h_e))
        p_exit = exit_logits if greedy else apply_sampling(exit_logits, sampling)
        split = jax.vmap(lambda k: jax.random.split(k, 2))(keys)

        # 2. The exit judges the tree: path a_0..a_n2 and its own next token c.
        acc2 = rules.RULES[rule](tree, p_exit, split[:, 0], depth)
        n2, path = acc2.n_accepted, acc2.path  # [B], [B, P]
        slot = jnp.arange(p_slots)[None, :]

        # 3. Layers [E, L) on the path, in order.
        path_h = jnp.take_along_axis(h_e, path[:, :, None], axis=1)  # [B, P, M]
        high_layers = tuple(i for i in feature_layers if i > e)
        up = target(
            None,
            hidden=path_h,
            positions=lengths[:, None] + slot,
            cache=low.cache,
            tree_mask=causal_mask(b, p_slots),
            layer_range=(e, n_layers),
            return_hidden=high_layers,
            attn_impl=config.attn_impl,
        )
        # The exit's continuation as a chain: root, path tokens c_1..c_n2, then c at n2 + 1.
        path_tokens = jnp.take_along_axis(tree.tokens, path, axis=1)  # [B, P]
        chain_slot = jnp.arange(p_slots + 1)[None, :]
        chain_tokens = jnp.pad(path_tokens, ((0, 0), (0, 1)))
        chain_tokens = jnp.where(chain_slot == n2[:, None] + 1, acc2.next_token[:, None],
                                 chain_tokens)  # fmt: skip
        up_logits = gather_logits(up.logits)
        p_up = up_logits if greedy else apply_sampling(up_logits, sampling)
        p_chain = jnp.pad(p_up, ((0, 0), (0, 1), (0, 0)))  # slot P is never judged against
        q_chain = None
        if not greedy:
            q_path = jnp.take_along_axis(p_exit, path[:, :, None], axis=1)  # [B, P, V]
            q_chain = jnp.pad(q_path, ((0, 0), (0, 1), (0, 0)))
        chain = DraftTree(
            tokens=chain_tokens.astype(jnp.int32),
            parents=jnp.broadcast_to(chain_slot - 1, chain_tokens.shape).astype(jnp.int32),
            depth=jnp.broadcast_to(chain_slot, chain_tokens.shape).astype(jnp.int32),
            valid=chain_slot <= n2[:, None] + 1,
            draft_prob=jnp.ones(chain_tokens.shape, jnp.float32),
            draft_dist=q_chain,
        )
        acc3 = rules.RULES["greedy" if greedy else "chain"](chain, p_chain, split[:, 1], p_slots)
        # Every exit token accepted: stop after c (no upper-layer pass exists for a bonus).
        all_ok = acc3.n_accepted >= n2 + 1
        n_final = jnp.where(all_ok, n2, acc3.n_accepted).astype(jnp.int32)
        next_token = jnp.where(all_ok, acc2.next_token, acc3.next_token).astype(jnp.int32)
        acceptance = Acceptance(
            path=jnp.where(slot <= n_final[:, None], path, 0).astype(jnp.int32),
            n_accepted=n_final,
            next_token=next_token,
        )

        # Hidden states for the drafter at tree nodes: below the exit for every node; above it
        # only on the path (scattered back to its nodes; other nodes are never accepted).
        hidden = {i: low.hidden[i] for i in low_layers}
        node_of_slot = jnp.where(slot <= n2[:, None], path, n)  # n: out of bounds, dropped
        for i in high_layers:
            scattered = jnp.zeros((b, n) + up.hidden[i].shape[2:], up.hidden[i].dtype)
            hidden[i] = jax.vmap(lambda z, idx, h: z.at[idx].set(h, mode="drop"))(
                scattered, node_of_slot, up.hidden[i]
            )
        return Verification(
            acceptance=acceptance,
            state=state.replace(cache=up.cache, exit_last=n2.astype(jnp.int32)),
            hidden=hidden,
            nonfinite=nonfinite_rows(up.logits),
        )

    def commit(self, state: EarlyExitState, acceptance: Acceptance, advance, *,
               config: SpecConfig):  # fmt: skip
        cache = commit_path(
            state.cache,
            acceptance.path,
            advance,
            num_nodes=config.tree.num_nodes,
            is_chain=config.tree.is_chain,
            layers=(0, self.exit.layer),
        )
        counted = advance > 0
        return state.replace(
            cache=cache,
            exit_accepted=state.exit_accepted + jnp.where(counted, state.exit_last, 0),
            exit_steps=state.exit_steps + counted,
        )

    def stats(self, state: EarlyExitState) -> dict:
        """exit_accepted [B]: draft tokens the exit accepted over the steps that advanced a row
        (steps that finished a row are not counted); exit_steps [B]: those steps."""
        return {"exit_accepted": state.exit_accepted, "exit_steps": state.exit_steps}
