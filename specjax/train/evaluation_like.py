"""Training answers whose prompts resemble evaluation questions, and a dataset without them.

No prompt generator reads an evaluation file, but some templates of specjax.train.broad_prompts
(and one code task of specjax.train.prompts) were written after MT-bench first turns: the
remainder of twice a number, f(x) = c x^3 - b x + a, a character "using strong imagery", a story
that begins with a given sentence, an outline for a blog post comparing two things, numbered
movie reviews, the longest common subsequence and the nth Fibonacci number. Their answers are in
the committed answer sets: 423 of smollm2-broad's 4,096, and 5 of smollm2-synthetic's and 6 of
smollm2-self's (Fibonacci); none of smollm2-tasks' (NOTES.md, "Sixty-fifth session"). A recipe
with DrafterRecipe.drop_evaluation_like trains without them: the rows are found by the text of
their prompts, so the committed answers and their cached features serve unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specjax.train.data import Dataset

# Phrases of the templates above, as they appear in a prompt's text (chat template included).
RESEMBLING = (
    "What is the remainder when twice the number is divided by",
    "x^3 - ",
    "using strong imagery",
    "begins with the sentence:",
    "outline for a blog post comparing",
    "This movie was",
    "longest common subsequence",
    "Fibonacci",
)


def resembles_evaluation(text: str) -> bool:
    """Whether a training prompt's text comes from a template written after an evaluation
    question (RESEMBLING)."""
    return any(phrase in text for phrase in RESEMBLING)


def drop_evaluation_like(data: Dataset, decode: Callable[[list[int]], str]) -> tuple[Dataset, int]:
    """(data without the rows whose prompt resembles an evaluation question, rows dropped).
    decode: the target tokenizer's ids -> text, applied to each row's prompt tokens."""
    prompts = (data.tokens[r, : data.prompt_lens[r]].tolist() for r in range(len(data.lengths)))
    keep = np.array([not resembles_evaluation(decode(p)) for p in prompts], bool)
    return data.rows(np.flatnonzero(keep)), int((~keep).sum())
