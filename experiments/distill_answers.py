"""Grow the committed distillation answers: the target answers more training prompts, and the
token-only answer shards land in experiments/answers/ (small enough to commit), with the features
in the gitignored cache.

    python experiments/distill_answers.py                  # SmolLM2, synthetic chat prompts
    python experiments/distill_answers.py --shards 10      # stop after 10 new shards
    python experiments/distill_answers.py --set smollm2-broad   # another answer set
    python experiments/distill_answers.py --set smollm2-tasks   # translate, summarize, ...
    python experiments/distill_answers.py --set smollm2-self    # turns the target writes

Resumable: shards already answered are skipped (their features are rebuilt teacher-forced when
the cache lacks them), so each run adds to what earlier runs wrote.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from specjax.paths import SMOLLM2, shared_path
from specjax.train.data import EAGLE_QUESTION_SETS, DistillConfig, build_dataset

ROOT = Path(__file__).resolve().parents[1]

# Greedy answers (the decoding the drafters are measured with) to generated user turns.
SYNTHETIC_CHAT = DistillConfig(
    kind="chat", sets=(), synthetic_prompts=2048, temperatures=(0.0,), max_new_tokens=192, batch=32
)

# Answers at three temperatures to the first turns of EAGLE's alpaca/gsm8k/humaneval/sum sets.
# Those files are evaluation data: the set is kept for the drafters that were trained on it, and
# no new training run uses it (experiments/train_drafters.py refuses it).
CHAT_SETS = DistillConfig(
    kind="chat",
    sets=EAGLE_QUESTION_SETS,
    temperatures=(0.0, 0.7, 1.0),
    max_new_tokens=256,
    batch=32,
)

# Greedy answers to multi-part requests in eight task families (specjax.train.broad_prompts),
# shards of 64 answers whose prompts are length-sorted within windows of 8 shards.
BROAD_CHAT = DistillConfig(
    kind="chat",
    sets=(),
    synthetic_prompts=4096,
    prompt_style="broad",
    sort_window=8,
    temperatures=(0.0,),
    max_new_tokens=192,
    batch=64,
)

# Greedy answers to requests that work on a given text or numbers (specjax.train.task_prompts:
# translation, summarization, questions on a passage, word problems, answers from given context),
# shards of 64 answers whose prompts are length-sorted within windows of 8 shards.
TASKS_CHAT = dataclasses.replace(BROAD_CHAT, prompt_style="tasks")

# Greedy answers to user turns the target writes itself after its chat template's user header
# (specjax.train.self_prompts; the turns are kept in the answers directory, user_turns.json),
# shards of 64 answers whose prompts are length-sorted within windows of 8 shards.
SELF_CHAT = dataclasses.replace(BROAD_CHAT, prompt_style="self")

# All of the sets above were written before some generator templates were found to resemble
# evaluation questions (specjax.train.evaluation_like), so they keep skip_evaluation_like off to
# stay reproducible; drafter recipes leave those answers out instead
# (DrafterRecipe.drop_evaluation_like). A new set turns it on.

# name -> (target checkpoint under the shared folder, distillation settings)
ANSWER_SETS = {
    "smollm2-synthetic": (SMOLLM2, SYNTHETIC_CHAT),
    "smollm2-broad": (SMOLLM2, BROAD_CHAT),
    "smollm2-tasks": (SMOLLM2, TASKS_CHAT),
    "smollm2-self": (SMOLLM2, SELF_CHAT),
    "smollm2-chat": (SMOLLM2, CHAT_SETS),
}


def answers_dir(name: str) -> Path:
    return ROOT / "experiments" / "answers" / name


def answer_shards(name: str) -> list[Path]:
    """The committed shards of an answer set, in order."""
    return sorted(answers_dir(name).glob("shard_*.npz"))


def shard_answers(path: Path) -> list[tuple[np.ndarray, int]]:
    """(prompt + answer token ids, prompt length) of every answer in one shard."""
    d = np.load(path)
    return [
        (row[:n].astype(np.int32), int(p))
        for row, n, p in zip(d["tokens"], d["lengths"], d["prompt_lens"], strict=True)
    ]


def features_dir(name: str, fusion_layers: tuple[int, ...] = ()) -> Path:
    """Where the features of an answer set are cached (gitignored); features that also hold
    the hidden states of fusion layers live beside the plain ones (name@layers-2-15)."""
    suffix = "@layers-" + "-".join(map(str, fusion_layers)) if fusion_layers else ""
    return ROOT / "experiments" / "cache" / "distill" / (name + suffix)


def main(argv=None) -> int:
    import specjax

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="smollm2-synthetic", choices=sorted(ANSWER_SETS))
    parser.add_argument("--shards", type=int, default=None, help="at most this many shards")
    args = parser.parse_args(argv)
    target, cfg = ANSWER_SETS[args.set]
    loaded = specjax.load(shared_path(target))
    build_dataset(
        loaded,
        features_dir(args.set),
        cfg,
        source=str(shared_path(target)),
        answers_dir=answers_dir(args.set),
        max_shards=args.shards,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
