"""Prompt sets for evaluation and benchmarks: TinyStories dev prefixes and Spec-Bench style
question files (MT-bench and the EAGLE question sets) from the shared data folder.

These files are evaluation data only: nothing in specjax/train reads them to build training
prompts (specjax.train.data refuses them).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from specjax.paths import shared_dir

TINYSTORIES = "tinystories"
# Spec-Bench style question files in the shared data folder, by short name.
SPEC_BENCH_FILES = {
    "mt_bench": "mt_bench_question.jsonl",
    "gsm8k": "eagle_gsm8k_question.jsonl",
    "humaneval": "eagle_humaneval_question.jsonl",
    "alpaca": "eagle_alpaca_question.jsonl",
    "qa": "eagle_qa_question.jsonl",
    "sum": "eagle_sum_question.jsonl",
}


@dataclasses.dataclass(frozen=True)
class Question:
    """One Spec-Bench record: question_id, category and the user turns (extra fields ignored)."""

    question_id: str
    category: str
    turns: tuple[str, ...]


def resolve_path(path: str | Path, folder: str = "") -> Path:
    """`path` as given if it exists, else under the shared folder (`folder` inside it)."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    for candidate in (shared_dir() / folder / path, shared_dir() / path):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"{path} not found (looked in the current directory and in {shared_dir() / folder}; "
        "set SPECJAX_SHARED to the folder that holds models/ and data/)"
    )


def read_spec_bench(path: str | Path) -> list[Question]:
    """Read a Spec-Bench style jsonl file: one JSON object per line with `turns` (a non-empty list
    of strings) and, as in Spec-Bench, `question_id` and `category` (the line number and "" when
    missing). Blank lines are skipped; other fields (reference, ...) are ignored."""
    path = resolve_path(path, "data")
    questions = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not a JSON object ({e.msg})") from None
        turns = record.get("turns") if isinstance(record, dict) else None
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)):
            raise ValueError(f"{path}:{lineno}: 'turns' must be a non-empty list of strings")
        questions.append(
            Question(
                question_id=str(record.get("question_id", lineno)),
                category=str(record.get("category", "")),
                turns=tuple(turns),
            )
        )
    if not questions:
        raise ValueError(f"{path}: no questions")
    return questions


def select_questions(questions: Sequence[Question], n: int) -> list[Question]:
    """The first n questions taken round-robin over categories (in order of first appearance).

    MT-bench lists its 8 categories in blocks of 10, so its first n questions would all be
    "writing"; round-robin makes a small prompt set cover every category (as Spec-Bench's does).
    """
    by_category: dict[str, list[Question]] = {}
    for q in questions:
        by_category.setdefault(q.category, []).append(q)
    picked = []
    for i in range(max(len(qs) for qs in by_category.values())):
        picked += [qs[i] for qs in by_category.values() if i < len(qs)]
    return picked[:n]


def encode_question(tokenizer, text: str) -> list[int]:
    """A user turn as prompt ids: the chat template when the tokenizer has one (as
    `jsonl_prompts` does), else the raw text after BOS."""
    if tokenizer.chat_template:
        chat = tokenizer.apply_chat([{"role": "user", "content": text}], add_generation_prompt=True)
        return tokenizer.encode(chat, bos=False)
    return tokenizer.encode(text, bos=True)


def tinystories_prompts(tokenizer, n: int, words: int = 8, offset: int = 0) -> list[list[int]]:
    """The first `words` words of TinyStories dev paragraphs, BOS-prefixed."""
    text = (shared_dir() / "data" / "tinystories_dev.txt").read_text()
    paras = [p.strip() for p in text.split("\n\n") if p.strip()][offset : offset + n]
    return [tokenizer.encode(" ".join(p.split()[:words]), bos=True) for p in paras]


def jsonl_prompts(path: str | Path, tokenizer, n: int, chat: bool = True) -> list[list[int]]:
    """First turns of a Spec-Bench style jsonl file (question_id, category, turns)."""
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = shared_dir() / "data" / path
    out = []
    for line in path.read_text().splitlines()[:n]:
        turn = json.loads(line)["turns"][0]
        if chat:
            text = tokenizer.apply_chat(
                [{"role": "user", "content": turn}], add_generation_prompt=True
            )
            out.append(tokenizer.encode(text, bos=False))
        else:
            out.append(tokenizer.encode(turn, bos=True))
    return out
