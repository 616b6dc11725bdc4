"""HiSpec's three-level step: early-exit drafting, intermediate verification and buffered full
verification, sharing one target cache, in one jitted `lax.while_loop`.

Axis letters: B batch, k draft tokens per round, C buffer slots, S cache length, V vocab,
M model dim.

Levels (E_d < E_v < L layers of the target; exit heads from specjax.models.exit_head):
1. draft: layers [0, E_d) and the draft exit, one token at a time from the pending root c:
   c, d_1 .. d_k (k + 1 single-token passes; the last only gives d_k its K/V). Those K/V are the
   target's own for layers [0, E_d): there is no drafter cache and nothing is recomputed.
2. intermediate: layers [E_d, E_v) on the block [c, d_1 .. d_k] (its layer-E_d states from
   level 1) and the verify exit judge the drafts with q = the draft exit's distribution
   (greedy: argmax match; sampling: standard speculative sampling). The accepted tokens and
   the next token c' (correction or bonus) are an exact sample of the verify exit's model.
3. full: the accepted positions are buffered with their layer-E_v states and the verify exit's
   distributions. Once a row holds at least `buffer` positions (or its buffered tokens reach its
   budget or hold EOS), layers [E_v, L) run on the buffer and judge the buffered tokens, c'
   included, with q = the verify exit's distribution. c' has no layer pass of its own yet, so
   when every buffered token is accepted no bonus token is drawn and c' stays the pending root;
   on a rejection the target's correction becomes the root. Nothing needs rolling back: every
   layer range holds the accepted positions in place, and what lies past them is scratch.

Per row: positions [0, F) are committed in every layer; the buffer holds positions [F, F + m)
(layers [0, E_v) computed) and the tokens u_F .. u_{F+m}, where u_F was emitted by the target
and u_{F+m} is the pending root c. A round appends n + 1 positions (n accepted drafts); a flush
emits the target-accepted tokens and sets F to the new root's position, m to 0.

Why it is exact: level 2 is speculative decoding of the verify exit's model by the draft exit's,
so the buffered tokens are that model's samples, each drawn given everything before it. Level
3 is speculative decoding of the target with that model as drafter; the buffer ends only after
a round's last token (a decision taken from what produced the tokens so far, never from tokens
after it), the condition speculative sampling needs for a draft of variable length. Randomness
of a row's r-th round comes from fold_in(key, r), so a row's output does not depend on the other
rows. tests/test_hispec.py checks greedy equality and the sampled distribution by exact
enumeration.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax import token_choice
from specjax import verify as rules
from specjax.branching import cond_in_place
from specjax.cache import KVCache
from specjax.config import SamplingConfig
from specjax.decode import (
    GenerateOutput,
    check_eos,
    check_sampling,
    choose_tokens,
    prepare_keys,
    prepare_prompts,
)
from specjax.models.exit_head import ExitLogits
from specjax.module_split import split as split_module
from specjax.sampling import apply_sampling, sample
from specjax.speculative import _write_tokens
from specjax.tree import DraftTree, causal_mask, chain_tree
from specjax.verifiers.full import FullVerifier, nonfinite_rows

# The settings used when a checkpoint's hispec.json has none ("settings": {"draft_len": ...,
# "buffer": ...}). The faster of the two measured on SmolLM2 (experiments/results/hispec.md):
# exits that agree with the level above on about a third of tokens waste longer drafts.
DEFAULT_DRAFT_LEN = 1
DEFAULT_BUFFER = 2


class HiSpec(nnx.Module):
    """A HiSpec drafter: the target's draft exit and verify exit with the step's two settings.

    draft_len: k, tokens the draft exit proposes per round; buffer: positions a row collects
    before the full target verifies them. `speculative_generate(target, hispec, prompts)` runs
    the three-level loop of this module (specjax.api dispatches on the type)."""

    def __init__(self, draft_head, verify_head, target, *, draft_len: int = DEFAULT_DRAFT_LEN,
                 buffer: int = DEFAULT_BUFFER):  # fmt: skip
        if not draft_head.layer < verify_head.layer:
            raise ValueError(
                f"the draft exit (layer {draft_head.layer}) must lie below the verify exit "
                f"(layer {verify_head.layer}): pass the heads as (draft, verify)"
            )
        check_settings(draft_len, buffer)
        self.draft_exit = ExitLogits(draft_head, target)
        self.verify_exit = ExitLogits(verify_head, target)
        self.draft_len, self.buffer = int(draft_len), int(buffer)

    @classmethod
    def from_checkpoint(cls, path, target, **settings) -> HiSpec:
        """Both exits of an exit-heads directory (checkpoints/<target>-hispec), with the settings
        its hispec.json names unless given here (draft_len=, buffer=)."""
        from specjax.train.exit_heads import load_exit_heads

        model = getattr(target, "model", target)
        heads = load_exit_heads(path, model)
        chosen = {**checkpoint_settings(path), **settings}
        return cls(heads["draft"], heads["verify"], model, **chosen)

    def with_settings(self, *, draft_len: int | None = None, buffer: int | None = None) -> HiSpec:
        """A copy sharing the exits, with other settings (None: keep)."""
        copy = nnx.clone(self)
        copy.draft_len = self.draft_len if draft_len is None else draft_len
        copy.buffer = self.buffer if buffer is None else buffer
        check_settings(copy.draft_len, copy.buffer)
        return copy

    def check_compatible(self, target) -> None:
        """ValueError, saying what to do, when the exits cannot read `target`'s layers."""
        self.draft_exit.check_compatible(target)
        self.verify_exit.check_compatible(target)

    @property
    def slots(self) -> int:
        """C: buffer slots (a row flushes once it holds `buffer`; a round adds up to k + 1)."""
        return self.buffer + self.draft_len

    @property
    def reserve(self) -> int:
        """Cache slots a call needs past its prompt width and max_new_tokens (HiSpecStep.
        cache_len): the buffer's, with a margin of 2."""
        return self.slots + 2


