"""Building an n-gram drafter's tables (specjax.drafters.ngram) from token sequences: the
target's own greedy continuations of training prompts, so the tables hold what the target
would say next, not what the training text says.

Counting is plain Python over the sequences (a few seconds for a million tokens). Each context
of m = 1..C tokens keeps its K most frequent continuations, topped up from the next shorter
context's (then the unigram row's) so every stored row holds K distinct tokens; logq is each
one's log relative frequency, a top-up's scaled by its own context's leftover mass. A context
is stored when seen at least min_count times. Every table has a power of two of slots at most
`load` full; contexts are placed in descending count and one whose slot is taken is dropped
(its lookups back off to a shorter context): `dropped` in the returned report counts them.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from specjax.drafters.ngram import NgramDrafter, NgramLayout, slots_and_fingerprints
from specjax.tree import LOGQ_FLOOR


def count_continuations(
    sequences: Iterable[Sequence[int]], context: int, starts: Sequence[int] | None = None
) -> list[dict]:
    """counts[m][ctx] = Counter of the tokens that followed the m-token tuple ctx, for
    m = 0..context (counts[0][()] is the unigram count). starts: per sequence, the first
    position counted as a continuation (a prompt's tokens are context only); default 1."""
    counts = [defaultdict(Counter) for _ in range(context + 1)]
    for n, seq in enumerate(sequences):
        seq = [int(t) for t in seq]
        for i in range(max(1, starts[n]) if starts is not None else 1, len(seq)):
            nxt = seq[i]
            for m in range(min(context, i) + 1):
                counts[m][tuple(seq[i - m : i])][nxt] += 1
    return counts


def _row(counter: Counter, backoff: list[tuple[int, float]], topk: int):
    """The K best (token, logq) of one context: its own continuations by frequency, then the
    shorter context's row (`backoff`) for the rest, scaled by the mass left."""
    total = sum(counter.values())
    own = [(t, math.log(c / total)) for t, c in counter.most_common(topk)]
    taken = {t for t, _ in own}
    left = max(1.0 - sum(math.exp(q) for _, q in own), 1e-6)
    for t, q in backoff:
        if len(own) == topk:
            break
        if t not in taken:
            own.append((t, q + math.log(left)))
            taken.add(t)
    return own


def _pad(row, topk: int):
    """Rows shorter than K (a vocabulary that never showed K tokens) repeat their last entry
    at the floor probability: a duplicate child is never accepted twice."""
    while len(row) < topk:
        row.append((row[-1][0], LOGQ_FLOOR))
    return row


def lookup_hit_rates(
    sequences: Iterable[Sequence[int]], longest: int, starts: Sequence[int] | None = None
) -> tuple[list[int], list[int]]:
    """(tries, hits) per match length m = 1..longest of the drafter's text lookup on each
    sequence itself: at every counted position (from starts[n], default 1) the token that
    followed the latest longest match of the tokens before it, as specjax.drafters.ngram's
    match_text picks it, against the token that came."""
    tries, hits = [0] * longest, [0] * longest
    for n, seq in enumerate(sequences):
        seq = [int(t) for t in seq]
        start = max(1, starts[n]) if starts is not None else 1
        latest: dict[tuple, int] = {}  # m-gram -> the token after its latest occurrence
        for i in range(1, len(seq)):
            j = i - 1  # what followed the m-grams ending before j is now known
            for m in range(1, min(longest, j) + 1):
                latest[tuple(seq[j - m : j])] = seq[j]
            if i < start:
                continue
            for m in range(min(longest, i), 0, -1):
                guess = latest.get(tuple(seq[i - m : i]))
                if guess is not None:
                    tries[m - 1] += 1
                    hits[m - 1] += guess == seq[i]
                    break
    return tries, hits


def lookup_logq_from(tries: Sequence[int], hits: Sequence[int]) -> tuple[float, ...]:
    """Each match length's log hit rate; a length never tried takes the next shorter one's
    (0.5 for length 1), and no rate is taken below 1e-3."""
    out, rate = [], 0.5
    for t, h in zip(tries, hits, strict=True):
        rate = h / t if t else rate
        out.append(math.log(max(rate, 1e-3)))
    return tuple(out)


def build_tables(
    sequences: Sequence[Sequence[int]],
    *,
    vocab_size: int,
    context: int = 4,
    topk: int = 4,
    min_count: int = 1,
    load: float = 0.5,
    lookup: int = 0,
    starts: Sequence[int] | None = None,
) -> tuple[NgramDrafter, dict]:
    """An NgramDrafter from token sequences, and a report {"contexts": [stored per m],
    "dropped": [per m], "tokens": tokens counted, and with lookup > 0 "lookup_tries" /
    "lookup_hits" per match length}. lookup: the longest match of the drafter's text lookup
    (0: none), whose draft probabilities are measured on the same sequences. starts: per
    sequence, the first position counted (its prompt is context only)."""
    if not 0.0 < load <= 1.0:
        raise ValueError(f"table load must be in (0, 1], got {load}")
    if starts is not None and len(starts) != len(sequences):
        raise ValueError(f"{len(starts)} starts for {len(sequences)} sequences")
    counts = count_continuations(sequences, context, starts)
    if not counts[0]:
        raise ValueError("no n-grams to count: every sequence is shorter than two tokens")
    unigram = _pad(_row(counts[0][()], [], topk), topk)
    rows_by_order = {0: {(): unigram}}
    for m in range(1, context + 1):
        shorter = rows_by_order[m - 1]
        rows = {}
        for ctx, counter in counts[m].items():
            if sum(counter.values()) < min_count:
                continue
            back = shorter.get(ctx[1:])
            if back is None:  # the shorter context was below min_count: use the unigram row
                back = unigram
            rows[ctx] = _pad(_row(counter, back, topk), topk)
        rows_by_order[m] = rows
    sizes = tuple(
        1 << max(0, math.ceil(math.log2(max(1, len(rows_by_order[m])) / load)))
        for m in range(1, context + 1)
    )
    layout = NgramLayout(context, topk, sizes)
    fingerprints = np.zeros((layout.slots,), np.uint16)
    tokens = np.zeros((layout.slots, topk), np.int32)
    logq = np.full((layout.slots, topk), LOGQ_FLOOR, np.float32)
    stored, dropped = [], []
    for m in range(1, context + 1):
        rows = rows_by_order[m]
        order = sorted(rows, key=lambda c: -sum(counts[m][c].values()))
        if not order:
            stored.append(0)
            dropped.append(0)
            continue
        # The m-token hash is the last of an m-long context's lengths (1..m).
        slot, fp = slots_and_fingerprints(np.asarray(order, np.int64), sizes[:m], xp=np)
        slot, fp = slot[:, -1] + layout.offset(m), fp[:, -1]
        n_stored = 0
        for ctx, s, f in zip(order, slot.tolist(), fp.tolist(), strict=True):
            if fingerprints[s]:
                continue  # taken by a more frequent context
            fingerprints[s] = f
            tokens[s] = [t for t, _ in rows[ctx]]
            logq[s] = [q for _, q in rows[ctx]]
            n_stored += 1
        stored.append(n_stored)
        dropped.append(len(order) - n_stored)
    tokens[layout.offset(0)] = [t for t, _ in unigram]
    logq[layout.offset(0)] = [q for _, q in unigram]
    if tokens.max() >= vocab_size:
        raise ValueError(
            f"token ids reach {int(tokens.max())}, outside a vocabulary of {vocab_size}"
        )
    report = {
        "contexts": stored,
        "dropped": dropped,
        "tokens": sum(counts[0][()].values()),
    }
    lookup_logq = ()
    if lookup:
        tries, hits = lookup_hit_rates(sequences, lookup, starts)
        report |= {"lookup_tries": tries, "lookup_hits": hits}
        lookup_logq = lookup_logq_from(tries, hits)
    drafter = NgramDrafter(layout, fingerprints, tokens, logq, vocab_size=vocab_size,
                           lookup=lookup, lookup_logq=lookup_logq)  # fmt: skip
    return drafter, report
