"""N-gram drafter: each node's children are the target's most frequent continuations of the
node's last few tokens, looked up in hashed tables distilled from the target's own outputs.

Axis letters: B batch, N tree nodes, W frontier nodes, C table context tokens, S history tokens
(C and the text lookup's longest match, whichever is more), K stored continuations, H table
slots, L the text buffer's width.

Drafting costs a few gathers a level, against a network's forward: for a target as small as
stories260K, whose forward is mostly dispatch, that is what lets speculation pay at all (a
feature drafter's level costs about as much as the target's own forward there). The tables come
from specjax.train.ngram: greedy continuations the target wrote for training prompts, counted
for every context of 1..C tokens; each stored row holds its K most frequent continuations,
topped up from shorter contexts, so a lookup returns K distinct tokens whatever order hit.

Table lookup: every order m = 1..C hashes the node's last m tokens (FNV-1a over the token ids, then
murmur3's finalizer) to a slot of its own table and to a 16-bit fingerprint; the longest context
whose slot holds its fingerprint wins, the unigram row when none does. A fingerprint collision
gives a worse draft, never a wrong output: the drafter only proposes. Children are top-K
(samples_children False), so sampled decoding verifies with the one-hot tree rule.

Text lookup (`lookup` > 0, prompt-lookup decoding): the row's own text (prompt, committed
tokens, the root) is searched for the latest place where the node's last 1..lookup tokens occur,
and the token that followed there is proposed. A chat model's answer repeats its prompt and
itself (names, code, lists), which no table of other answers knows. The longer match wins, the
text on a tie; the text's token then takes the first child and the table's others follow (the
same token is not proposed twice). Its logq
is the rate at which a match of that length predicted the next token on the tables' own data
(`lookup_logq`, measured by the builder), so the draft probabilities stay comparable.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.config import SamplingConfig, SpecConfig
from specjax.drafters.base import RootContext
from specjax.drafters.lm import tree_constants
from specjax.drafters.text_chain import (
    RowText,
    commit_row_text,
    init_row_text,
    match_text,
    with_root,
)
from specjax.tree import LOGQ_FLOOR, Acceptance, DraftTree

FORMAT = "specjax-ngram-drafter"
VERSION = 2  # 2 added the text lookup ("lookup", "lookup_logq"); version 1 files read as lookup 0
READS = (1, 2)
HEADER = "ngram.json"
TABLES = "tables"  # orbax folder beside the header
_PRIME = 16777619  # FNV-1a 32-bit
_OFFSET = 2166136261
SLOT_SEED, FINGERPRINT_SEED = 0x9E3779B9, 0x85EBCA77
# The rate at which a text match of 1..8 tokens predicted SmolLM2's next token over its 11,776
# held-in answers (checkpoints/smollm2-ngram/CARD.md): the draft probabilities a text-only
# drafter reports when nothing was measured for its target. They decide nothing in a static
# tree's verification (children are deterministic: the one-hot rule); pre-verifiers, reports
# and the acceptance profile's per-node records read them, and for another target they are a
# guess.
TEXT_ONLY_LOGQ = tuple(
    float(np.log(r)) for r in (0.211, 0.533, 0.614, 0.695, 0.750, 0.777, 0.822, 0.938)
)


def _fmix(h, xp):
    """murmur3's 32-bit finalizer (uint32 in, uint32 out; xp is numpy or jax.numpy)."""
    h = h ^ (h >> 16)
    h = h * xp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * xp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def order_hashes(contexts, seed: int, xp=jnp):
    """[..., C] uint32: for m = 1..C, the hash of the last m tokens of contexts [..., C] (int
    token ids, oldest first). The tokens are absorbed newest first (FNV-1a), so every context
    length is a prefix of one pass and all C hashes cost one loop; murmur3's finalizer mixes
    each. The same function in numpy (xp=np: the tables' builder) and jax.numpy (the lookup)."""
    tokens = xp.asarray(contexts).astype(xp.uint32)
    c = tokens.shape[-1]
    h = xp.full(tokens.shape[:-1], (_OFFSET ^ seed) & 0xFFFFFFFF, xp.uint32)
    states = []
    for i in range(c - 1, -1, -1):
        h = (h ^ tokens[..., i]) * xp.uint32(_PRIME)
        states.append(h)
    return _fmix(xp.stack(states, axis=-1), xp)