def checkpoint_settings(path) -> dict:
    """{"draft_len", "buffer"} of an exit-heads directory: its hispec.json's "settings" over
    the defaults (ValueError for a setting HiSpec does not have)."""
    header = json.loads((Path(path) / "hispec.json").read_text())
    chosen = {"draft_len": DEFAULT_DRAFT_LEN, "buffer": DEFAULT_BUFFER}
    unknown = sorted(set(header.get("settings", {})) - set(chosen))
    if unknown:
        raise ValueError(
            f"{Path(path) / 'hispec.json'}: unknown settings {unknown}; a HiSpec setting is "
            f"one of {sorted(chosen)}"
        )
    return {**chosen, **header.get("settings", {})}


def check_settings(draft_len, buffer) -> None:
    """ValueError for settings a three-level step cannot run with."""
    if not (isinstance(draft_len, int) and draft_len >= 1):
        raise ValueError(f"HiSpec draft_len must be an int >= 1, got {draft_len!r}")
    if not (isinstance(buffer, int) and buffer >= 1):
        raise ValueError(f"HiSpec buffer must be an int >= 1, got {buffer!r}")


@flax.struct.dataclass
class HiSpecState:
    """The while_loop carry.

    tokens [B, max_new + C + 1] emitted tokens; n_generated [B]; done [B]; cache: the target's
    KVCache (its lengths field unused: the per-range lengths are committed and committed +
    buffered); committed [B] F; buffered [B] m; buf_tokens [B, C + 1] u_F .. u_{F+m} (slot m:
    the pending root); buf_hidden [B, C, M] layer-E_v states of positions F .. F + C - 1;
    buf_dist [B, C, V] the verify exit's distribution there ([B, C, 1] unused when greedy);
    keys [B]; eos_id; rounds [B] rounds while live; intermediate_drafted / _accepted [B] drafts
    judged / accepted by the verify exit; full_calls [B] flushes; full_accepted [B] buffered
    tokens the target accepted; emitted_hist [B, C + 1] histogram over flushes of the tokens
    each flush's verification yields minus one (the engine's accepted_hist: a row's last flush
    counted whole where EOS or max_new_tokens cut it); nonfinite [B] flushes with NaN/inf target
    logits.
    """

    tokens: jax.Array
    n_generated: jax.Array
    done: jax.Array
    cache: KVCache
    committed: jax.Array
    buffered: jax.Array
    buf_tokens: jax.Array
    buf_hidden: jax.Array
    buf_dist: jax.Array
    keys: jax.Array
    eos_id: jax.Array
    rounds: jax.Array
    intermediate_drafted: jax.Array
    intermediate_accepted: jax.Array
    full_calls: jax.Array
    full_accepted: jax.Array
    emitted_hist: jax.Array
    nonfinite: jax.Array


