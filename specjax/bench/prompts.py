"""Prompt sets for the benchmark: `Prompt`, `PromptSet` and the `Dataset` recipe that builds a
PromptSet from TinyStories prefixes or a Spec-Bench jsonl file (the readers live in
specjax.datasets)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specjax.datasets import (
    SPEC_BENCH_FILES,
    TINYSTORIES,
    encode_question,
    read_spec_bench,
    select_questions,
    tinystories_prompts,
)


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt: an id for reports (question_id or paragraph index), its category, its ids."""

    id: str
    category: str
    ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """Prompts decoded with the same budget of `max_new_tokens` generated tokens each."""

    name: str
    prompts: tuple[Prompt, ...]
    max_new_tokens: int
    description: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dataset:
    """A recipe for a PromptSet: `source` is TINYSTORIES (TinyStories dev prefixes, for story
    models) or a Spec-Bench jsonl file (a short name from SPEC_BENCH_FILES, a path, or a file
    name under the shared data folder) whose first turns are used (for chat models)."""

    name: str
    source: str
    n_prompts: int
    max_new_tokens: int

    @property
    def kind(self) -> str:
        return "story" if self.source == TINYSTORIES else "chat"

    @classmethod
    def named(cls, name: str, n_prompts: int, max_new_tokens: int) -> Dataset:
        """A dataset by short name (tinystories, mt_bench, gsm8k, ...) or by jsonl path."""
        if name == TINYSTORIES:
            source = TINYSTORIES
        elif name in SPEC_BENCH_FILES:
            source = SPEC_BENCH_FILES[name]
        elif name.endswith(".jsonl"):
            source, name = name, Path(name).stem
        else:
            known = ", ".join([TINYSTORIES, *SPEC_BENCH_FILES])
            raise ValueError(f"unknown dataset {name!r}: use one of {known} or a .jsonl path")
        return cls(name=name, source=source, n_prompts=n_prompts, max_new_tokens=max_new_tokens)

    def load(self, tokenizer) -> PromptSet:
        if tokenizer is None:
            raise ValueError(f"dataset {self.name}: the target has no tokenizer")
        if self.kind == "story":
            ids = tinystories_prompts(tokenizer, self.n_prompts)
            prompts = tuple(Prompt(str(i), "story", tuple(p)) for i, p in enumerate(ids))
            description = f"first 8 words of {len(prompts)} TinyStories dev paragraphs"
        else:
            chosen = select_questions(read_spec_bench(self.source), self.n_prompts)
            prompts = tuple(
                Prompt(q.question_id, q.category, tuple(encode_question(tokenizer, q.turns[0])))
                for q in chosen
            )
            n_cat = len({q.category for q in chosen})
            template = "chat template" if tokenizer.chat_template else "raw text"
            description = (
                f"{len(prompts)} first turns of {Path(self.source).name} "
                f"({n_cat} categories, round-robin; {template})"
            )
        return PromptSet(self.name, prompts, self.max_new_tokens, description)
