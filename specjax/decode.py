"""Autoregressive decoding in one jitted `lax.while_loop`, and the prompt handling it shares
with speculative decoding.

Axis letters: B batch, T prompt tokens (padded), S cache length, V vocab.

Prompts are right-padded to T and prefilled as one block at cache position 0 with a causal mask;
each row's cache length is then its own prompt length, so padding is never attended to and is
overwritten by the row's next tokens. Randomness is per row: row b draws its step-i sample from
fold_in(keys[b], i), so a row's output depends only on its own prompt and key.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import token_choice
from specjax.cache import KVCache, init_cache
from specjax.config import ModelConfig, SamplingConfig
from specjax.module_split import split as split_module
from specjax.prefill import prefill
from specjax.sampling import apply_sampling, sample_rows
from specjax.sharding import (
    active_mesh,
    check_batch,
    constrain_rows,
    gather_logits,
    mesh_of,
    place_rows,
    use_mesh,
)
from specjax.tree import causal_mask

PROMPT_BUCKET = 16


@flax.struct.dataclass
class GenerateOutput:
    """tokens [B, max_new_tokens] int32 (slots past lengths hold 0), lengths [B] generated tokens
    per row (including the EOS that stopped it), stats: dict of per-row statistics or None."""

    tokens: jax.Array
    lengths: jax.Array
    stats: dict | None = None


def prepare_prompts(
    prompts, cfg: ModelConfig, max_new_tokens: int, extra_slots: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Validate prompts and right-pad them: returns (ids [B, T] int32, prompt_lens [B] int32).

    T is the longest prompt rounded up to a multiple of PROMPT_BUCKET (capped by the budget).

    prompts: a list of token-id lists (ragged) or an int array [B, T]. Raises ValueError before any
    compilation for empty prompts, ids outside the vocabulary and prompts that would not fit in the
    model's context (prompt + max_new_tokens + extra_slots > max_seq_len).
    """
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, (int, np.integer))
        or max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if isinstance(prompts, (np.ndarray, jax.Array)):
        arr = np.asarray(prompts)
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"prompt array must be int [B, T], got {arr.dtype} {arr.shape}")
        rows = list(arr)
    elif isinstance(prompts, Sequence) and not isinstance(prompts, str):
        rows = [np.asarray(list(p)) for p in prompts]
        for i, r in enumerate(rows):
            if r.size and (r.dtype == bool or not np.issubdtype(r.dtype, np.integer)):
                raise ValueError(
                    f"prompt row {i} holds non-integer token ids ({r.dtype}, e.g. "
                    f"{r.ravel()[0]!r}): token ids must be ints (encode text with the tokenizer)"
                )
    else:
        raise ValueError(
            "prompts must be a list of token-id lists or an int array [B, T] "
            f"(got {type(prompts).__name__}); encode text with the tokenizer first"
        )
    if not rows:
        raise ValueError("no prompts given (empty batch)")
    lens = np.array([len(r) for r in rows], np.int32)
    if (lens == 0).any():
        raise ValueError(
            f"empty prompt at batch rows {np.flatnonzero(lens == 0).tolist()}: "
            "every prompt needs at least one token (e.g. BOS)"
        )
    budget = cfg.max_seq_len - max_new_tokens - extra_slots
    if lens.max() > budget:
        bad = np.flatnonzero(lens > budget).tolist()
        raise ValueError(
            f"prompt too long for the cache: rows {bad} have {lens.max()} tokens, but "
            f"max_seq_len {cfg.max_seq_len} - max_new_tokens {max_new_tokens}"
            + (f" - {extra_slots} draft slots" if extra_slots else "")
            + f" leaves {budget}; shorten the prompt or lower max_new_tokens"
        )
    # Pad to a multiple of PROMPT_BUCKET (within the budget) so prompts of similar lengths share
    # one compiled program; padding is never attended to.
    width = min(-(-int(lens.max()) // PROMPT_BUCKET) * PROMPT_BUCKET, budget)
    ids = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        if r.size and (r.min() < 0 or r.max() >= cfg.vocab_size):
            raise ValueError(
                f"prompt row {i} has token ids outside the vocabulary [0, {cfg.vocab_size})"
            )
        ids[i, : len(r)] = r
    return ids, lens


def prepare_keys(key, batch: int) -> jax.Array:
    """Validate a user key and return per-row typed keys [B] (None means key 0; an int is a seed;
    a single key is split; B keys are used as given)."""
    if key is None:
        key = jax.random.key(0)
    if isinstance(key, int):
        key = jax.random.key(key)
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(jnp.asarray(key, jnp.uint32))
    if key.ndim == 0:
        return jax.random.split(key, batch)
    if key.shape != (batch,):
        raise ValueError(f"key must be one key or {batch} per-row keys, got shape {key.shape}")
    return key


def check_eos(eos_id, cfg: ModelConfig) -> int:
    """The EOS id as an int (-1 for none); ValueError if it is not a token of the vocabulary."""
    if eos_id is None:
        return -1
    if isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer)):
        raise ValueError(f"eos_id must be an int token id or None, got {eos_id!r}")
    if not 0 <= eos_id < cfg.vocab_size:
        raise ValueError(
            f"eos_id {eos_id} is outside the vocabulary [0, {cfg.vocab_size}): pass the "
            "tokenizer's eos_id for this model (or None to run to max_new_tokens)"
        )
    return int(eos_id)