def _put_rows(dest, block, offsets):
    """dest [B, X, ...] with block [B, Y, ...] written at offsets [B] along axis 1, row by row."""

    def one(d, blk, off):
        start = (off,) + (0,) * (d.ndim - 1)
        return jax.lax.dynamic_update_slice(d, blk.astype(d.dtype), start)

    return jax.vmap(one)(dest, block, offsets)


@dataclasses.dataclass(frozen=True)
class HiSpecLoop:
    """The pieces of one HiSpec run, traced inside jit (target and hispec merged modules)."""

    target: object
    hispec: HiSpec
    sampling: SamplingConfig
    max_new_tokens: int
    attn_impl: str = "auto"

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def cache_len(self, prompt_width: int) -> int:
        """A live row has F <= prompt_width + max_new - 2 and writes at most C + 1 slots past
        it (a round starts with m < buffer and writes k + 1; a flush writes C). A finished row
        keeps computing rounds from F with m = 0 (its last flush emptied the buffer), so it
        stays within the same bound."""
        return prompt_width + self.max_new_tokens + self.hispec.reserve

    def _dist(self, logits):
        return logits if self.greedy else apply_sampling(logits, self.sampling)

    def init(self, ids, prompt_lens, keys, eos_id) -> HiSpecState:
        b, t = ids.shape
        c, vocab = self.hispec.slots, self.target.config.vocab_size
        logits, cache, _ = FullVerifier().prefill(
            self.target, ids, prompt_lens, self.cache_len(t), feature_layers=(),
            attn_impl=self.attn_impl,
        )  # fmt: skip
        first = choose_tokens(logits, keys, 0, self.sampling)
        zeros = jnp.zeros((b,), jnp.int32)
        d = self.target.config.d_model
        return HiSpecState(
            tokens=jnp.zeros((b, self.max_new_tokens + c + 1), jnp.int32).at[:, 0].set(first),
            n_generated=jnp.ones((b,), jnp.int32),
            done=(first == eos_id) | (self.max_new_tokens <= 1),
            cache=cache,
            committed=prompt_lens.astype(jnp.int32),
            buffered=zeros,
            buf_tokens=jnp.zeros((b, c + 1), jnp.int32).at[:, 0].set(first),
            buf_hidden=jnp.zeros((b, c, d), jnp.dtype(self.target.config.dtype)),
            buf_dist=jnp.zeros((b, c, 1 if self.greedy else vocab), jnp.float32),
            keys=keys,
            eos_id=eos_id,
            rounds=zeros,
            intermediate_drafted=zeros,
            intermediate_accepted=zeros,
            full_calls=zeros,
            full_accepted=zeros,
            emitted_hist=jnp.zeros((b, c + 1), jnp.int32),
            nonfinite=nonfinite_rows(logits).astype(jnp.int32),
        )

    def draft(self, cache, root, start, keys):
        """Level 1: layers [0, E_d) from the root at positions start [B] on. Returns (cache,
        drafts [B, k], q [B, k, V] (None when greedy), layer-E_d states [B, k + 1, M])."""
        e_d, k = self.hispec.draft_exit.layer, self.hispec.draft_len
        b = root.shape[0]
        one = jnp.ones((b, 1, 1), bool)

        def lower(cache, token, j):
            out = self.target(
                token[:, None], positions=(start + j)[:, None],
                cache=cache.replace(lengths=start + j), tree_mask=one, layer_range=(0, e_d),
                return_hidden=(e_d,), compute_logits=False, attn_impl=self.attn_impl,
            )  # fmt: skip
            return out.cache, out.hidden[e_d][:, 0]

        def body(carry, j):
            cache, token = carry
            cache, h = lower(cache, token, j)
            logits = self.hispec.draft_exit(h)  # [B, V]
            if self.greedy:
                nxt, q = token_choice.argmax(logits), jnp.zeros((b, 1))
            else:
                q = apply_sampling(logits, self.sampling)
                step_keys = jax.vmap(jax.random.fold_in)(keys, jnp.broadcast_to(j, (b,)))
                nxt = jax.vmap(sample)(step_keys, q)
            return (cache, nxt), (nxt, q, h)

        (cache, last), (drafts, q, hs) = jax.lax.scan(body, (cache, root), jnp.arange(k))
        cache, h_last = lower(cache, last, k)
        hidden = jnp.concatenate([jnp.swapaxes(hs, 0, 1), h_last[:, None]], axis=1)
        drafts = jnp.swapaxes(drafts, 0, 1)
        return cache, drafts, None if self.greedy else jnp.swapaxes(q, 0, 1), hidden

    def intermediate(self, cache, root, drafts, q, hidden, start, key):
        """Level 2: layers [E_d, E_v) on the k + 1 positions and the verify exit's judgement.
        Returns (cache, Acceptance, layer-E_v states [B, k + 1, M], p_v [B, k + 1, V or 1])."""
        e_d, e_v, k = (
            self.hispec.draft_exit.layer,
            self.hispec.verify_exit.layer,
            self.hispec.draft_len,
        )
        b = root.shape[0]
        out = self.target(
            None, hidden=hidden, positions=start[:, None] + jnp.arange(k + 1)[None, :],
            cache=cache.replace(lengths=start), tree_mask=causal_mask(b, k + 1),
            layer_range=(e_d, e_v), return_hidden=(e_v,), compute_logits=False,
            attn_impl=self.attn_impl,
        )  # fmt: skip
        h_v = out.hidden[e_v]
        p_v = self._dist(self.hispec.verify_exit(h_v))  # [B, k + 1, V]
        if self.greedy:
            tree = chain_tree(root, drafts, jnp.ones(drafts.shape, jnp.float32))
            acc = rules.verify_greedy(tree, p_v, key, k)
            kept = jnp.zeros(p_v.shape[:2] + (1,), jnp.float32)
        else:
            q_full = jnp.pad(q, ((0, 0), (0, 1), (0, 0)))
            prob = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
            acc = rules.verify_chain(chain_tree(root, drafts, prob, q_full), p_v, key, k)
            kept = p_v
        return out.cache, acc, h_v, kept

    def flush(self, s: HiSpecState, flushing, key):
        """Level 3 for rows `flushing` [B]: layers [E_v, L) on the buffer and the target's
        judgement of buffered tokens. Returns (n_accepted [B], next_token [B], all_accepted
        [B], cache, nonfinite [B])."""
        e_v, n = self.hispec.verify_exit.layer, self.target.config.n_layers
        c = self.hispec.slots
        b = flushing.shape[0]
        f = s.committed
        out = self.target(
            None, hidden=s.buf_hidden, positions=f[:, None] + jnp.arange(c)[None, :],
            cache=s.cache.replace(lengths=f), tree_mask=causal_mask(b, c), layer_range=(e_v, n),
            attn_impl=self.attn_impl,
        )  # fmt: skip
        p = jnp.pad(self._dist(out.logits), ((0, 0), (0, 1), (0, 0)))  # slot C never judges
        m = jnp.where(flushing, s.buffered, 0)
        slot = jnp.arange(c + 1)[None, :]
        chain = DraftTree(
            tokens=s.buf_tokens,
            parents=jnp.broadcast_to(slot - 1, s.buf_tokens.shape).astype(jnp.int32),
            depth=jnp.broadcast_to(slot, s.buf_tokens.shape).astype(jnp.int32),
            valid=slot <= m[:, None],
            draft_prob=jnp.ones(s.buf_tokens.shape, jnp.float32),
            draft_dist=None if self.greedy else jnp.pad(s.buf_dist, ((0, 0), (0, 1), (0, 0))),
        )
        acc = rules.RULES["greedy" if self.greedy else "chain"](chain, p, key, c)
        all_ok = acc.n_accepted >= m
        judged = (jnp.arange(c) < m[:, None])[..., None]  # slots past m hold scratch
        nonfinite = nonfinite_rows(jnp.where(judged, out.logits, 0.0))
        return acc.n_accepted, acc.next_token, all_ok, out.cache, nonfinite

    def step(self, s: HiSpecState) -> HiSpecState:
        """One round for every live row, then a flush of the rows that need one."""
        k, c, n_buffer = self.hispec.draft_len, self.hispec.slots, self.hispec.buffer
        live = ~s.done
        keys = jax.vmap(jax.random.fold_in)(s.keys, s.rounds + 1)  # 0 chose the first token
        keys = jax.vmap(lambda x: jax.random.split(x, 3))(keys)
        m = s.buffered
        start = s.committed + m
        root = jnp.take_along_axis(s.buf_tokens, m[:, None], axis=1)[:, 0]

        cache, drafts, q, hidden = self.draft(s.cache, root, start, keys[:, 0])
        cache, acc, h_v, p_v = self.intermediate(cache, root, drafts, q, hidden, start, keys[:, 1])
        n2 = acc.n_accepted
        # Append positions m .. m + n2 (slots past them are scratch) and the next root.
        buf_hidden = _put_rows(s.buf_hidden, h_v, m)
        buf_dist = _put_rows(s.buf_dist, p_v, m)
        buf_tokens = _put_rows(s.buf_tokens, drafts, m + 1)
        buf_tokens = _put_rows(buf_tokens, acc.next_token[:, None], m + n2 + 1)
        m_new = m + n2 + 1
        keep = live[:, None]
        s = s.replace(
            cache=cache,
            buffered=jnp.where(live, m_new, m),
            buf_tokens=jnp.where(keep, buf_tokens, s.buf_tokens),
            buf_hidden=jnp.where(keep[..., None], buf_hidden, s.buf_hidden),
            buf_dist=jnp.where(keep[..., None], buf_dist, s.buf_dist),
            rounds=s.rounds + live,
            intermediate_drafted=s.intermediate_drafted + live * k,
            intermediate_accepted=s.intermediate_accepted + jnp.where(live, n2, 0),
        )

        slot = jnp.arange(c + 1)[None, :]
        holds_eos = jnp.any((s.buf_tokens == s.eos_id) & (slot >= 1)
                            & (slot <= s.buffered[:, None]), axis=1)  # fmt: skip
        flushing = live & (
            (s.buffered >= n_buffer)
            | (s.n_generated + s.buffered >= self.max_new_tokens)
            | holds_eos
        )
        # In place: a lax.cond here copied the whole state (the target's cache) every round.
        return cond_in_place(
            jnp.any(flushing), lambda st: self._flushed(st, flushing, keys[:, 2]), s
        )

    def _flushed(self, s: HiSpecState, flushing, key) -> HiSpecState:
        n3, correction, all_ok, cache, nonfinite = self.flush(s, flushing, key)
        m = s.buffered
        c = self.hispec.slots
        # Emitted: u_{F+1} .. u_{F+n3}, then the correction when the target rejected one.
        idx = jnp.arange(c + 1)[None, :]
        shifted = jnp.concatenate([s.buf_tokens[:, 1:], jnp.zeros_like(s.buf_tokens[:, :1])], 1)
        emitted = jnp.where(idx < n3[:, None], shifted, 0)
        emitted = jnp.where((idx == n3[:, None]) & ~all_ok[:, None], correction[:, None], emitted)
        n_emit = jnp.where(all_ok, m, n3 + 1)
        is_eos = (emitted == s.eos_id) & (idx < n_emit[:, None])
        n_keep = jnp.where(is_eos.any(axis=1), jnp.argmax(is_eos, axis=1) + 1, n_emit)
        n_keep = jnp.minimum(n_keep, self.max_new_tokens - s.n_generated)
        n_keep = jnp.where(flushing, n_keep, 0)
        tokens = jax.vmap(_write_tokens)(s.tokens, emitted, s.n_generated, n_keep)
        n_generated = s.n_generated + n_keep
        done = s.done | (flushing & (is_eos.any(axis=1) | (n_generated >= self.max_new_tokens)))
        root = jnp.where(all_ok, jnp.take_along_axis(s.buf_tokens, m[:, None], 1)[:, 0], correction)
        go = flushing & ~done
        return s.replace(
            tokens=tokens,
            n_generated=n_generated,
            done=done,
            cache=cache,
            committed=jnp.where(go, s.committed + n_emit, s.committed),
            # Finishing rows empty their buffer too: they keep computing rounds from F + 0 while
            # other rows run, which keeps their writes inside the cache (see cache_len).
            buffered=jnp.where(flushing, 0, s.buffered),
            buf_tokens=jnp.where(go[:, None], s.buf_tokens.at[:, 0].set(root), s.buf_tokens),
            full_calls=s.full_calls + flushing,
            full_accepted=s.full_accepted + jnp.where(flushing, jnp.minimum(n3, m), 0),
            emitted_hist=s.emitted_hist
            + jnp.where(flushing[:, None], jax.nn.one_hot(n_emit - 1, c + 1, dtype=jnp.int32), 0),
            nonfinite=s.nonfinite + (flushing & nonfinite),
        )

    def output(self, final: HiSpecState) -> GenerateOutput:
        max_new = self.max_new_tokens
        calls = jnp.maximum(final.full_calls, 1)
        rounds = jnp.maximum(final.rounds, 1)
        stats = {
            "target_calls": final.full_calls,
            "buffer_flushes": final.full_calls,  # each full-target call verifies one flush
            # Tokens per full-target call, counting the first token from the prefill out.
            "tau": (final.n_generated - 1) / calls,
            "accepted_hist": final.emitted_hist,
            "full_accepted": final.full_accepted,
            "intermediate_calls": final.rounds,
            "intermediate_drafted": final.intermediate_drafted,
            "intermediate_accepted": final.intermediate_accepted,
            "intermediate_tau": (final.intermediate_accepted + final.rounds) / rounds,
            "nonfinite_logits": final.nonfinite,
        }
        tokens = final.tokens[:, :max_new]
        tokens = jnp.where(jnp.arange(max_new)[None, :] < final.n_generated[:, None], tokens, 0)
        return GenerateOutput(tokens=tokens, lengths=final.n_generated, stats=stats)


