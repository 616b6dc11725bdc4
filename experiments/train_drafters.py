"""Reproduce the shipped drafters in checkpoints/: distill each target's answers, train the
hidden-state (mdc) and EAGLE-style drafters on the same data with the same budget, save them with
a training card that states the measured tau.

    python experiments/train_drafters.py                          # all four
    python experiments/train_drafters.py --only smollm2-mdc       # one of them
    python experiments/train_drafters.py --only stories260K-eagle --steps 100   # a quick try
    python experiments/train_drafters.py --only smollm2-mdc --remeasure   # card tau only
    python experiments/train_drafters.py --only smollm2-mdc --extra smollm2-tasks
        # also train on another committed answer set (experiments/distill_answers.py)
    python experiments/train_drafters.py --only smollm2-eagle --steps 400 --out runs/noise \
        --train feature_noise=0.1 --recipe draft_vocab=16384
        # a variant of a recipe (TrainConfig / DrafterRecipe fields), for comparisons
    python experiments/train_drafters.py --only smollm2-eagle --steps 1800 --train lr=5e-4 \
        --train seed=1 --init-from checkpoints/smollm2-eagle --out runs/eagle_more
        # a continuation: the shipped weights trained further with a schedule of its own

Each target's answers are kept token-only in experiments/answers/<set>/ (committed; see
ANSWER_SET), so a fresh checkout only rebuilds their features teacher-forced (a prefill,
~370 tokens/s for SmolLM2 on 2 CPU cores) into experiments/cache/distill/<set>/ (gitignored,
shared by the two kinds of a target); missing answers are generated (resumable).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import shlex
import sys
from pathlib import Path

from distill_answers import SYNTHETIC_CHAT, answers_dir, features_dir

from specjax.paths import SMOLLM2, STORIES260K, shared_path
from specjax.train.data import DistillConfig
from specjax.train.pipeline import DrafterRecipe, remeasure_card, train_drafter
from specjax.train.trainer import TrainConfig

ROOT = Path(__file__).resolve().parents[1]

STORY_DATA = DistillConfig(kind="story", temperatures=(0.0, 0.8), max_new_tokens=128, batch=64)
# Same data for both kinds of a target and, for stories260K, the same budget (SmolLM2's: below).
STORY_TRAIN = TrainConfig(steps=1200, batch=16, levels=4, lr=2e-3, warmup=100)
# 1200 steps x 8 sequences: 3 epochs of the 3232 answers below (600 steps reached tau 2.16
# eagle / 2.10 mdc, still rising); both SmolLM2 kinds train in about 75 minutes on 2 cores.
CHAT_TRAIN = TrainConfig(steps=1200, batch=8, levels=3, lr=2e-3, warmup=60)

# The SmolLM2 drafters train on committed greedy answers (experiments/distill_answers.py grows
# the sets; the counts are fixed here so the shipped drafters stay reproducible): the first 60
# shards of smollm2-synthetic (1920 answers), the first 19 of smollm2-broad (1216 answers to
# multi-part requests) and the first 57 of smollm2-tasks (the task prompt generators of
# specjax.train.task_prompts), at 2400 steps so that the chat-like sets keep about their old
# share of the sequences seen. Against the 1200-step eagle trained with smollm2-chat: MT-bench tau
# +0.093 +- 0.060 (40 first turns, experiments/results/drafter_tau_eagle_2400.md); the mdc on the
# same recipe against the one trained with smollm2-chat: +0.041 +- 0.038 (80 first turns,
# experiments/results/drafter_tau_mdc_clean.md).
# Answer sets written from evaluation prompts (EAGLE's question files): no run trains on them.
EVALUATION_DERIVED = ("smollm2-chat",)
SMOLLM2_SHARDS = 60
SMOLLM2_CLEAN_EXTRA = (("smollm2-broad", 19), ("smollm2-tasks", 57))
# The eagle on every held-in answer shard committed so far (64 of each set: 10,240 answers, 1.39M
# answer tokens against 6,784 / 0.89M above), same 9600 steps: MT-bench tau +0.126 +- 0.052 over
# the same recipe on the data above (80 first turns,
# experiments/results/drafter_tau_eagle_data2.md), level on qa, sum and gsm8k
# (drafter_tau_eagle_data2_tasks.md), so it ships on this data.
SMOLLM2_DATA2_SHARDS = 64
SMOLLM2_DATA2_EXTRA = (("smollm2-broad", 64), ("smollm2-tasks", 64))
# The mdc on the same data and steps: MT-bench tau 2.661 +- 0.135 against 2.433 for the recipe
# before (SMOLLM2_SHARDS, SMOLLM2_CLEAN_EXTRA at 4800 steps; drafter_tau_mdc_data2.md).
# name -> (shards of smollm2-synthetic, extra answer sets with their shard counts)
SMOLLM2_DATA = {
    "smollm2-eagle": (SMOLLM2_DATA2_SHARDS, SMOLLM2_DATA2_EXTRA),
    "smollm2-mdc": (SMOLLM2_DATA2_SHARDS, SMOLLM2_DATA2_EXTRA),
}
# Both kinds at twice that budget (4800 steps, 5.6 epochs of the answers, no sign of overfitting):
# MT-bench tau on all 80 first turns, eagle +0.153 +- 0.035 over 2400 steps and ahead on EAGLE's
# qa, sum and gsm8k sets (experiments/results/drafter_tau_eagle_4800.md,
# drafter_tau_eagle_4800_tasks.md); mdc +0.137 +- 0.034 (drafter_tau_mdc_4800.md). The eagle at
# 9600 steps (11 epochs): +0.096 +- 0.035 over 4800 on MT-bench and ahead on qa, sum and gsm8k
# (drafter_tau_eagle_9600.md, drafter_tau_eagle_9600_tasks.md), so it ships at 9600.
CLEAN_CHAT_STEPS = {"smollm2-eagle": 9600, "smollm2-mdc": 9600}
# Answers to generated turns that ask what an evaluation turn asks
# (specjax.train.evaluation_like: 677 of the eagle's 10,240) are left out. The eagle trained
# without them reads the same as the one before on the 68 MT-bench first turns no training
# template resembles (paired -0.002 +- 0.051, experiments/results/drafter_tau_eagle_clean.md), so
# it ships; the mdc follows once its own retrain is measured.
DROP_EVALUATION_LIKE = {"smollm2-eagle": True, "smollm2-mdc": False}
# The mdc trained with bfloat16 products (float32 accumulation; about half the step time on an
# AMX CPU, ~1% lower tau at equal steps: NOTES.md "Forty-first session"); the eagle in float32.
CHAT_PRODUCTS = {"smollm2-eagle": "float32", "smollm2-mdc": "bfloat16"}

# The mdc readout injects the parent and the grandparent token: on stories260K (400 steps, same
# data) tau 4.84 against 4.64 with the parent only, unrolled-level agreement at levels 3/4
# 0.631/0.605 against 0.585/0.535 (the EAGLE-style drafter: 4.68). Four (the shipped SmolLM2
# mdc widened and continued 500 steps) changed MT-bench tau by -0.015 +- 0.025
# (drafter_tau_mdc_path4.md), so it stays at two.
PATH_TOKENS = {"mdc": 2, "eagle": 1}

# EAGLE-3's multi-layer fusion (DrafterConfig.fusion_layers) where it measured better: stories260K
# eagle at the full recipe, tau +0.113 +- 0.063 at T=0 and +0.049 +- 0.174 at T=1 over the same
# recipe without it (40 dev prefixes, experiments/results/drafter_ablation_stories260K_full.md).
# mdc gained nothing at 400 steps (drafter_ablation_stories260K.md); SmolLM2 eagle +0.007 +- 0.030
# at a short budget (drafter_ablation_smollm2.md).
FUSION_LAYERS = {"stories260K-eagle": (1, 3)}

# target -> the directory name of its drafters' own answers (under experiments/answers) and
# features (under experiments/cache/distill)
ANSWER_SET = {"smollm2": "smollm2-synthetic", "stories260K": "stories260K-story"}

# name -> (target checkpoint under the shared folder, recipe)
RECIPES = {
    f"stories260K-{kind}": (
        STORIES260K,
        DrafterRecipe(
            kind=kind,
            data_kind="story",
            distill=STORY_DATA,
            train=STORY_TRAIN,
            draft_vocab=512,
            path_tokens=PATH_TOKENS[kind],
            fusion_layers=FUSION_LAYERS.get(f"stories260K-{kind}", ()),
        ),
    )
    for kind in ("mdc", "eagle")
} | {
    f"smollm2-{kind}": (
        SMOLLM2,
        DrafterRecipe(
            kind=kind,
            data_kind="chat",
            distill=SYNTHETIC_CHAT,
            train=dataclasses.replace(
                CHAT_TRAIN,
                steps=CLEAN_CHAT_STEPS[f"smollm2-{kind}"],
                products=CHAT_PRODUCTS[f"smollm2-{kind}"],
            ),
            draft_vocab=8192,
            max_shards=SMOLLM2_DATA[f"smollm2-{kind}"][0],
            extra_sets=SMOLLM2_DATA[f"smollm2-{kind}"][1],
            path_tokens=PATH_TOKENS[kind],
            drop_evaluation_like=DROP_EVALUATION_LIKE[f"smollm2-{kind}"],
        ),
    )
    for kind in ("mdc", "eagle")
}


def committed_answer_features(
    name: str, shards: int | None = None, fusion_layers: tuple[int, ...] = ()
) -> Path:
    """The feature directory of a committed answer set, rebuilt teacher-forced from the answers
    where the cache lacks it (no generation: only the shards already answered are used; the
    first `shards` of them when given), with the hidden states of fusion_layers when given."""
    from distill_answers import ANSWER_SETS

    import specjax
    from specjax.train.data import build_dataset

    target, cfg = ANSWER_SETS[name]
    # A crash mid-write leaves shard_N.tmp.npz behind: not an answered shard.
    shards_done = answers_dir(name).glob("shard_*.npz")
    answered = sum(not p.name.endswith(".tmp.npz") for p in shards_done)
    if not answered or answered < (shards or 0):
        raise ValueError(
            f"answer set {name} has {answered} shards ({shards} needed): run "
            f"experiments/distill_answers.py --set {name}"
        )
    # build_dataset refuses an answers directory written with other settings than cfg.
    build_dataset(
        specjax.load(shared_path(target)),
        features_dir(name, fusion_layers),
        cfg,
        source=str(shared_path(target)),
        answers_dir=answers_dir(name),
        max_shards=shards or answered,
        fusion_layers=fusion_layers,
    )
    return features_dir(name, fusion_layers)


def override(obj, assignments: list[str], what: str):
    """obj with dataclass fields replaced from KEY=VALUE strings (VALUE a Python literal)."""
    fields = {f.name for f in dataclasses.fields(obj)}
    changes = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise SystemExit(
                f"--{what} {item!r}: expected KEY=VALUE with KEY one of {sorted(fields)}"
            )
        try:
            changes[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise SystemExit(f"--{what} {item!r}: VALUE must be a Python literal") from None
    return dataclasses.replace(obj, **changes)


def _shell_word(word: str) -> str:
    """`word` as one shell word: bare when it can be, in double quotes when it holds nothing a
    shell expands there (recipe values such as "extra_sets=(('a', 64),)" read as written)."""
    if word and all(c.isalnum() or c in "_=.,:/+-" for c in word):
        return word
    if not any(c in word for c in '"$`\\!'):
        return f'"{word}"'
    return shlex.quote(word)


def _command(name: str, args) -> str:
    """The command line that reproduces drafter `name` with these arguments (for its card)."""
    words = ["python experiments/train_drafters.py --only", name]
    if args.steps is not None:
        words.append(f"--steps {args.steps}")
    words += [f"--extra {_shell_word(e)}" for e in args.extra]
    words += [f"--train {_shell_word(t)}" for t in args.train]
    words += [f"--recipe {_shell_word(r)}" for r in args.recipe]
    if args.init_from:
        words.append(f"--init-from {_shell_word(args.init_from)}")
    return " ".join(words)


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
        "--train",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a TrainConfig field of the recipe (e.g. feature_noise=0.1)",
    )
    parser.add_argument(
        "--recipe",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a DrafterRecipe field (e.g. draft_vocab=16384)",
    )
    parser.add_argument(
        "--init-from",
        default=None,
        metavar="DIR",
        help="start from this drafter's weights (same recipe and data) with the run's own "
        "schedule: a continuation",
    )
    parser.add_argument(
        "--no-calibrate",
        action="store_true",
        help="skip the acceptance profile (a comparison run; calibrate_drafters.py adds it later)",
    )
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="no training: measure the saved drafters' tau again and rewrite their cards",
    )
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps {args.steps}: train at least 1 step")
    if args.init_from is not None:
        if not (Path(args.init_from) / "drafter.json").is_file():
            parser.error(
                f"--init-from {args.init_from}: no trained drafter there (no drafter.json)"
            )
        if len(args.only or RECIPES) != 1:
            parser.error("--init-from continues one drafter: name it with one --only")
    for name in args.only or sorted(RECIPES):
        target, recipe = RECIPES[name]
        if args.remeasure:
            tau = remeasure_card(shared_path(target), recipe, Path(args.out) / name)
            print(f"[train-drafter] {name}: tau {tau:.2f}; card rewritten")
            continue
        if args.steps is not None:
            recipe = dataclasses.replace(
                recipe, train=dataclasses.replace(recipe.train, steps=args.steps)
            )
        recipe = override(recipe, args.recipe, "recipe")
        recipe = dataclasses.replace(recipe, train=override(recipe.train, args.train, "train"))
        extras = [*recipe.extra_sets, *((e, None) for e in args.extra)]
        check_extra_sets(parser, [e for e, _ in extras])
        train_drafter(
            shared_path(target),
            recipe,
            Path(args.out) / name,
            data_dir=features_dir(ANSWER_SET[name.split("-")[0]], recipe.fusion_layers),
            extra_data={
                extra: (committed_answer_features(extra, n, recipe.fusion_layers), n)
                for extra, n in extras
            },
            answers_dir=answers_dir(ANSWER_SET[name.split("-")[0]]),
            eval_n=args.eval_n,
            reproduce=_command(name, args),
            init_from=args.init_from,
            calibrate=not args.no_calibrate,
        )
    return 0


def check_extra_sets(parser, names) -> None:
    """Refuse (parser.error) extra answer sets a run must not train on: those written from
    evaluation prompts, a recipe's own set, and a set named twice (--extra on top of the
    recipe's extra_sets would read it twice, or silently replace its shard count)."""
    for extra in names:
        if extra in EVALUATION_DERIVED:
            parser.error(
                f"extra set {extra}: its prompts are EAGLE's question files, which are "
                "evaluation data; train on smollm2-broad or smollm2-tasks instead"
            )
        if extra in ANSWER_SET.values():
            parser.error(f"extra set {extra}: that set is already a recipe's own data")
    twice = sorted({e for e in names if names.count(e) > 1})
    if twice:
        parser.error(f"extra sets named twice: {twice} (in --recipe extra_sets and --extra?)")


if __name__ == "__main__":
    sys.exit(main())