def check_sampling(sampling: SamplingConfig) -> None:
    if not isinstance(sampling, SamplingConfig):
        raise ValueError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")


def choose_tokens(logits: jax.Array, keys: jax.Array, step, sampling: SamplingConfig) -> jax.Array:
    """Next token per row from logits [B, V]: argmax when greedy, else a sample with the row's key
    folded with `step` (scalar or [B])."""
    logits = gather_logits(logits)
    if sampling.greedy:
        return token_choice.argmax(logits)
    probs = apply_sampling(logits, sampling)
    step = jnp.broadcast_to(step, keys.shape)
    step_keys = jax.vmap(jax.random.fold_in)(keys, step)
    return sample_rows(step_keys, probs)


COMPACT_MIN_BATCH = 8  # below this a finished row costs too little to be worth a phase
COMPACT_MIN_ROWS = 4  # the smallest phase


@flax.struct.dataclass
class _ARState:
    step: jax.Array  # scalar: number of tokens produced so far per live row
    tokens: jax.Array  # [B, max_new] (every row of the batch, indexed by the rows' ids)
    n_generated: jax.Array  # [B]
    rows: jax.Array  # [R] which rows of the batch this phase decodes (R <= B)
    last: jax.Array  # [R] last emitted token, fed next
    done: jax.Array  # [R]
    cache: KVCache  # [L, R, S, K, D]
    hidden: jax.Array | None  # [B, max_new, M] last hidden state of each fed token, if recorded


def row_phases(batch: int, compact: bool, max_phases: int | None = None) -> tuple[int, ...]:
    """Batch sizes of the decoding phases: the whole batch, then halves while the rows still
    live fit (see _generate_loop), at most max_phases of them (each phase is a compiled copy of
    the loop body); one phase when not compacting or for small batches."""
    sizes = [batch]
    if compact and batch >= COMPACT_MIN_BATCH:
        while sizes[-1] // 2 >= COMPACT_MIN_ROWS and len(sizes) < (max_phases or batch):
            sizes.append(sizes[-1] // 2)
    return tuple(sizes)


def keep_live_rows(s: _ARState, size: int) -> _ARState:
    """The state on `size` of its rows, the live ones first (finished rows fill the rest)."""
    keep = jnp.argsort(s.done, stable=True)[:size]
    cache = KVCache(k=s.cache.k[:, keep], v=s.cache.v[:, keep], lengths=s.cache.lengths[keep])
    return s.replace(rows=s.rows[keep], last=s.last[keep], done=s.done[keep], cache=cache)


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef", "max_new_tokens", "sampling", "attn_impl", "record_hidden", "mesh"
    ),
)  # fmt: skip
def _generate(
    graphdef,
    params,
    ids,
    prompt_lens,
    keys,
    eos_id,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig,
    attn_impl: str,
    record_hidden: bool = False,
    mesh=None,
):
    with use_mesh(mesh):
        return _generate_loop(
            nnx.merge(graphdef, params), ids, prompt_lens, keys, eos_id,
            max_new_tokens=max_new_tokens, sampling=sampling, attn_impl=attn_impl,
            record_hidden=record_hidden,
        )  # fmt: skip