def slots_and_fingerprints(contexts, sizes, xp=jnp):
    """(slot [..., C] within each context length's table, fingerprint [..., C] uint16, never 0:
    0 marks an empty slot) of the last m tokens of contexts [..., C], m = 1..C; sizes[m - 1]
    (a power of two) is the m-token table's size."""
    masks = xp.asarray([s - 1 for s in sizes], xp.uint32)
    slot = (order_hashes(contexts, SLOT_SEED, xp) & masks).astype(xp.int32)
    fingerprint = (order_hashes(contexts, FINGERPRINT_SEED, xp) >> 16) | xp.uint32(1)
    return slot, fingerprint.astype(xp.uint16)


@dataclasses.dataclass(frozen=True)
class NgramLayout:
    """Where each context length's table lives in the flat arrays: sizes[m - 1] slots (a power
    of two) for contexts of m tokens, m = 1..context, one after the other, then one slot for
    the unigram row."""

    context: int
    topk: int
    sizes: tuple[int, ...]

    def __post_init__(self):
        if self.context < 1 or self.topk < 1 or len(self.sizes) != self.context:
            raise ValueError(
                f"n-gram layout needs context >= 1, topk >= 1 and one size per context length, "
                f"got context {self.context}, topk {self.topk}, sizes {self.sizes}"
            )
        if any(s < 1 or s & (s - 1) for s in self.sizes):
            raise ValueError(f"n-gram table sizes must be powers of two, got {self.sizes}")

    def offset(self, m: int) -> int:
        """First slot of the table of m-token contexts (m = 0: the unigram row)."""
        return sum(self.sizes) if m == 0 else sum(self.sizes[: m - 1])

    @property
    def slots(self) -> int:
        return sum(self.sizes) + 1


@flax.struct.dataclass
class NgramState:
    history: jax.Array  # [B, S] the last S committed tokens, ending at position lengths - 1
    proposed: jax.Array  # [B, N] the last proposed tree's tokens (commit reads the path's)
    # [B, L] the committed tokens in text[:filled]; past them scratch (-1 or the tail of a
    # path written at commit), never read: L = 0 without the text lookup
    text: jax.Array
    filled: jax.Array  # [B] how many tokens of text are committed (the root goes at filled)


