"""Reproduce the shipped drafters in checkpoints/: distill each target's answers, train the
hidden-state (mdc) and EAGLE-style drafters on the same data with the same budget, save them with
a training card that states the measured tau.

    python experiments/train_drafters.py                          # all four
    python experiments/train_drafters.py --only smollm2-mdc       # one of them
    python experiments/train_drafters.py --only stories260K-eagle --steps 100   # a quick try
    python experiments/train_drafters.py --only smollm2-mdc --remeasure   # card tau only
    python experiments/train_drafters.py --only smollm2-mdc --extra smollm2-synthetic
        # also train on the committed answers of experiments/answers/smollm2-synthetic
        # (features rebuilt teacher-forced; see experiments/distill_answers.py)

Distillation data is cached under experiments/cache/distill/<target>/ (resumable, shared by the
two kinds of a target).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from specjax.paths import SMOLLM2, STORIES260K, shared_path
from specjax.train.data import DistillConfig
from specjax.train.pipeline import DrafterRecipe, remeasure_card, train_drafter
from specjax.train.trainer import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "experiments" / "cache" / "distill"

STORY_DATA = DistillConfig(kind="story", temperatures=(0.0, 0.8), max_new_tokens=128, batch=64)
CHAT_DATA = DistillConfig(kind="chat", temperatures=(0.0, 0.7, 1.0), max_new_tokens=256, batch=32)
# Same data and the same budget for both kinds of a target, so the comparison is fair.
STORY_TRAIN = TrainConfig(steps=1200, batch=16, levels=4, lr=2e-3, warmup=100)
CHAT_TRAIN = TrainConfig(steps=500, batch=8, levels=3, lr=2e-3, warmup=40)

# name -> (target checkpoint under the shared folder, recipe)
RECIPES = {
    f"stories260K-{kind}": (
        STORIES260K,
        DrafterRecipe(
            kind=kind, data_kind="story", distill=STORY_DATA, train=STORY_TRAIN, draft_vocab=512
        ),
    )
    for kind in ("mdc", "eagle")
} | {
    f"smollm2-{kind}": (
        SMOLLM2,
        DrafterRecipe(
            kind=kind, data_kind="chat", distill=CHAT_DATA, train=CHAT_TRAIN, draft_vocab=8192
        ),
    )
    for kind in ("mdc", "eagle")
}


def committed_answer_features(name: str) -> Path:
    """The feature directory of a committed answer set, rebuilt teacher-forced from the answers
    where the cache lacks it (no generation: only the shards already answered are used)."""
    from distill_answers import ANSWER_SETS, answers_dir, features_dir

    import specjax
    from specjax.train.data import build_dataset

    target, cfg = ANSWER_SETS[name]
    answered = len(list(answers_dir(name).glob("shard_*.npz")))
    if not answered:
        raise ValueError(f"answer set {name} is empty: run experiments/distill_answers.py")
    # build_dataset refuses an answers directory written with other settings than cfg.
    build_dataset(
        specjax.load(shared_path(target)),
        features_dir(name),
        cfg,
        source=str(shared_path(target)),
        answers_dir=answers_dir(name),
        max_shards=answered,
    )
    return features_dir(name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(RECIPES), default=None)
    parser.add_argument("--steps", type=int, default=None, help="override the training steps")
    parser.add_argument("--out", default=str(ROOT / "checkpoints"))
    parser.add_argument("--eval-n", type=int, default=10, help="held-out prompts for the card")
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        help="an answer set of experiments/distill_answers.py to train on as well",
    )
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="no training: measure the saved drafters' tau again and rewrite their cards",
    )
    args = parser.parse_args(argv)
    for name in args.only or sorted(RECIPES):
        target, recipe = RECIPES[name]
        if args.remeasure:
            tau = remeasure_card(shared_path(target), recipe, Path(args.out) / name)
            print(f"[train-drafter] {name}: tau {tau:.2f}; card rewritten")
            continue
        if args.steps:
            recipe = dataclasses.replace(
                recipe, train=dataclasses.replace(recipe.train, steps=args.steps)
            )
        train_drafter(
            shared_path(target),
            recipe,
            Path(args.out) / name,
            data_dir=CACHE / Path(target).parent.name,
            extra_data={extra: committed_answer_features(extra) for extra in args.extra},
            eval_n=args.eval_n,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