def start_decoding(
    model, ids, prompt_lens, keys, eos_id, *, max_new_tokens, sampling, attn_impl, record_hidden
):
    """(state, prompt hidden states): the decoding state after the prefill of `ids` [B, T] and
    the first token, every row live in it."""
    b, t = ids.shape
    cache = init_cache(model.config, b, t + max_new_tokens)
    last_layer = model.config.n_layers
    wanted = (last_layer,) if record_hidden else ()
    logits, cache, prompt_hidden = prefill(
        model, ids, prompt_lens, cache, attn_impl, return_hidden=wanted
    )
    first = choose_tokens(logits, keys, 0, sampling)
    done = (first == eos_id) | (max_new_tokens <= 1)
    tokens = jnp.zeros((b, max_new_tokens), jnp.int32).at[:, 0].set(first)
    state = _ARState(
        step=jnp.int32(1),
        tokens=tokens,
        n_generated=jnp.ones((b,), jnp.int32),
        rows=jnp.arange(b, dtype=jnp.int32),
        last=first,
        done=done,
        cache=cache,
        hidden=jnp.zeros((b, max_new_tokens, model.config.d_model), jnp.float32)
        if record_hidden
        else None,
    )
    return constrain_rows(state, b), prompt_hidden


def decode_step(
    model, s: _ARState, keys, eos_id, *, max_new_tokens, sampling, attn_impl, record_hidden
) -> _ARState:
    """One token for every row of `s` (the loop body of _generate_loop): the target over the
    last tokens, the next tokens chosen, finished rows marked. keys: [B] the whole batch's."""
    r = s.rows.shape[0]
    last_layer = model.config.n_layers
    out = model(
        s.last[:, None],
        positions=s.cache.lengths[:, None],
        cache=s.cache,
        tree_mask=jnp.ones((r, 1, 1), bool),
        return_hidden=(last_layer,) if record_hidden else (),
        attn_impl=attn_impl,
    )
    hidden = s.hidden
    if record_hidden:  # the token fed at this step is generated token step - 1
        hidden = hidden.at[s.rows, s.step - 1].set(out.hidden[last_layer][:, 0].astype(jnp.float32))
    live = ~s.done
    cache = out.cache.replace(lengths=s.cache.lengths + live)
    nxt = choose_tokens(out.logits[:, 0], keys[s.rows], s.step, sampling)
    nxt = jnp.where(live, nxt, 0)
    new = s.replace(
        step=s.step + 1,
        tokens=s.tokens.at[s.rows, s.step].set(nxt),
        n_generated=s.n_generated.at[s.rows].add(live),
        last=nxt,
        done=s.done | (nxt == eos_id) | (s.step + 1 >= max_new_tokens),
        cache=cache,
        hidden=hidden,
    )
    return constrain_rows(new, keys.shape[0])