class NgramDrafter(nnx.Module):
    """A Drafter proposing static trees (TreeConfig.branching) from n-gram tables.

    Built from fingerprints [H] uint16 (0: empty slot), tokens [H, K] int32 (continuations, most
    frequent first) and logq [H, K] float32 (their log relative frequency), laid out by
    `layout`; H = layout.slots.
    """

    feature_layers: tuple[int, ...] = ()
    samples_children = False  # children are the table's top-k: one-hot tree rule when sampling
    dynamic_trees = False

    def __init__(
        self,
        layout: NgramLayout,
        fingerprints,
        tokens,
        logq,
        *,
        vocab_size: int,
        lookup: int = 0,
        lookup_logq=(),
    ):
        h, k = layout.slots, layout.topk
        if np.shape(fingerprints) != (h,) or np.shape(tokens) != (h, k) or np.shape(logq) != (h, k):
            raise ValueError(
                f"n-gram tables must be fingerprints [{h}], tokens [{h}, {k}] and logq "
                f"[{h}, {k}] for layout {layout}, got {np.shape(fingerprints)}, "
                f"{np.shape(tokens)}, {np.shape(logq)}"
            )
        if lookup < 0 or len(lookup_logq) != lookup or any(q > 0 for q in lookup_logq):
            raise ValueError(
                "n-gram text lookup needs lookup >= 0 and one log-probability <= 0 per match "
                f"length 1..lookup, got lookup {lookup} and lookup_logq {tuple(lookup_logq)}"
            )
        self.layout = layout
        self.vocab_size = vocab_size
        self.lookup_len = lookup
        self.lookup_logq = tuple(float(q) for q in lookup_logq)
        self.fingerprints = nnx.Variable(jnp.asarray(fingerprints, jnp.uint16))
        # [H, 2K] int32: the tokens, then logq's bits, so that the winning row is one gather.
        columns = (np.asarray(tokens, np.int32), np.asarray(logq, np.float32).view(np.int32))
        self.rows = nnx.Variable(jnp.asarray(np.concatenate(columns, axis=1)))
        self.pre_verifier = nnx.data(None)  # none trained for n-gram drafters

    @property
    def span(self) -> int:
        """Tokens of history a node's context needs: the tables' C and the text lookup's."""
        return max(self.layout.context, self.lookup_len)

    @classmethod
    def text_only(cls, vocab_size: int, longest: int = 8, lookup_logq=None) -> NgramDrafter:
        """A drafter with no tables: the row's own text alone (prompt-lookup decoding), for any
        target, nothing to build. Where the text has no match the child is token 0 at the floor
        probability (never accepted unless it is the target's token). lookup_logq: per match
        length 1..longest, default TEXT_ONLY_LOGQ's (its last entry repeated past 8)."""
        if lookup_logq is None:
            lookup_logq = [TEXT_ONLY_LOGQ[min(m, len(TEXT_ONLY_LOGQ)) - 1]
                           for m in range(1, longest + 1)]  # fmt: skip
        layout = NgramLayout(1, 1, (1,))  # one never-hit slot (fingerprint 0) and the unigram
        tokens = np.zeros((layout.slots, 1), np.int32)
        logq = np.full((layout.slots, 1), LOGQ_FLOOR, np.float32)
        fingerprints = np.zeros((layout.slots,), np.uint16)
        return cls(layout, fingerprints, tokens, logq, vocab_size=vocab_size, lookup=longest,
                   lookup_logq=lookup_logq)  # fmt: skip

    @property
    def table_tokens(self) -> np.ndarray:
        """[H, K] int32 the stored continuations."""
        return np.asarray(self.rows[...][:, : self.layout.topk])

    @property
    def table_logq(self) -> np.ndarray:
        """[H, K] float32 their log relative frequencies."""
        return np.ascontiguousarray(self.rows[...][:, self.layout.topk :]).view(np.float32)

    def check_compatible(self, target) -> None:
        if target.config.vocab_size != self.vocab_size:
            raise ValueError(
                f"vocab mismatch between target ({target.config.vocab_size}) and n-gram drafter "
                f"({self.vocab_size}): its tables were built from another tokenizer's ids"
            )

    def lookup(self, contexts: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(tokens [..., K], logq [..., K]) for contexts [..., C] (oldest first; -1 where the
        sequence has no token yet): the row of the longest context found in the tables."""
        tokens, logq, _ = self.table_lookup(contexts)
        return tokens, logq

    def table_lookup(self, contexts: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """lookup's (tokens [..., K], logq [..., K]) and the length of the context that won
        [...] (0: the unigram row).

        Two gathers whatever C (every length's fingerprint at once, then the winning row) and
        elementwise work XLA fuses: on a CPU each further op of a level costs about a
        microsecond. XLA:CPU splits a fused gather over threads once the array it reads passes
        ~0.5 MB, and that hand-off costs ~4 us, more than the lookup itself (~0.2 us a level):
        hence 16-bit fingerprints in an array of their own (262,144 slots fit)."""
        lay, k = self.layout, self.layout.topk
        slot, fingerprint = slots_and_fingerprints(contexts, lay.sizes)
        slot = slot + jnp.asarray([lay.offset(m) for m in range(1, lay.context + 1)], jnp.int32)
        hit = self.fingerprints[...][slot] == fingerprint  # [..., C]
        row = jnp.full(contexts.shape[:-1], lay.offset(0), jnp.int32)
        order = jnp.zeros(contexts.shape[:-1], jnp.int32)
        present = jnp.ones(contexts.shape[:-1], bool)
        for m in range(1, lay.context + 1):  # longer contexts override shorter ones
            present = present & (contexts[..., lay.context - m] >= 0)  # its m tokens exist
            row = jnp.where(hit[..., m - 1] & present, slot[..., m - 1], row)
            order = jnp.where(hit[..., m - 1] & present, m, order)
        packed = self.rows[...][row]  # [..., 2K]: tokens, then logq's bits
        return packed[..., :k], jax.lax.bitcast_convert_type(packed[..., k:], jnp.float32), order

    def children(self, state: NgramState, seq, front):
        """(tokens [B, W, K], logq [B, W, K]) proposed under frontier contexts front [B, W, S]:
        the tables' row, with the text's token first where its match is at least as long."""
        c = self.layout.context
        tokens, logq, order = self.table_lookup(front[..., front.shape[-1] - c :])
        if not self.lookup_len:
            return tokens, logq
        found, found_order = match_text(seq, state.filled + 1, front, self.lookup_len)
        take = (found_order >= order) & (found_order > 0)  # [B, W]
        # The row's other entries keep their order after the text's token; an entry equal to it
        # moves out (a twin sibling could never be accepted), else the last entry drops.
        others = jnp.argsort(tokens == found[..., None], axis=-1, stable=True)[..., :-1]
        table = jnp.asarray((0.0,) + self.lookup_logq, jnp.float32)
        with_text = (
            jnp.concatenate([found[..., None], jnp.take_along_axis(tokens, others, -1)], -1),
            jnp.concatenate(
                [table[found_order][..., None], jnp.take_along_axis(logq, others, -1)], -1
            ),
        )
        return (
            jnp.where(take[..., None], with_text[0], tokens),
            jnp.where(take[..., None], with_text[1], logq),
        )

    def init_state(
        self, target, prompt_ids, prompt_lens, cache_len, *, config: SpecConfig, target_hidden=None
    ) -> NgramState:
        del target, target_hidden
        c, b = self.span, prompt_ids.shape[0]
        # The last c prompt tokens of each row (-1 before its start): lens - c .. lens - 1.
        pos = prompt_lens[:, None] - c + jnp.arange(c, dtype=jnp.int32)[None, :]
        taken = jnp.take_along_axis(prompt_ids, jnp.maximum(pos, 0), axis=1)
        history = jnp.where(pos >= 0, taken, -1).astype(jnp.int32)
        proposed = jnp.zeros((b, config.tree.num_nodes), jnp.int32)
        rt = init_row_text(
            prompt_ids, prompt_lens, cache_len, config.tree.max_depth, bool(self.lookup_len)
        )
        return NgramState(history=history, proposed=proposed, text=rt.text, filled=rt.filled)

    def propose(
        self,
        state: NgramState,
        target,
        ctx: RootContext,
        keys,
        *,
        config: SpecConfig,
        sampling: SamplingConfig,
    ) -> tuple[DraftTree, NgramState]:
        del target, keys, sampling  # deterministic: the same tree whatever the sampling
        tree_cfg = config.tree
        if tree_cfg.is_dynamic:
            raise ValueError(
                "the n-gram drafter drafts static trees: pass TreeConfig(branching=...) or "
                "TreeConfig.chain(k), not a dynamic budget"
            )
        b, c = ctx.root.shape[0], self.span
        parents, depth = tree_constants(tree_cfg, b)
        seq = state.text
        if self.lookup_len:  # the root is the text's next token
            seq = with_root(RowText(text=state.text, filled=state.filled), ctx.root)
        # Level by level: the frontier's contexts [B, W, S], each node's children the top
        # entries of its row. Levels are concatenated once at the end (fewer ops a step).
        front = jnp.concatenate([state.history[:, 1:], ctx.root[:, None]], axis=1)[:, None]
        level_tokens, level_logq = [ctx.root[:, None]], [jnp.zeros((b, 1), jnp.float32)]
        for kids in tree_cfg.branching:
            cand, cand_logq = self.children(state, seq, front)  # [B, W, K]
            if kids > self.layout.topk:  # the tables know K: further children repeat the
                extra = kids - self.layout.topk  # last at the floor probability
                cand = jnp.concatenate([cand, jnp.repeat(cand[..., -1:], extra, -1)], -1)
                floor = jnp.full((*cand_logq.shape[:-1], extra), LOGQ_FLOOR, jnp.float32)
                cand_logq = jnp.concatenate([cand_logq, floor], -1)
            child = cand[..., :kids]
            width = front.shape[1]
            level_tokens.append(child.reshape(b, width * kids))
            level_logq.append(cand_logq[..., :kids].reshape(b, width * kids))
            shifted = jnp.broadcast_to(front[:, :, None, 1:], (b, width, kids, c - 1))
            front = jnp.concatenate([shifted, child[..., None]], axis=-1)
            front = front.reshape(b, width * kids, c)
        tokens = jnp.concatenate(level_tokens, axis=1)
        tree = DraftTree(
            tokens=tokens,
            parents=parents,
            depth=depth,
            valid=jnp.ones(tokens.shape, bool),
            draft_prob=jnp.exp(jnp.concatenate(level_logq, axis=1)),
        )
        return tree, state.replace(proposed=tokens)

    def commit(
        self,
        state: NgramState,
        acceptance: Acceptance,
        advance,
        *,
        live=None,
        config: SpecConfig,
        target=None,
        target_hidden=None,
    ) -> NgramState:
        """The history moves by advance [B] tokens (the root and the accepted path); with the
        text lookup the path is written to the text at filled, which moves by advance too."""
        del live, config, target, target_hidden
        c = self.span
        path_tokens = jnp.take_along_axis(state.proposed, acceptance.path, axis=1)  # [B, P]
        full = jnp.concatenate([state.history, path_tokens], axis=1)  # [B, S + P]
        window = advance[:, None] + jnp.arange(c, dtype=jnp.int32)[None, :]
        state = state.replace(history=jnp.take_along_axis(full, window, axis=1))
        if not self.lookup_len:
            return state
        rt = commit_row_text(RowText(text=state.text, filled=state.filled), path_tokens, advance)
        return state.replace(text=rt.text, filled=rt.filled)


def save_ngram_drafter(drafter: NgramDrafter, out_dir: str | Path, header: dict) -> Path:
    """Write the tables (orbax, TABLES/) and HEADER (the layout, the vocabulary size and the
    caller's fields: how the tables were built, the target's fingerprint)."""
    import orbax.checkpoint as ocp  # imported on use: it is slow to import

    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = {
        "fingerprints": np.asarray(drafter.fingerprints[...]),
        "tokens": drafter.table_tokens,
        "logq": drafter.table_logq,
    }
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(out_dir / TABLES, arrays, force=True)
    lay = drafter.layout
    full = {
        "format": FORMAT,
        "version": VERSION,
        "kind": "ngram",
        "context": lay.context,
        "topk": lay.topk,
        "sizes": list(lay.sizes),
        "vocab_size": drafter.vocab_size,
        "lookup": drafter.lookup_len,
        "lookup_logq": list(drafter.lookup_logq),
        **header,
    }
    (out_dir / HEADER).write_text(json.dumps(full, indent=2) + "\n")
    return out_dir


def is_ngram_dir(path: str | Path) -> bool:
    return (Path(path) / HEADER).exists()


def read_ngram_header(path: str | Path) -> dict:
    """HEADER of an n-gram drafter directory; ValueError naming the file when it is malformed."""
    header_path = Path(path) / HEADER
    try:
        header = json.loads(header_path.read_text())
        if header.get("format") != FORMAT or header.get("version") not in READS:
            raise ValueError(
                f"format {header.get('format')!r} version {header.get('version')!r}; this "
                f"specjax reads {FORMAT!r} versions {', '.join(map(str, READS))}"
            )
        NgramLayout(int(header["context"]), int(header["topk"]), tuple(header["sizes"]))
        int(header["vocab_size"])
        if header["version"] >= 2:  # version 1 has no text lookup
            lookup, lookup_logq = int(header["lookup"]), [float(q) for q in header["lookup_logq"]]
            if lookup < 0 or len(lookup_logq) != lookup or any(q > 0 for q in lookup_logq):
                raise ValueError(
                    f"lookup {lookup} needs as many lookup_logq entries, each <= 0: {lookup_logq}"
                )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{header_path}: not a valid n-gram drafter header ({e})") from e
    return header


def load_ngram_drafter(path: str | Path) -> NgramDrafter:
    """The NgramDrafter in a directory written by save_ngram_drafter; ValueError naming the path
    for a malformed header or missing or damaged tables."""
    path = Path(path).resolve()
    header = read_ngram_header(path)
    layout = NgramLayout(int(header["context"]), int(header["topk"]), tuple(header["sizes"]))
    vocab = int(header["vocab_size"])
    import orbax.checkpoint as ocp

    h, k = layout.slots, layout.topk
    abstract = {
        "fingerprints": jax.ShapeDtypeStruct((h,), jnp.uint16),
        "tokens": jax.ShapeDtypeStruct((h, k), jnp.int32),
        "logq": jax.ShapeDtypeStruct((h, k), jnp.float32),
    }
    try:
        with ocp.StandardCheckpointer() as ckptr:
            arrays = ckptr.restore(path / TABLES, abstract)
    except Exception as e:  # orbax / tensorstore raise many types for damaged files
        raise ValueError(
            f"{path / TABLES}: the n-gram tables are missing or damaged ({type(e).__name__}: "
            f"{str(e).strip()[:300]}): copy the whole directory again, or build it again"
        ) from e
    tokens = np.asarray(arrays["tokens"])
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError(f"{path}: n-gram tables hold token ids outside [0, {vocab})")
    drafter = NgramDrafter(
        layout, arrays["fingerprints"], tokens, arrays["logq"], vocab_size=vocab,
        lookup=int(header.get("lookup", 0)), lookup_logq=header.get("lookup_logq", ()),
    )  # fmt: skip
    drafter.checkpoint_dir = str(path)
    return drafter
