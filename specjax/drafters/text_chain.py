"""The row's own text as a drafter: a chain from prompt lookup, for the n-gram drafter's text
lookup and as one more branch of a feature drafter's tree (TreeConfig.text_chain).

Axis letters: B batch, L the text buffer's width, S context tokens, K chain nodes, P path slots.

A chat model's answer repeats its prompt and itself (names, code, lists, its own loops); a
network drafter that reads hidden states knows much of that, but not all of it. SmolLM2 drafted
by its eagle (dynamic tree of 7 nodes) on 8 MT-bench first turns: 2.41 tokens per target call,
3.06 with a text chain of 4 and 3.65 with one of 8 (NOTES.md, "Fifty-first session"): the two
succeed on different tokens.

The text is kept per row in a buffer: text[:filled] the committed tokens, the root (the pending
token) goes at `filled`, and the accepted path is written at `filled` by the commit, which moves
`filled` by the step's advance. Past `filled` the buffer is scratch, never read.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

# The longest context a feature drafter's text chain matches (tokens): on SmolLM2's held-in
# answers a match of 8 or more tokens predicted the next token 94% of the time (NgramDrafter's
# TEXT_ONLY_LOGQ).
LONGEST = 8

# log P(a chain node is accepted | the chain nodes before it were), by the length m = 1 ..
# LONGEST of the match it was drafted from (entry m - 1; LONGEST stands for LONGEST or more):
# SmolLM2's greedy answers to held-in prompts, 163,000 chain nodes (`python
# experiments/chain_acceptance.py`, experiments/results/chain_acceptance.md: 0.22 from a
# 1-token match, 0.53 from 2, 0.62 from 3, 0.74 from 4, 0.95 from 8+). A cost-aware
# pre-verifier weighs chain nodes with it (specjax.pre_verify.keep_mask).
CHAIN_NODE_LOGP = (-1.508, -0.641, -0.478, -0.306, -0.240, -0.215, -0.164, -0.057)


@flax.struct.dataclass
class RowText:
    """text [B, L] int32: committed tokens in text[:filled] (-1 or scratch past them); L = 0
    when the text is not kept. filled [B] int32: how many are committed."""

    text: jax.Array
    filled: jax.Array

    @property
    def kept(self) -> bool:
        return self.text.shape[1] > 0


def init_row_text(prompt_ids, prompt_lens, cache_len: int, max_depth: int, keep: bool) -> RowText:
    """The prompts' text (prompt_ids [B, T], prompt_lens [B]); keep=False: an empty buffer.
    Committed tokens stay below cache_len; the slack takes a whole path (max_depth + 1 tokens)
    written at the last of them (a dynamic_update_slice past the end would move the write)."""
    b, t = prompt_ids.shape
    filled = prompt_lens.astype(jnp.int32)
    if not keep:
        return RowText(text=jnp.zeros((b, 0), jnp.int32), filled=filled)
    text = jnp.full((b, cache_len + max_depth + 1), -1, jnp.int32)
    in_prompt = jnp.arange(t)[None, :] < prompt_lens[:, None]
    text = text.at[:, :t].set(jnp.where(in_prompt, prompt_ids, -1).astype(jnp.int32))
    return RowText(text=text, filled=filled)


def with_root(rt: RowText, root) -> jax.Array:
    """[B, L] the text with the root [B] at `filled` (matches may end on it)."""
    return rt.text.at[jnp.arange(rt.text.shape[0]), rt.filled].set(root)


def commit_row_text(rt: RowText, path_tokens, advance) -> RowText:
    """Write the step's path tokens [B, P] (slot 0 the root) at filled; filled moves by advance
    [B] (0 for finished rows). What lies past the advance is overwritten before it is read."""
    if not rt.kept:
        return rt
    write = jax.vmap(lambda row, path, at: jax.lax.dynamic_update_slice(row, path, (at,)))
    return RowText(text=write(rt.text, path_tokens, rt.filled), filled=rt.filled + advance)


def match_text(text, known, contexts, longest: int) -> tuple[jax.Array, jax.Array]:
    """(token [B, W], order [B, W]): for each context [B, W, S] (oldest first, -1 where there is
    no token), the token that followed the latest of its longest matches, up to `longest`
    tokens, in text [B, L], among positions j < known [B] (text[j] must be a real token); order 0
    where not even its last token occurs (token is then text[0], unused). Elementwise over
    [B, W, L] for each order: cheap beside a target forward, whose cost grows with L as well."""
    b, length = text.shape
    s = contexts.shape[-1]
    pos = jnp.arange(length, dtype=jnp.int32)
    alive = jnp.ones(contexts.shape[:2] + (length,), bool)
    matched = jnp.zeros(contexts.shape[:2] + (length,), jnp.int32)
    for k in range(1, longest + 1):  # text[j - k] against the context's k-th last token
        before = jnp.pad(text, ((0, 0), (k, 0)), constant_values=-2)[:, None, :length]
        want = contexts[..., s - k, None]
        alive = alive & (before == want) & (want >= 0)
        matched = matched + alive
    usable = (pos[None, None, :] < known[:, None, None]) & (matched > 0)
    score = jnp.where(usable, matched * length + pos, -1)  # longest, then latest
    best = jnp.argmax(score, axis=-1)  # [B, W]
    order = jnp.maximum(jnp.max(score, axis=-1), 0) // length  # the best score's match length
    token = jnp.take_along_axis(text, best.reshape(b, -1), axis=1).reshape(best.shape)
    return token, order


def draft_text_chain(
    rt: RowText, root, k: int, longest: int, min_match: int = 1, with_matches: bool = False
):
    """(tokens [B, K], valid [B, K]): the chain prompt lookup drafts after root [B]. Node i's
    token follows the latest longest match (up to `longest` tokens) of its context (the text,
    the root and the chain's nodes before it) in the committed text and the root; a node whose
    longest match is shorter than min_match tokens, and every node after it, is not valid.
    with_matches: (tokens, valid, matches [B, K]) the length of the match each node was
    drafted from (0 where there was none)."""
    seq = with_root(rt, root)
    b = root.shape[0]
    # The last `longest` tokens up to the root, oldest first (-1 before the text's start).
    pos = rt.filled[:, None] - longest + 1 + jnp.arange(longest, dtype=jnp.int32)[None, :]
    ctx = jnp.where(pos >= 0, jnp.take_along_axis(seq, jnp.maximum(pos, 0), axis=1), -1)
    tokens, valid, matches, alive = [], [], [], jnp.ones((b,), bool)
    for _ in range(k):
        token, order = match_text(seq, rt.filled + 1, ctx[:, None, :], longest)
        alive = alive & (order[:, 0] >= max(min_match, 1))
        tokens.append(token[:, 0])
        valid.append(alive)
        matches.append(order[:, 0])
        ctx = jnp.concatenate([ctx[:, 1:], token], axis=1)
    out = (jnp.stack(tokens, axis=1).astype(jnp.int32), jnp.stack(valid, axis=1))
    return out + (jnp.stack(matches, axis=1).astype(jnp.int32),) if with_matches else out


def shared_prefix(tokens, parents, depth, valid, chain_tokens, chain_valid):
    """(anchor [B], shared [B]): the deepest node of a drafted tree (tokens, parents, depth,
    valid [B, N], node 0 the root) whose path from the root spells the chain's first `shared`
    valid tokens (chain_tokens, chain_valid [B, K]); the root and 0 where none does. Siblings of
    a top-k tree are distinct, so that node is unique."""
    k = chain_tokens.shape[1]
    slot = jnp.clip(depth - 1, 0, k - 1)
    spells = (
        valid
        & (depth >= 1)
        & (depth <= k)
        & (tokens == jnp.take_along_axis(chain_tokens, slot, axis=1))
        & jnp.take_along_axis(chain_valid, slot, axis=1)
    )
    is_root = jnp.arange(tokens.shape[1])[None, :] == 0
    parent = jnp.maximum(parents, 0)
    on = is_root
    for _ in range(k):  # a node deeper than the chain spells none of it
        on = is_root | (spells & jnp.take_along_axis(on, parent, axis=1))
    reach = jnp.where(on, depth, -1)
    anchor = jnp.argmax(reach, axis=1).astype(jnp.int32)
    return anchor, jnp.max(reach, axis=1).astype(jnp.int32)


def chain_node_logp(matches) -> jax.Array:
    """[B, K] log P(node accepted | the chain before it accepted) of chain nodes drafted from
    matches [B, K] tokens long (CHAIN_NODE_LOGP; matches of 0, no node, get the 1-token value)."""
    table = jnp.asarray(CHAIN_NODE_LOGP, jnp.float32)
    return table[jnp.clip(matches, 1, len(CHAIN_NODE_LOGP)) - 1]


def host_text_chain(text, k: int, longest: int, with_matches: bool = False):
    """draft_text_chain for one row on the host (calibration replays it at recorded steps):
    text the committed tokens with the root last; the chain's valid tokens, up to k. With
    with_matches, (tokens, the match length each was drafted from): a chain drafted from
    matches of m+ tokens (TreeConfig.text_min_match) is the prefix whose matches are >= m."""
    seq = np.asarray(text, np.int64)
    ctx, chain, matches = list(text), [], []
    for _ in range(k):
        token = None
        for m in range(min(longest, len(ctx)), 0, -1):
            if len(seq) <= m:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], m)  # seq[w : w + m]
            hits = np.flatnonzero(np.all(windows == np.asarray(ctx[-m:]), axis=1))
            if len(hits):  # the latest: the token after it, seq[w + m], is committed text
                token = int(seq[hits[-1] + m])
                break
        if token is None:
            break
        chain.append(token)
        matches.append(m)
        ctx.append(token)
    return (chain, matches) if with_matches else chain