def _generate_loop(
    model, ids, prompt_lens, keys, eos_id, *, max_new_tokens, sampling, attn_impl, record_hidden
):
    """The body of _generate (under the mesh context when there is one).

    Finished rows stop costing in large batches: decoding runs in phases of B, B/2, B/4, ...
    rows; a phase ends when its live rows fit in the next one, and the live rows (with their
    caches) are then gathered into it. A row's tokens depend only on its own cache and key, so
    the output is the same as one loop over the whole batch. Without a mesh only (rows are
    sharded over 'data' on one) and not when recording hidden states."""
    b = ids.shape[0]
    options = dict(max_new_tokens=max_new_tokens, sampling=sampling, attn_impl=attn_impl,
                   record_hidden=record_hidden)  # fmt: skip
    state, prompt_hidden = start_decoding(model, ids, prompt_lens, keys, eos_id, **options)

    def body(s: _ARState):
        return decode_step(model, s, keys, eos_id, **options)

    compact = active_mesh() is None and not record_hidden
    phases = row_phases(b, compact)
    for i, size in enumerate(phases):
        if i:
            state = keep_live_rows(state, size)
        smaller = phases[i + 1] if i + 1 < len(phases) else 0

        def cond(s: _ARState, smaller=smaller):
            going = (s.step < max_new_tokens) & ~jnp.all(s.done)
            return going & (jnp.sum(~s.done) > smaller)

        state = jax.lax.while_loop(cond, body, state)
    stats = None
    if record_hidden:
        last_layer = model.config.n_layers
        stats = {"prompt_hidden": prompt_hidden[last_layer], "hidden": state.hidden}
    return GenerateOutput(tokens=state.tokens, lengths=state.n_generated, stats=stats)


def generate(
    model,
    prompts,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(),
    key=None,
    eos_id: int | None = None,
    attn_impl: str = "auto",
    record_hidden: bool = False,
) -> GenerateOutput:
    """Autoregressive decoding of `model` (the reference every speculative path must match).

    prompts: list of token-id lists (ragged) or int array [B, T]. Returns tokens [B, max_new_tokens]
    and lengths [B]. Greedy when sampling.temperature == 0. key: one PRNG key (split per row) or B
    per-row keys. eos_id: stop a row after it emits this token (None: run to max_new_tokens).
    record_hidden: also return the last layer's hidden state (before the final norm) of every
    token the model read, as stats {"prompt_hidden": [B, T, M] (padded prompt positions),
    "hidden": [B, max_new_tokens, M] (generated token i at index i; the last generated token is
    never read, so its slot and those past it hold 0)}: the features a drafter is trained on,
    equal to a teacher-forced pass over prompt + answer.
    """
    check_sampling(sampling)
    cfg = model.config
    eos = check_eos(eos_id, cfg)
    ids, lens = prepare_prompts(prompts, cfg, max_new_tokens)
    keys = prepare_keys(key, ids.shape[0])
    graphdef, params = split_module(model)
    ids, lens = jnp.asarray(ids), jnp.asarray(lens)
    mesh = mesh_of(params)
    if mesh is not None:  # a model placed by load(mesh=...) / shard_model: rows over 'data'
        check_batch(ids.shape[0], mesh)
        ids, lens, keys = place_rows((ids, lens, keys), mesh)
    return _generate(
        graphdef,
        params,
        ids,
        lens,
        keys,
        jnp.int32(eos),
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        attn_impl=attn_impl,
        record_hidden=record_hidden,
        mesh=mesh,
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "attn_impl"))
def _score(graphdef, params, ids, lens, *, attn_impl: str):
    model = nnx.merge(graphdef, params)
    b, t = ids.shape
    cache = init_cache(model.config, b, t)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits = model(
        ids,
        positions=positions,
        cache=cache,
        tree_mask=causal_mask(b, t),
        attn_impl=attn_impl,
    ).logits
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    token_logp = jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
    mask = jnp.arange(1, t)[None, :] < lens[:, None]
    return jnp.where(mask, token_logp, 0.0), mask


def score(model, sequences, *, attn_impl: str = "auto") -> tuple[jax.Array, jax.Array]:
    """Log-probabilities of each token given its prefix, for teacher-forced sequences.

    sequences: list of token-id lists (ragged) or int array [B, T]. Returns (logp [B, T-1], mask
    [B, T-1]): logp[b, t] = log p(x[t+1] | x[:t+1]); mask marks real (non-padding) tokens.
    """
    ids, lens = prepare_prompts(sequences, model.config, max_new_tokens=1)
    graphdef, params = split_module(model)
    return _score(graphdef, params, jnp.asarray(ids), jnp.asarray(lens), attn_impl=attn_impl)
