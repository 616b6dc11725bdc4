"""User turns written by the target itself: the chat template up to where a user's text starts
(the system turn and the user header) is all the target reads, and what it samples next is a
user request of the kind its instruction tuning saw (the "pre-query template" method of Magpie,
arXiv 2406.08464).

Why a fourth prompt source: the drafters are trained on the target's answers, so what the prompts
decide is which of the target's behaviours a drafter sees. The three generators
(specjax.train.prompts, broad_prompts, task_prompts) are templates: a drafter trained on their
answers accepts 3.3-3.9 tokens per call on held-out prompts of the same templates and 2.2 on
MT-bench first turns (experiments/results/acceptance_by_source.md). Requests the target writes
for itself are open-ended, varied in topic and form, and written the way its chat data was.

Evaluation files stay clean: a written turn that shares a run of NGRAM words with any turn of
MT-bench or an EAGLE question file is dropped (the files are read only to exclude), as are turns
that did not end within max_tokens, very short ones and repeats.

Turns are written in batches; batch i samples with fold_in(key(seed), i), so a list grown by a
later call equals the first calls' list extended. The list and the number of batches it took are
kept in a JSON file beside the answers it feeds (user_turns.json).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import numpy as np
from tqdm.auto import tqdm

from specjax.config import SamplingConfig

NGRAM = 8  # a shared run of this many words with an evaluation turn drops a written turn
MIN_WORDS = 4
TURNS_FILE = "user_turns.json"
SAMPLING = SamplingConfig(temperature=1.0, top_p=0.95)
_MARKER = "\x00user-text\x00"


def query_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template before a user's text (its default system turn included)."""
    if not tokenizer.chat_template:
        raise ValueError("self-written user turns need a chat model: the tokenizer has no template")
    chat = tokenizer.apply_chat([{"role": "user", "content": _MARKER}], add_generation_prompt=True)
    return tokenizer.encode(chat[: chat.index(_MARKER)], bos=False)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """Every run of n words of text (lowercased, punctuation dropped); a text shorter than n
    words gives itself as one run."""
    w = _words(text)
    if len(w) < n:
        return {tuple(w)} if w else set()
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def evaluation_ngrams(n: int = NGRAM) -> set[tuple[str, ...]]:
    """The word n-grams of every turn of MT-bench and of every EAGLE question file."""
    from specjax.datasets import SPEC_BENCH_FILES, read_spec_bench

    grams: set[tuple[str, ...]] = set()
    for name in SPEC_BENCH_FILES.values():
        for q in read_spec_bench(name):
            for turn in q.turns:
                grams |= ngrams(turn, n)
    return grams


def drop_reason(text: str, finished: bool, seen: set[str], excluded) -> str | None:
    """Why a written turn does not join the list ("unfinished", "short", "repeat",
    "evaluation overlap": it shares an NGRAM-word run with an evaluation turn), or None."""
    text = text.strip()
    if not finished:
        return "unfinished"
    if len(_words(text)) < MIN_WORDS:
        return "short"
    if text in seen:
        return "repeat"
    return "evaluation overlap" if ngrams(text) & excluded else None


def keep_turn(text: str, finished: bool, seen: set[str], excluded: set[tuple[str, ...]]) -> bool:
    """Whether a written turn joins the list (drop_reason gives none)."""
    return drop_reason(text, finished, seen, excluded) is None


def read_turns(path: str | Path) -> dict:
    """{"seed", "batches", "dropped", "evaluation_overlaps" (when any), "turns"} from a turns
    file ({} when absent)."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def write_user_turns(
    model,
    tokenizer,
    path: str | Path,
    n: int,
    *,
    seed: int = 0,
    batch: int = 64,
    max_tokens: int = 160,
) -> list[str]:
    """At least n user turns (more when the last batch keeps more), written by `model` after
    query_prefix and kept as keep_turn says; grows the file at path and returns its first n
    turns. Shows a progress bar."""
    from specjax.decode import generate

    path = Path(path)
    state = read_turns(path) or {"seed": seed, "batches": 0, "dropped": 0, "turns": []}
    if state["seed"] != seed:
        raise ValueError(f"{path} holds turns written with seed {state['seed']}, not {seed}")
    turns = state["turns"]
    if len(turns) >= n:
        return turns[:n]
    prefix = query_prefix(tokenizer)
    excluded = evaluation_ngrams()
    seen = set(turns)
    bar = tqdm(total=n, initial=len(turns), desc="user turns", unit="turn")
    barren = 0  # batches in a row that kept no turn
    while len(turns) < n:
        if barren == 4:
            raise RuntimeError(
                f"{4 * batch} written turns in a row were dropped (none ended within "
                f"{max_tokens} tokens, or all were repeats or evaluation overlaps): check the "
                "target's chat template and EOS id"
            )
        before = len(turns)
        out = generate(
            model,
            [prefix] * batch,
            max_new_tokens=max_tokens,
            sampling=SAMPLING,
            key=jax.random.fold_in(jax.random.key(seed), state["batches"]),
            eos_id=tokenizer.eos_id,
        )
        tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        for row, length in zip(tokens, lengths, strict=True):
            finished = length > 0 and row[length - 1] == tokenizer.eos_id
            text = tokenizer.decode(row[: length - 1 if finished else length].tolist()).strip()
            reason = drop_reason(text, finished, seen, excluded)
            if reason is None:
                turns.append(text)
                seen.add(text)
            else:
                state["dropped"] += 1
                if reason == "evaluation overlap":  # counted apart: evaluation stays clean
                    state["evaluation_overlaps"] = state.get("evaluation_overlaps", 0) + 1
        state["batches"] += 1
        barren = barren + 1 if len(turns) == before else 0
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(state, indent=1, ensure_ascii=False) + "\n")
        bar.n = min(len(turns), n)
        bar.set_postfix(dropped=state["dropped"])
        bar.refresh()
    bar.close()
    return turns[:n]