# The static arguments of the jitted loop (also read by tests that compile it with other
# compiler options).
HISPEC_STATIC_ARGS = ("target_def", "hispec_def", "max_new_tokens", "sampling", "attn_impl")


@functools.partial(jax.jit, static_argnames=HISPEC_STATIC_ARGS)
def _hispec(target_def, target_params, hispec_def, hispec_params, ids, prompt_lens, keys, eos_id,
            *, max_new_tokens, sampling, attn_impl):  # fmt: skip
    loop = HiSpecLoop(
        target=nnx.merge(target_def, target_params),
        hispec=nnx.merge(hispec_def, hispec_params),
        sampling=sampling,
        max_new_tokens=max_new_tokens,
        attn_impl=attn_impl,
    )
    state = loop.init(ids, prompt_lens, keys, eos_id)
    final = jax.lax.while_loop(lambda s: ~jnp.all(s.done), loop.step, state)
    return loop.output(final)


def hispec_generate(
    target,
    hispec: HiSpec,
    prompts,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(),
    key=None,
    eos_id: int | None = None,
    attn_impl: str = "auto",
) -> GenerateOutput:
    """HiSpec decoding (see the module docstring): the target's exact output distribution.
    Arguments and output as specjax.speculative_generate's; stats: target_calls (= buffer
    flushes, full-target calls), tau (tokens per full-target call), accepted_hist [B, C + 1]
    (flushes by the tokens their verification yields minus one; a row's last flush counted
    whole where EOS or max_new_tokens cut it), full_accepted,
    intermediate_calls (rounds), intermediate_drafted, intermediate_accepted, intermediate_tau
    (tokens per verify-exit call), nonfinite_logits, each [B]."""
    check_sampling(sampling)
    if not isinstance(hispec, HiSpec):
        raise ValueError(f"hispec must be a specjax.hispec.HiSpec, got {type(hispec).__name__}")
    hispec.check_compatible(target)
    eos = check_eos(eos_id, target.config)
    ids, lens = prepare_prompts(prompts, target.config, max_new_tokens,
                                extra_slots=hispec.reserve)  # fmt: skip
    keys = prepare_keys(key, ids.shape[0])
    target_def, target_params = split_module(target)
    hispec_def, hispec_params = split_module(hispec)
    return _hispec(
        target_def, target_params, hispec_def, hispec_params, jnp.asarray(ids), jnp.asarray(lens),
        keys, jnp.int32(eos), max_new_tokens=max_new_tokens, sampling=sampling,
        attn_impl=attn_impl,
    )  # fmt: skip
