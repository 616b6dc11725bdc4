"""speculative_generate: draft, verify, accept, commit, stop - one jitted `lax.while_loop`.

Axis letters: B batch, N tree nodes, P = max_depth + 1 path slots, S cache length, V vocab.

Engine state per row: the target cache holds positions [0, lengths); the root (the last emitted
token) is pending at position `lengths`. One step:
  1. the drafter proposes a tree whose node 0 is the root;
  2. the target runs on the N nodes at positions lengths + depth with the ancestor mask, writing
     their K/V into scratch slots [lengths, lengths + N);
  3. an acceptance rule (specjax.verify) picks the accepted path and one extra token;
  4. the accepted nodes' K/V are moved into place, lengths += n_accepted + 1 and the extra token
     becomes the new root; the drafter commits the same path.
Randomness of step s of row b comes from fold_in(keys[b], lengths[b]), so a row's output depends
only on its own prompt and key, whatever else is in the batch.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax import verify as rules
from specjax.cache import KVCache, commit_path, init_cache
from specjax.config import SamplingConfig, SpecConfig
from specjax.decode import (
    GenerateOutput,
    check_sampling,
    choose_tokens,
    prefill,
    prepare_keys,
    prepare_prompts,
)
from specjax.drafting import RootContext
from specjax.sampling import apply_sampling
from specjax.tree import ancestor_mask


@flax.struct.dataclass
class _SpecState:
    tokens: jax.Array  # [B, max_new + P] emitted tokens (room for one overshooting step)
    n_generated: jax.Array  # [B]
    done: jax.Array  # [B]
    root: jax.Array  # [B] pending token at position lengths
    prev: jax.Array  # [B] committed token at lengths - 1
    cache: KVCache
    drafter_state: object
    target_calls: jax.Array  # [B] verification steps while the row was live
    accepted_hist: jax.Array  # [B, P] histogram of n_accepted


def _emitted(tree_tokens, acceptance, p):
    """Tokens a step emits, [B, P]: the accepted path's tokens then the extra token."""
    path_tokens = jnp.take_along_axis(tree_tokens, acceptance.path, axis=1)[:, 1:]  # [B, P-1]
    path_tokens = jnp.concatenate([path_tokens, jnp.zeros_like(path_tokens[:, :1])], axis=1)
    idx = jnp.arange(p)[None, :]
    n = acceptance.n_accepted[:, None]
    return jnp.where(idx < n, path_tokens, jnp.where(idx == n, acceptance.next_token[:, None], 0))


