"""Training prompts that resemble evaluation questions: the phrases that find them, and the
word-overlap measure that ranks every training turn by its nearest evaluation turn.

No prompt generator reads an evaluation file, but some of their templates ask the same question,
or pose the same kind of problem in the same setting, as a turn of MT-bench or of an EAGLE
question file: in specjax.train.broad_prompts the remainder of twice a number, f(x) = c x^3 -
b x + a, a character "using strong imagery", a story that begins with a given sentence, an
outline for a blog post comparing two things, numbered movie reviews, the longest common
subsequence, the brothers-and-sisters riddle and the constraint "start every sentence with a
different letter"; in specjax.train.task_prompts passengers getting off and on a bus at each
stop; among the code tasks of specjax.train.prompts the nth Fibonacci number and three humaneval
problems (the greatest common divisor, the palindrome check, the second smallest element); how
machine learning and photosynthesis work (MT-bench's STEM questions on them); and three turns the
target wrote itself that ask alpaca questions. RESEMBLING holds a phrase of each.

The first eight were found by reading; the rest by nearest_evaluation, a word-overlap measure
that ranks every training turn by its nearest evaluation turn (experiments/evaluation_overlap.py
writes the tables, and tests/test_evaluation_like.py holds every prompt source to them: a turn at
or above SIMILAR is either in RESEMBLING or read and judged unlike, REVIEWED). The measure finds
reused words, not paraphrases in other words, so its tables are read as well as thresholded.

The committed answer sets hold such answers: 39 of smollm2-synthetic's 2,048, 573 of
smollm2-broad's 4,096, 65 of smollm2-tasks' 4,096 and 17 of smollm2-self's 1,536 (NOTES.md,
"Sixty-sixth session"). A recipe with DrafterRecipe.drop_evaluation_like trains without them
(specjax.train.data.drop_evaluation_like); a new answer set skips such turns when it draws
its prompts (DistillConfig.skip_evaluation_like).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

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
    "is driving a",  # task_prompts' passengers on a bus, tram or ferry (MT-bench's bus question)
    "Each daughter has as many brothers as sisters",  # MT-bench's brothers-and-sisters riddle
    "Start every sentence with a different letter",  # an MT-bench second turn's constraint
    "machine learning",  # MT-bench's STEM questions on these two topics ask what the
    "photosynthesis",  # generators' "explain / describe how it works" templates ask
    "greatest common divisor",  # code tasks that are humaneval problems
    "palindrome",
    "second smallest",
    # Turns the target wrote itself (smollm2-self) that ask an alpaca question
    "using AI in healthcare",  # alpaca 41 (benefits of AI in the healthcare sector)
    "AI in the healthcare",
    "AI in a healthcare",
    "social media's supposed benefits",
    "historical sites in Rome",
)

# The evaluation questions (question_id by set) whose first turn a RESEMBLING phrase asks the
# same as: tau on them is reported apart from the rest (experiments/drafter_tau.py).
RESEMBLED = {
    "mt_bench": ("83", "85", "87", "104", "115", "118", "120", "122", "124", "131", "143", "149"),
    "humaneval": ("64", "69", "77"),
    "alpaca": ("41", "46", "64"),
}

# Turns whose nearest evaluation turn (labelled as evaluation_turns does) scores at least SIMILAR
# (nearest_evaluation), read and judged unlike it: (phrase of the turn, the evaluation turns it
# was judged against, why). A turn near another evaluation turn is not excused.
REVIEWED = (
    ("Solve for x:", ("alpaca 24 turn 1", "mt_bench 117 turn 2", "mt_bench 120 turn 2"),
     "a linear equation; the turns ask for an algorithm, an inequality, a cubic's root"),
    ("Pythagorean theorem", ("mt_bench 99 turn 2",),
     "asked about (misconceptions, history, what it is), not proved"),
    ("is older than", ("gsm8k 65 turn 1",), "ordering by age, not age arithmetic"),
    ("Write a poem about", ("mt_bench 152 turn 2",), "a poem on a topic, not an allegory"),
    ("A train travels", ("gsm8k 33 turn 1",), "speed from distance and time, not a round trip"),
    ("and what number is", ("mt_bench 118 turn 2",), "percentages, not remainders"),
    ("Design a simple experiment", ("mt_bench 150 turn 2",),
     "a classroom demonstration, not the turn's river-impact experiment"),
    ("What can you do for me?", ("mt_bench 91 turn 2",), "a different question"),
    ("handle of DNA", ("qa 366 turn 1",), "a different question"),
    ("reduce stress while studying", ("alpaca 23 turn 1",), "stress, not distractions"),
    ("benefits of using a VPN", ("alpaca 64 turn 1",), "a VPN, not social media"),
    ("main character in Harry Potter", ("qa 338 turn 1",),
     "a different question on the same books"),
    ("Quantum particles", ("mt_bench 141 turn 1",), "a list of particles, not superposition"),
    ("rolling a sum", ("gsm8k 27 turn 1",), "a different dice question"),
    ("what a histogram is", ("humaneval 13 turn 1",), "what the chart is, not the code task"),
    ("value of x in 5 + x", ("mt_bench 120 turn 1",), "a sum of unknowns, not a cubic's value"),
    ("C++ inheritance in detail", ("mt_bench 153 turn 2",), "shares only 'explain in detail'"),
    ("implement a quantum computer", ("mt_bench 141 turn 1",),
     "building a computer, not what superposition is"),
)  # fmt: skip
SIMILAR = 0.4


def resembles_evaluation(text: str) -> bool:
    """Whether a training prompt's text carries a phrase of RESEMBLING (case ignored: a
    self-written turn asks for the "fibonacci series")."""
    text = text.lower()
    return any(phrase.lower() in text for phrase in RESEMBLING)


def evaluation_turns() -> tuple[list[str], list[str]]:
    """(labels "SET QUESTION_ID turn K", texts) of every turn of MT-bench and of every EAGLE
    question file: what training turns are compared with."""
    from specjax.datasets import SPEC_BENCH_FILES, read_spec_bench

    labels, texts = [], []
    for name, path in SPEC_BENCH_FILES.items():
        for q in read_spec_bench(path):
            for k, turn in enumerate(q.turns, 1):
                labels.append(f"{name} {q.question_id} turn {k}")
                texts.append(turn)
    return labels, texts


def _words(text: str) -> list[str]:
    """Lower-case alphabetic words of two letters or more (a variable name such as x is not
    evidence that two questions are alike)."""
    return re.findall(r"[a-z]{2,}", text.lower())


def nearest_evaluation(
    prompts: Sequence[str], turns: Sequence[str], chunk: int = 512
) -> tuple[np.ndarray, np.ndarray]:
    """(similarity [P] float32, index [P] int32): each prompt's nearest evaluation turn by the
    cosine of TF-IDF word vectors: _words, term weight 1 + log count, inverse document frequency
    log((1 + T) / (1 + df)) + 1 over the T turns alone, so that a prompt's score does not depend
    on the other prompts it is scored with. 1.0 is the same words with the same weights."""
    turn_words = [Counter(_words(t)) for t in turns]
    df: Counter = Counter()
    for doc in turn_words:
        df.update(doc.keys())
    vocab = {w: i for i, w in enumerate(df)}
    idf = np.log((1 + len(turns)) / (1 + np.array([df[w] for w in vocab], np.float32))) + 1
    unseen_idf = float(np.log(1 + len(turns)) + 1)  # a word no turn has: only lengthens a prompt

    def vectors(texts: Sequence[str] | Sequence[Counter]) -> np.ndarray:
        x = np.zeros((len(texts), len(vocab)), np.float32)
        extra = np.zeros(len(texts), np.float32)  # squared weight of words outside vocab
        for r, doc in enumerate(texts):
            doc = doc if isinstance(doc, Counter) else Counter(_words(doc))
            for w, k in doc.items():
                if w in vocab:
                    x[r, vocab[w]] = (1 + math.log(k)) * idf[vocab[w]]
                else:
                    extra[r] += ((1 + math.log(k)) * unseen_idf) ** 2
        norms = np.sqrt((x * x).sum(1) + extra)[:, None]
        return x / np.where(norms > 0, norms, 1)

    evals = vectors(turn_words)
    best = np.zeros(len(prompts), np.float32)
    index = np.zeros(len(prompts), np.int32)
    for start in range(0, len(prompts), chunk):
        sims = vectors(prompts[start : start + chunk]) @ evals.T
        best[start : start + len(sims)] = sims.max(1)
        index[start : start + len(sims)] = sims.argmax(1)
    return best, index


def reviewed(text: str, evaluation_label: str) -> bool:
    """Whether a prompt near the evaluation turn of that label (evaluation_turns) was read and
    judged unlike it (REVIEWED)."""
    return any(phrase in text and evaluation_label in labels for phrase, labels, _ in REVIEWED)
