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


def count_continuations(sequences: Iterable[Sequence[int]], context: int) -> list[dict]:
    """counts[m][ctx] = Counter of the tokens that followed the m-token tuple ctx, for
    m = 0..context (counts[0][()] is the unigram count)."""
    counts = [defaultdict(Counter) for _ in range(context + 1)]
    for seq in sequences:
        seq = [int(t) for t in seq]
        for i in range(1, len(seq)):
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


def build_tables(
    sequences: Iterable[Sequence[int]],
    *,
    vocab_size: int,
    context: int = 4,
    topk: int = 4,
    min_count: int = 1,
    load: float = 0.5,
) -> tuple[NgramDrafter, dict]:
    """An NgramDrafter from token sequences, and a report {"contexts": [stored per m],
    "dropped": [per m], "tokens": tokens counted}."""
    if not 0.0 < load <= 1.0:
        raise ValueError(f"table load must be in (0, 1], got {load}")
    counts = count_continuations(sequences, context)
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
    return NgramDrafter(layout, fingerprints, tokens, logq, vocab_size=vocab_size), report