@functools.partial(
    jax.jit, static_argnames=("target_def", "drafter_def", "max_new_tokens", "config", "sampling")
)
def _speculative(
    target_def,
    target_params,
    drafter_def,
    drafter_params,
    ids,
    prompt_lens,
    keys,
    eos_id,
    *,
    max_new_tokens: int,
    config: SpecConfig,
    sampling: SamplingConfig,
):
    target = nnx.merge(target_def, target_params)
    drafter = nnx.merge(drafter_def, drafter_params)
    tree_cfg = config.tree
    rule = config.resolved_rule(sampling, drafter.samples_children)
    verify = rules.RULES[rule]
    # Feature drafters read the target's last hidden state (prompt and every verified node).
    feature_layers = (target.config.n_layers,) if drafter.uses_target_features else ()
    b, t = ids.shape
    n, p = tree_cfg.num_nodes, tree_cfg.max_depth + 1
    cache_len = t + max_new_tokens + n + 1

    cache = init_cache(target.config, b, cache_len)
    logits, cache, hidden = prefill(
        target, ids, prompt_lens, cache, config.attn_impl, return_hidden=feature_layers
    )
    first = choose_tokens(logits, keys, 0, sampling)
    drafter_state = drafter.init_state(
        target,
        ids,
        prompt_lens,
        cache_len,
        config=config,
        target_hidden=hidden[feature_layers[0]] if feature_layers else None,
    )
    prev = jnp.take_along_axis(ids, (prompt_lens - 1)[:, None], axis=1)[:, 0]
    state = _SpecState(
        tokens=jnp.zeros((b, max_new_tokens + p), jnp.int32).at[:, 0].set(first),
        n_generated=jnp.ones((b,), jnp.int32),
        done=(first == eos_id) | (max_new_tokens <= 1),
        root=first,
        prev=prev,
        cache=cache,
        drafter_state=drafter_state,
        target_calls=jnp.zeros((b,), jnp.int32),
        accepted_hist=jnp.zeros((b, p), jnp.int32),
    )

    def cond(s: _SpecState):
        return ~jnp.all(s.done)

    def body(s: _SpecState):
        lengths = s.cache.lengths
        step_keys = jax.vmap(jax.random.fold_in)(keys, lengths)
        split = jax.vmap(lambda k: jax.random.split(k, 2))(step_keys)
        draft_keys, verify_keys = split[:, 0], split[:, 1]
        ctx = RootContext(root=s.root, prev=s.prev, lengths=lengths)
        tree, drafter_state = drafter.propose(
            s.drafter_state, target, ctx, draft_keys, config=config, sampling=sampling
        )
        out = target(
            tree.tokens,
            positions=lengths[:, None] + tree.depth,
            cache=s.cache,
            # Computed from the tree itself: feature drafters choose the topology every step.
            tree_mask=ancestor_mask(tree.parents),
            return_hidden=feature_layers,
            attn_impl=config.attn_impl,
        )
        target_p = out.logits if rule == "greedy" else apply_sampling(out.logits, sampling)
        if rule == "greedy":
            acc = verify(tree, target_p, tree_cfg.max_depth)
        else:
            acc = verify(tree, target_p, verify_keys, tree_cfg.max_depth)

        live = ~s.done
        emitted = _emitted(tree.tokens, acc, p)  # [B, P]
        n_emit = acc.n_accepted + 1
        is_eos = (emitted == eos_id) & (jnp.arange(p)[None, :] < n_emit[:, None])
        first_eos = jnp.argmax(is_eos, axis=1)
        n_keep = jnp.where(is_eos.any(axis=1), first_eos + 1, n_emit)
        n_keep = jnp.minimum(n_keep, max_new_tokens - s.n_generated)
        n_keep = jnp.where(live, n_keep, 0)
        tokens = jax.vmap(_write_tokens)(s.tokens, emitted, s.n_generated, n_keep)
        n_generated = s.n_generated + n_keep
        done = s.done | is_eos.any(axis=1) | (n_generated >= max_new_tokens)

        advance = jnp.where(live, n_emit, 0)
        cache = commit_path(out.cache, acc.path, advance)
        drafter_state = drafter.commit(
            drafter_state,
            acc,
            advance,
            target=target,
            target_hidden=out.hidden[feature_layers[0]] if feature_layers else None,
        )
        last_accepted = jnp.take_along_axis(
            tree.tokens, jnp.take_along_axis(acc.path, acc.n_accepted[:, None], axis=1), axis=1
        )[:, 0]
        hist = s.accepted_hist + jnp.where(
            live[:, None], jax.nn.one_hot(acc.n_accepted, p, dtype=jnp.int32), 0
        )
        return _SpecState(
            tokens=tokens,
            n_generated=n_generated,
            done=done,
            root=jnp.where(live, acc.next_token, s.root),
            prev=jnp.where(live, last_accepted, s.prev),
            cache=cache,
            drafter_state=drafter_state,
            target_calls=s.target_calls + live,
            accepted_hist=hist,
        )

    final = jax.lax.while_loop(cond, body, state)
    steps = jnp.maximum(final.target_calls, 1)
    accepted_total = jnp.sum(final.accepted_hist * jnp.arange(p)[None, :], axis=1)
    stats = {
        "target_calls": final.target_calls,
        "accepted_hist": final.accepted_hist,
        "tau": (accepted_total + final.target_calls) / steps,
    }
    if hasattr(drafter, "stats"):
        stats.update(drafter.stats(final.drafter_state))
    tokens = final.tokens[:, :max_new_tokens]
    tokens = jnp.where(jnp.arange(max_new_tokens)[None, :] < final.n_generated[:, None], tokens, 0)
    return GenerateOutput(tokens=tokens, lengths=final.n_generated, stats=stats)


def _write_tokens(row, emitted, start, n_keep):
    """Write emitted[:n_keep] into row [max_new + P] at start (slots past n_keep keep their 0s)."""
    p = emitted.shape[0]
    old = jax.lax.dynamic_slice(row, (start,), (p,))
    new = jnp.where(jnp.arange(p) < n_keep, emitted, old)
    return jax.lax.dynamic_update_slice(row, new, (start,))


def speculative_generate(
    target,
    drafter,
    prompts,
    *,
    max_new_tokens: int,
    config: SpecConfig = SpecConfig(),
    sampling: SamplingConfig = SamplingConfig(),
    key=None,
    eos_id: int | None = None,
) -> GenerateOutput:
    """Speculative decoding: the target's exact output distribution in fewer target calls.

    target: a specjax Llama; drafter: a Drafter (e.g. LMDrafter(draft_model) or
    LMDrafter.self_draft(k)); prompts: list of token-id lists (ragged) or int array [B, T].
    Returns GenerateOutput(tokens [B, max_new_tokens], lengths [B], stats) with stats
    target_calls [B] (verification steps), tau [B] (mean tokens emitted per verification, accepted
    + 1) and accepted_hist [B, max_depth + 1]. Greedy output equals `generate`'s; sampled output
    has the same distribution.
    """
    check_sampling(sampling)
    if not isinstance(config, SpecConfig):
        raise ValueError(f"config must be a SpecConfig, got {type(config).__name__}")
    drafter.check_compatible(target)
    config.resolved_rule(sampling, drafter.samples_children)  # raises for an impossible pair
    if config.tree.is_dynamic and not drafter.dynamic_trees:
        raise ValueError(
            f"{type(drafter).__name__} drafts static trees: give it TreeConfig(branching=...), "
            "or use a feature drafter (specjax.load_drafter) for a dynamic tree budget"
        )
    cfg = target.config
    ids, lens = prepare_prompts(prompts, cfg, max_new_tokens, extra_slots=config.tree.num_nodes + 1)
    keys = prepare_keys(key, ids.shape[0])
    target_def, target_params = nnx.split(target)
    drafter_def, drafter_params = nnx.split(drafter)
    return _speculative(
        target_def,
        target_params,
        drafter_def,
        drafter_params,
        jnp.asarray(ids),
        jnp.asarray(lens),
        keys,
        jnp.int32(-1 if eos_id is None else eos_id),
        max_new_tokens=max_new_tokens,
        config=config,
        sampling=sampling,
    )
