"""speculative_generate: draft, verify, accept, commit, stop - one jitted `lax.while_loop` over a
named step function (SpeculativeLoop.step). At B >= decode.COMPACT_MIN_BATCH the loop runs in
phases of fewer rows once rows finish (_steps_until_done), all inside the same jitted program.

Axis letters: B batch, N tree nodes, P = max_depth + 1 path slots, S cache length, V vocab.

Engine state per row: the target cache holds positions [0, lengths); the root (the last emitted
token) is pending at position `lengths`. One step:
  1. the drafter proposes a tree whose node 0 is the root;
  2. the verifier runs the target on the N nodes at positions lengths + depth with the ancestor
     mask (scratch slots [lengths, lengths + N)) and an acceptance rule (specjax.verify) picks
     the accepted path and one extra token;
  3. the engine keeps the emitted tokens up to EOS and the token budget;
  4. the verifier and the drafter commit the accepted path; lengths += n_accepted + 1 and the
     extra token becomes the new root. Rows that finish in this step (or earlier) do not advance,
     so no row ever writes past its reserved slots (cache.tree_reserve).
Randomness of step s of row b comes from fold_in(keys[b], lengths[b]), so a row's output depends
only on its own prompt and key, whatever else is in the batch. One exception: with
SpecConfig.fallback_tau the whole batch stops speculating at once (from the batch's mean tokens
per call), and a sampled row's draws then depend on when that happened; its distribution does not.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax import pre_verify
from specjax.cache import tree_reserve
from specjax.config import SamplingConfig, SpecConfig
from specjax.decode import (
    GenerateOutput,
    check_eos,
    check_sampling,
    choose_tokens,
    prepare_keys,
    prepare_prompts,
    row_phases,
)
from specjax.drafters.base import RootContext
from specjax.module_split import split as split_module
from specjax.rows import put_rows, take_rows, without_caches
from specjax.sharding import check_batch, constrain_rows, mesh_of, onto_mesh, place_rows, use_mesh
from specjax.tree import Acceptance, DraftTree, ancestor_mask, static_ancestor_mask
from specjax.verifiers.full import FullVerifier, nonfinite_rows


@flax.struct.dataclass
class SpecState:
    """The while_loop carry.

    tokens [B, max_new + P] emitted tokens (room for one overshooting step); n_generated [B];
    done [B]; root [B] pending token at position lengths; prev [B] committed token at
    lengths - 1; verifier_state (the target cache); drafter_state; keys [B] per-row PRNG keys;
    eos_id scalar (-1: none); target_calls [B] verification steps while the row was live;
    accepted_hist [B, P] histogram of n_accepted; nonfinite [B] steps with NaN/inf logits;
    draft_hist [B, N] histogram of the draft nodes verified per step; verified_nodes [B] tree
    nodes the target ran on (the step's bucket with a pre-verifier or a text chain, else N);
    pre_verifier_stops [B] steps in which the pre-verifier cut the draft (all three over live
    steps); plain [B] speculation has stopped for the rest of the call
    (SpecConfig.fallback_tau; the same value in every row); plain_steps [B] live steps decoded
    plainly since then.
    """

    tokens: jax.Array
    n_generated: jax.Array
    done: jax.Array
    root: jax.Array
    prev: jax.Array
    verifier_state: object
    drafter_state: object
    keys: jax.Array
    eos_id: jax.Array
    target_calls: jax.Array
    accepted_hist: jax.Array
    nonfinite: jax.Array
    draft_hist: jax.Array
    verified_nodes: jax.Array
    pre_verifier_stops: jax.Array
    plain: jax.Array
    plain_steps: jax.Array


def emitted_tokens(tree_tokens, acceptance, p):
    """Tokens a step emits, [B, P]: the accepted path's tokens then the extra token."""
    path_tokens = jnp.take_along_axis(tree_tokens, acceptance.path, axis=1)[:, 1:]  # [B, P-1]
    path_tokens = jnp.concatenate([path_tokens, jnp.zeros_like(path_tokens[:, :1])], axis=1)
    idx = jnp.arange(p)[None, :]
    n = acceptance.n_accepted[:, None]
    return jnp.where(idx < n, path_tokens, jnp.where(idx == n, acceptance.next_token[:, None], 0))


def _write_tokens(row, emitted, start, n_keep):
    """Write emitted[:n_keep] into row [max_new + P] at start (slots past n_keep keep their 0s)."""
    p = emitted.shape[0]
    old = jax.lax.dynamic_slice(row, (start,), (p,))
    new = jnp.where(jnp.arange(p) < n_keep, emitted, old)
    return jax.lax.dynamic_update_slice(row, new, (start,))


def pruning_pre_verifier(drafter, config: SpecConfig, rule: str):
    """The drafter's pre-verifier when it may prune trees of `config` under `rule`, else None:
    only deterministic (top-k) children may be dropped by what they are (specjax.pre_verify)."""
    pv = getattr(drafter, "pre_verifier", None) if config.pre_verify else None
    if pv is None or rule in ("chain", "tree_sampled", "hsd"):
        return None
    # A text chain's nodes carry none of what the network reads; a pre-verifier that chooses
    # its bucket by measured costs weighs them by their match instead (pre_verify.keep_mask),
    # one that only thresholds the network's predictions is off with a chain.
    if config.tree.text_chain and not pv.shape.costs:
        return None
    return pv if pv.prunes(config.tree.num_nodes) else None


@dataclasses.dataclass(frozen=True)
class SpeculativeLoop:
    """The pieces of one speculative decoding run, traced inside jit.

    target: a merged Llama; drafter: a Drafter; verifier: a Verifier; config / sampling: the
    static settings; max_new_tokens: the budget per row. `init` prefills and builds the first
    SpecState, `step` is one draft-verify-commit step (the while_loop body), `output` turns the
    final state into a GenerateOutput.
    """

    target: object
    drafter: object
    verifier: object
    config: SpecConfig
    sampling: SamplingConfig
    max_new_tokens: int

    @property
    def rule(self) -> str:
        return self.config.resolved_rule(self.sampling, self.drafter.samples_children)

    @property
    def pre_verifier(self):
        return pruning_pre_verifier(self.drafter, self.config, self.rule)

    @property
    def buckets(self) -> tuple[int, ...]:
        tree = self.config.tree
        n = tree.num_nodes
        if self.pre_verifier is None:  # a text chain verified where drafted
            return tree.text_buckets
        chosen = self.pre_verifier.shape.buckets or pre_verify.default_buckets(n)
        chosen = set(chosen) | (set(tree.text_buckets) if tree.text_chain else set())
        return tuple(sorted({b for b in chosen if b < n} | {n}))

    @property
    def verifies_valid_nodes_only(self) -> bool:
        """Whether verification runs on the drafted nodes alone (on the smallest bucket that
        holds them): with a pre-verifier, or a text chain with TreeConfig.text_min_match."""
        return self.pre_verifier is not None or self.config.tree.text_min_match > 0

    @property
    def path_slots(self) -> int:
        return self.config.tree.max_depth + 1

    def cache_len(self, prompt_width: int) -> int:
        """Positions of the static cache. A live row holds lengths = prompt + n_generated - 1 <=
        prompt_width + max_new_tokens - 2 (a row that reaches its budget or EOS stops advancing),
        and a step touches max(N, P) slots from lengths: the bound asserted below."""
        tree = self.config.tree
        size = prompt_width + self.max_new_tokens + tree_reserve(tree.num_nodes, tree.max_depth)
        last_write = prompt_width + self.max_new_tokens - 2 + max(tree.num_nodes, self.path_slots)
        assert last_write <= size, (last_write, size)
        return size

    def init(self, ids, prompt_lens, keys, eos_id) -> SpecState:
        """Prefill prompts ids [B, T] (prompt_lens [B]) and pick each row's first token."""
        logits, vstate, hidden = self.verifier.prefill(
            self.target, ids, prompt_lens, self.cache_len(ids.shape[1]),
            feature_layers=self.drafter.feature_layers, attn_impl=self.config.attn_impl,
        )  # fmt: skip
        return self.start(ids, prompt_lens, keys, eos_id, logits, vstate, hidden)

    def start(self, ids, prompt_lens, keys, eos_id, logits, vstate, hidden) -> SpecState:
        """The first SpecState from what the verifier's prefill returned: logits [B, V] at each
        row's last prompt token, its state, and the hidden states {i: [B, T, M]} the drafter
        reads (the drafter prefills its own state from them)."""
        b, t = ids.shape
        p = self.path_slots
        first = choose_tokens(logits, keys, 0, self.sampling)
        drafter_state = self.drafter.init_state(
            self.target, ids, prompt_lens, self.cache_len(t), config=self.config,
            target_hidden=hidden,
        )  # fmt: skip
        state = SpecState(
            tokens=jnp.zeros((b, self.max_new_tokens + p), jnp.int32).at[:, 0].set(first),
            n_generated=jnp.ones((b,), jnp.int32),
            done=(first == eos_id) | (self.max_new_tokens <= 1),
            root=first,
            prev=jnp.take_along_axis(ids, (prompt_lens - 1)[:, None], axis=1)[:, 0],
            verifier_state=vstate,
            drafter_state=drafter_state,
            keys=keys,
            eos_id=eos_id,
            target_calls=jnp.zeros((b,), jnp.int32),
            accepted_hist=jnp.zeros((b, p), jnp.int32),
            nonfinite=nonfinite_rows(logits).astype(jnp.int32),
            draft_hist=jnp.zeros((b, self.config.tree.num_nodes), jnp.int32),
            verified_nodes=jnp.zeros((b,), jnp.int32),
            pre_verifier_stops=jnp.zeros((b,), jnp.int32),
            plain=jnp.zeros((b,), bool),
            plain_steps=jnp.zeros((b,), jnp.int32),
        )
        return constrain_rows(state, b)

    def tree_mask(self, tree):
        """[B, N, N] ancestor mask, built once per step (a constant for static topologies)."""
        if self.drafter.dynamic_trees:
            return ancestor_mask(tree.parents)
        mask = jnp.asarray(static_ancestor_mask(self.config.tree.parents()))
        return jnp.broadcast_to(mask, tree.parents.shape + mask.shape[-1:])

    def step(self, s: SpecState) -> SpecState:
        """One speculative step for every row (finished rows compute but change nothing); with
        SpecConfig.fallback_tau it also marks whether the batch falls back (run_while then
        continues with plain_step)."""
        new = self.traced_step(s)[0]
        if self.config.fallback_tau is None:
            return new
        return new.replace(plain=self.falls_back(new))

    def run_while(self, going, s: SpecState) -> SpecState:
        """Steps while going(s) [scalar bool]. With a fallback, two loops (speculative steps
        until the batch falls back, then plain ones) rather than a lax.cond in one loop's body,
        whose branches each carry the whole state (the caches) through the loop: ~2% of a
        call measured on a 2-core CPU, see NOTES.md."""
        if self.config.fallback_tau is None:
            return jax.lax.while_loop(going, self.step, s)
        s = jax.lax.while_loop(lambda s: going(s) & ~jnp.all(s.plain), self.step, s)
        return jax.lax.while_loop(going, self.plain_step, s)

    def falls_back(self, s: SpecState) -> jax.Array:
        """[B] whether speculation stops now (the same value in every row): after at least
        fallback_after steps, the batch's tokens per target call are below fallback_tau by
        more than one standard error of their mean, so a speculative step is predicted to cost
        more than the tokens it brings. Why the standard error: a few steps' mean is noisy
        (one step emits 1 to P tokens), and a stop is for the rest of the call."""
        cfg = self.config
        hist = jnp.sum(s.accepted_hist, axis=0).astype(jnp.float32)  # [P] steps by n_accepted
        emitted = jnp.arange(1, self.path_slots + 1, dtype=jnp.float32)
        calls = jnp.maximum(jnp.sum(hist), 1.0)
        mean = jnp.sum(hist * emitted) / calls
        var = jnp.maximum(jnp.sum(hist * emitted**2) / calls - mean**2, 0.0)
        low = (jnp.max(s.target_calls) >= cfg.fallback_after) & (
            mean + jnp.sqrt(var / calls) < cfg.fallback_tau
        )
        return s.plain | low

    def plain_step(self, s: SpecState) -> SpecState:
        """A plain decoding step: the target runs on each row's root alone (a one-node tree, so
        the rules emit the target's own next token: its argmax, or a draw from it), and the
        drafter neither drafts nor commits (its state is not read again in this call). The
        verifier runs as it is: an early-exit verifier still runs its exit on the root."""
        lengths = self.verifier.lengths(s.verifier_state)
        verify_keys = self._step_keys(s, lengths)[1]
        b = s.root.shape[0]
        ones = jnp.ones((b, 1), jnp.float32)
        root = DraftTree(
            tokens=s.root[:, None],
            parents=jnp.full((b, 1), -1, jnp.int32),
            depth=jnp.zeros((b, 1), jnp.int32),
            valid=jnp.ones((b, 1), bool),
            draft_prob=ones,
        )
        rule = "greedy" if self.sampling.greedy else "tree_onehot"
        v = self.verifier.verify(
            s.verifier_state, self.target, root, ancestor_mask(root.parents), verify_keys,
            rule=rule, config=self.config, sampling=self.sampling, feature_layers=(),
        )  # fmt: skip
        live = ~s.done
        new = self._emit(s, root, v, n_verified=jnp.int32(1), cut=jnp.zeros_like(live),
                         commit_drafter=lambda advance: s.drafter_state)  # fmt: skip
        return new.replace(plain_steps=s.plain_steps + live)

    def _step_keys(self, s: SpecState, lengths) -> tuple[jax.Array, jax.Array]:
        """(draft keys [B], verify keys [B]) of this step: from each row's key and length."""
        step_keys = jax.vmap(jax.random.fold_in)(s.keys, lengths)
        split = jax.vmap(lambda k: jax.random.split(k, 2))(step_keys)
        return split[:, 0], split[:, 1]

    def traced_step(self, s: SpecState) -> tuple[SpecState, DraftTree, Acceptance]:
        """`step`, also returning the step's draft tree and its acceptance (what calibration
        runs record: specjax.acceptance)."""
        cfg = self.config
        lengths = self.verifier.lengths(s.verifier_state)
        draft_keys, verify_keys = self._step_keys(s, lengths)

        ctx = RootContext(root=s.root, prev=s.prev, lengths=lengths)
        tree, drafter_state = self.drafter.propose(
            s.drafter_state, self.target, ctx, draft_keys, config=cfg, sampling=self.sampling
        )
        live = ~s.done
        kwargs = dict(
            rule=self.rule,
            config=cfg,
            sampling=self.sampling,
            feature_layers=self.drafter.feature_layers,
        )
        pv = self.pre_verifier
        if not self.verifies_valid_nodes_only:
            v = self.verifier.verify(
                s.verifier_state, self.target, tree, self.tree_mask(tree), verify_keys, **kwargs
            )
            n_verified = jnp.int32(cfg.tree.num_nodes)
            drafter_acc, drafter_hidden, cut = v.acceptance, v.hidden, jnp.zeros_like(live)
        else:
            if pv is None:
                keep = pre_verify.valid_mask(tree, live)
            else:
                keep = pre_verify.keep_mask(
                    tree, pv, live, cfg.tree.max_depth, self.buckets, cfg.tree.text_chain
                )
            cut = jnp.sum(keep, axis=1) < jnp.sum(tree.valid, axis=1)
            tree, order = pre_verify.compact(tree, keep)
            v, n_verified = pre_verify.verify_in_buckets(
                self.verifier, s.verifier_state, self.target, tree, verify_keys, self.buckets,
                **kwargs,
            )  # fmt: skip
            drafter_acc = pre_verify.to_drafter_indices(v.acceptance, order)
            drafter_hidden = pre_verify.hidden_to_drafter_order(v.hidden, order)

        def commit_drafter(advance):
            return self.drafter.commit(
                drafter_state,
                drafter_acc,
                advance,
                live=live,
                config=cfg,
                target=self.target,
                target_hidden=drafter_hidden,
            )

        new = self._emit(s, tree, v, n_verified=n_verified, cut=cut, commit_drafter=commit_drafter)
        return new, tree, v.acceptance

    def _emit(self, s: SpecState, tree: DraftTree, v, *, n_verified, cut, commit_drafter):
        """The state after verification v of tree: each live row keeps its emitted tokens up to
        EOS and its budget, the verifier commits the accepted path, commit_drafter(advance [B])
        gives the drafter's new state, and the counters count the step."""
        p, acc, live = self.path_slots, v.acceptance, ~s.done
        emitted = emitted_tokens(tree.tokens, acc, p)  # [B, P]
        n_emit = acc.n_accepted + 1
        is_eos = (emitted == s.eos_id) & (jnp.arange(p)[None, :] < n_emit[:, None])
        first_eos = jnp.argmax(is_eos, axis=1)
        n_keep = jnp.where(is_eos.any(axis=1), first_eos + 1, n_emit)
        n_keep = jnp.minimum(n_keep, self.max_new_tokens - s.n_generated)
        n_keep = jnp.where(live, n_keep, 0)
        tokens = jax.vmap(_write_tokens)(s.tokens, emitted, s.n_generated, n_keep)
        n_generated = s.n_generated + n_keep
        done = s.done | is_eos.any(axis=1) | (n_generated >= self.max_new_tokens)

        # Rows finishing now keep their length: their next steps (while others run) then write
        # inside the slots reserved past their last committed position.
        advance = jnp.where(live & ~done, n_emit, 0)
        vstate = self.verifier.commit(v.state, acc, advance, config=self.config)
        drafter_state = commit_drafter(advance)
        last_node = jnp.take_along_axis(acc.path, acc.n_accepted[:, None], axis=1)
        last_accepted = jnp.take_along_axis(tree.tokens, last_node, axis=1)[:, 0]
        hist = jax.nn.one_hot(acc.n_accepted, p, dtype=jnp.int32)
        n_draft = jnp.sum(tree.valid, axis=1) - 1
        draft_hist = jax.nn.one_hot(n_draft, self.config.tree.num_nodes, dtype=jnp.int32)
        new = s.replace(
            tokens=tokens,
            n_generated=n_generated,
            done=done,
            root=jnp.where(live, acc.next_token, s.root),
            prev=jnp.where(live, last_accepted, s.prev),
            verifier_state=vstate,
            drafter_state=drafter_state,
            target_calls=s.target_calls + live,
            accepted_hist=s.accepted_hist + jnp.where(live[:, None], hist, 0),
            nonfinite=s.nonfinite + (live & v.nonfinite),
            draft_hist=s.draft_hist + jnp.where(live[:, None], draft_hist, 0),
            verified_nodes=s.verified_nodes + jnp.where(live, n_verified, 0),
            pre_verifier_stops=s.pre_verifier_stops + (live & cut),
        )
        return constrain_rows(new, s.done.shape[0])

    def output(self, final: SpecState) -> GenerateOutput:
        p, max_new = self.path_slots, self.max_new_tokens
        steps = jnp.maximum(final.target_calls, 1)
        accepted_total = jnp.sum(final.accepted_hist * jnp.arange(p)[None, :], axis=1)
        stats = {
            "target_calls": final.target_calls,
            "accepted_hist": final.accepted_hist,
            "tau": (accepted_total + final.target_calls) / steps,
            "nonfinite_logits": final.nonfinite,
            "draft_len": jnp.sum(final.draft_hist * jnp.arange(self.config.tree.num_nodes), 1)
            / steps,
            "draft_len_hist": final.draft_hist,
            "verified_nodes": final.verified_nodes / steps,
            "pre_verifier_stops": final.pre_verifier_stops,
            "plain_steps": final.plain_steps,
        }
        if hasattr(self.drafter, "stats"):
            stats.update(self.drafter.stats(final.drafter_state))
        if hasattr(self.verifier, "stats"):
            stats.update(self.verifier.stats(final.verifier_state))
        tokens = final.tokens[:, :max_new]
        tokens = jnp.where(jnp.arange(max_new)[None, :] < final.n_generated[:, None], tokens, 0)
        return GenerateOutput(tokens=tokens, lengths=final.n_generated, stats=stats)


def _merged_loop(
    target_def, target_params, drafter_def, drafter_params, verifier_def, verifier_params,
    *, max_new_tokens, config, sampling,
) -> SpeculativeLoop:  # fmt: skip
    """The SpeculativeLoop of split modules (inside jit: graph definitions are static)."""
    return SpeculativeLoop(
        target=nnx.merge(target_def, target_params),
        drafter=nnx.merge(drafter_def, drafter_params),
        verifier=nnx.merge(verifier_def, verifier_params),
        config=config,
        sampling=sampling,
        max_new_tokens=max_new_tokens,
    )


# The static arguments of the jitted loop (also read by tests that compile it with other
# compiler options).
SPECULATIVE_STATIC_ARGS = (
    "target_def", "drafter_def", "verifier_def", "max_new_tokens", "config", "sampling", "mesh"
)  # fmt: skip


@functools.partial(jax.jit, static_argnames=SPECULATIVE_STATIC_ARGS)
def _speculative(
    target_def,
    target_params,
    drafter_def,
    drafter_params,
    verifier_def,
    verifier_params,
    ids,
    prompt_lens,
    keys,
    eos_id,
    *,
    max_new_tokens: int,
    config: SpecConfig,
    sampling: SamplingConfig,
    mesh=None,
):
    loop = _merged_loop(
        target_def, target_params, drafter_def, drafter_params, verifier_def, verifier_params,
        max_new_tokens=max_new_tokens, config=config, sampling=sampling,
    )  # fmt: skip
    with use_mesh(mesh):
        state = loop.init(ids, prompt_lens, keys, eos_id)
        return loop.output(_steps_until_done(loop, state, compact=mesh is None))


# A speculative step compiles to far more than a decode step, so its phases stop at B/4, and
# calls of a few steps (budgets below SPECULATIVE_PHASE_TOKENS) have nothing to gain from them.
SPECULATIVE_PHASES = 3
SPECULATIVE_PHASE_TOKENS = 32


def _steps_until_done(loop: SpeculativeLoop, state: SpecState, *, compact: bool):
    """Run loop.step until every row is done; the final state (caches dropped when compacting).

    Finished rows stop costing in large batches, as in specjax.decode.generate: the steps run
    in phases of B, B/2 and B/4 rows (row_phases, SPECULATIVE_PHASES; budgets of at least
    SPECULATIVE_PHASE_TOKENS); a phase ends when its live rows fit in the next, which continues
    on those rows (specjax.rows.take_rows). A row's draws depend only on its own key and
    length, so its output is the same as in one loop over the whole batch; except that with
    fallback_tau the batch's stop (falls_back) is judged on the phase's rows, so the step a
    row turns plain at may differ: greedy output is still the same, sampled output keeps its
    distribution (plain and speculative steps are both exact). What finished rows
    report (tokens, counters) is kept aside without their caches and the rows are put back in
    their places at the end."""
    b = state.done.shape[0]
    compact = compact and loop.max_new_tokens >= SPECULATIVE_PHASE_TOKENS
    phases = row_phases(b, compact, max_phases=SPECULATIVE_PHASES)
    if len(phases) == 1:
        return loop.run_while(lambda s: ~jnp.all(s.done), state)
    rows = jnp.arange(b, dtype=jnp.int32)
    report = without_caches(state)
    for i, size in enumerate(phases):
        if i:
            report = put_rows(report, without_caches(state), rows, b)
            keep = jnp.argsort(state.done, stable=True)[:size]
            state, rows = take_rows(state, keep, state.done.shape[0]), rows[keep]
        smaller = phases[i + 1] if i + 1 < len(phases) else 0

        def going(s: SpecState, smaller=smaller):
            return ~jnp.all(s.done) & (jnp.sum(~s.done) > smaller)

        state = loop.run_while(going, state)
    return put_rows(report, without_caches(state), rows, b)


@functools.partial(
    jax.jit,
    static_argnames=(
        "target_def", "drafter_def", "verifier_def", "max_new_tokens", "config", "sampling"
    ),
)  # fmt: skip
def _init_state(
    target_def, target_params, drafter_def, drafter_params, verifier_def, verifier_params,
    ids, prompt_lens, keys, eos_id, *, max_new_tokens, config, sampling,
):  # fmt: skip
    loop = _merged_loop(
        target_def, target_params, drafter_def, drafter_params, verifier_def, verifier_params,
        max_new_tokens=max_new_tokens, config=config, sampling=sampling,
    )  # fmt: skip
    return loop.init(ids, prompt_lens, keys, eos_id)


@functools.partial(
    jax.jit,
    static_argnames=(
        "target_def", "drafter_def", "verifier_def", "max_new_tokens", "config", "sampling"
    ),
    donate_argnames=("state",),
)  # fmt: skip
def _traced_step(
    target_def, target_params, drafter_def, drafter_params, verifier_def, verifier_params,
    state, *, max_new_tokens, config, sampling,
):  # fmt: skip
    loop = _merged_loop(
        target_def, target_params, drafter_def, drafter_params, verifier_def, verifier_params,
        max_new_tokens=max_new_tokens, config=config, sampling=sampling,
    )  # fmt: skip
    live = ~state.done
    new, tree, acc = loop.traced_step(state)
    return new, tree.replace(draft_dist=None), acc, live


class SteppedRun:
    """A speculative run one step at a time from Python (calibration and cost measurement): the
    same init and step as speculative_generate's while_loop, each jitted on its own.

    `step()` -> (tree, acceptance, live [B]): the step's draft tree (draft_dist dropped), what
    was accepted, and which rows were live in it. `done` is True once every row finished.
    """

    def __init__(
        self,
        target,
        drafter,
        prompts,
        *,
        max_new_tokens: int,
        config: SpecConfig,
        sampling: SamplingConfig = SamplingConfig(),
        key=None,
        eos_id: int | None = None,
        verifier=None,
    ):
        verifier, ids, lens, keys, eos = _prepare_run(
            target, drafter, prompts, max_new_tokens, config, sampling, key, eos_id, verifier
        )
        target_def, target_params = split_module(target)
        drafter_def, drafter_params = split_module(drafter)
        verifier_def, verifier_params = split_module(verifier)
        self._static = dict(max_new_tokens=max_new_tokens, config=config, sampling=sampling)
        self._parts = (
            target_def, target_params, drafter_def, drafter_params, verifier_def, verifier_params
        )  # fmt: skip
        self.state = _init_state(
            *self._parts,
            jnp.asarray(ids),
            jnp.asarray(lens),
            keys,
            jnp.int32(eos),
            **self._static,
        )

    @property
    def done(self) -> bool:
        return bool(jnp.all(self.state.done))

    def step(self):
        self.state, tree, acc, live = _traced_step(*self._parts, self.state, **self._static)
        return tree, acc, live


def _prepare_run(target, drafter, prompts, max_new_tokens, config, sampling, key, eos_id, verifier):
    """The checks and host-side inputs shared by speculative_decode and SteppedRun: the
    verifier (FullVerifier when None), the padded prompts ids [B, T] and lengths [B] with room
    for a step's tree, the per-row keys [B] and the EOS id. Raises ValueError before anything
    is compiled."""
    check_speculative_args(target, drafter, config, sampling, verifier)
    verifier = FullVerifier() if verifier is None else verifier
    tree = config.tree
    eos = check_eos(eos_id, target.config)
    ids, lens = prepare_prompts(
        prompts,
        target.config,
        max_new_tokens,
        extra_slots=tree_reserve(tree.num_nodes, tree.max_depth),
    )
    return verifier, ids, lens, prepare_keys(key, ids.shape[0]), eos


def check_speculative_args(
    target, drafter, config: SpecConfig, sampling: SamplingConfig, verifier=None
) -> None:
    """Every check that needs no compilation: raises ValueError naming the problem."""
    check_sampling(sampling)
    if not isinstance(config, SpecConfig):
        raise ValueError(f"config must be a SpecConfig, got {type(config).__name__}")
    drafter.check_compatible(target)
    if hasattr(verifier, "check_compatible"):
        verifier.check_compatible(target)
    config.resolved_rule(sampling, drafter.samples_children)  # raises for an impossible pair
    if config.tree.is_dynamic and not drafter.dynamic_trees:
        raise ValueError(
            f"{type(drafter).__name__} drafts static trees: give it TreeConfig(branching=...), "
            "or use a feature drafter (specjax.load_drafter) for a dynamic tree budget"
        )
    if config.tree.text_chain and not getattr(drafter, "text_chains", False):
        raise ValueError(
            f"{type(drafter).__name__} cannot add a text chain to its trees (TreeConfig."
            "text_chain): use a feature drafter (specjax.load_drafter), or an n-gram drafter "
            "with its text lookup for text alone"
        )


def speculative_decode(
    target,
    drafter,
    prompts,
    *,
    max_new_tokens: int,
    config: SpecConfig,
    sampling: SamplingConfig = SamplingConfig(),
    key=None,
    eos_id: int | None = None,
    verifier=None,
) -> GenerateOutput:
    """The engine behind specjax.speculative_generate, for an explicit SpecConfig (the
    hardware-aware default is resolved above the engine, in specjax.api). Arguments and output as
    speculative_generate's."""
    verifier, ids, lens, keys, eos = _prepare_run(
        target, drafter, prompts, max_new_tokens, config, sampling, key, eos_id, verifier
    )
    target_def, target_params = split_module(target)
    drafter_def, drafter_params = split_module(drafter)
    verifier_def, verifier_params = split_module(verifier)
    ids, lens = jnp.asarray(ids), jnp.asarray(lens)
    mesh = mesh_of(target_params)
    if mesh is not None:
        # A target on a mesh (load(mesh=...), shard_model): rows over 'data'; the drafter and
        # the verifier's own weights are small, so they are replicated unless already placed
        # on the mesh (a draft model put there with shard_model stays split).
        check_batch(ids.shape[0], mesh)
        ids, lens, keys = place_rows((ids, lens, keys), mesh)
        drafter_params, verifier_params = onto_mesh((drafter_params, verifier_params), mesh)
    return _speculative(
        target_def,
        target_params,
        drafter_def,
        drafter_params,
        verifier_def,
        verifier_params,
        ids,
        lens,
        keys,
        jnp.int32(eos),
        max_new_tokens=max_new_tokens,
        config=config,
        sampling=sampling,
        mesh=mesh,
    )
