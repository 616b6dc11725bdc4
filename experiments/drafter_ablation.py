"""EAGLE-3's two changes, one at a time, for both feature-drafter kinds: multi-layer fusion (the
drafter reads lower target layers fused into the last hidden state) and training-time test
(unrolled over every level of the tree with no feature regression), against the shipped recipe.

    python experiments/drafter_ablation.py --target stories260K          # 2 kinds x 4 variants
    python experiments/drafter_ablation.py --target smollm2 --kinds eagle --steps 400 \
        --recipe max_shards=20 --recipe "extra_sets=()" --n 40          # a short-budget A/B

Every variant is trained with the recipe of experiments/train_drafters.py (same data, steps and
seed; only the named change differs) into experiments/cache/ablation/<target>/<kind>-<variant>/
(gitignored; a variant already trained there is measured again, not retrained), then decoded
greedily and at T=1 on held-out prompts (TinyStories dev prefixes / MT-bench first turns), tree
31 nodes / depth 6 / top-8. Writes experiments/results/drafter_ablation_<target>.md: tau per
variant with 95% intervals, the paired difference to the base on the same prompts, and the final
training agreement per unrolled level.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
from drafter_tau import interval
from train_drafters import (
    ANSWER_SET,
    RECIPES,
    answers_dir,
    committed_answer_features,
    features_dir,
    override,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"

# EAGLE-3 fuses a low, a middle and a high layer (2, L/2 and L-3 of a 32-layer Llama); our high
# layer is the last (the drafter's readout is the target's final norm and LM head), so the
# fusion adds a low and a middle one.
FUSION = {"stories260K": (1, 3), "smollm2": (2, 15)}
TTT_LEVELS = 6  # the card tree's depth: every level a drafted node can sit at is trained


def variant_recipe(recipe, target: str, variant: str):
    """The recipe with EAGLE-3's changes named by variant: base | fusion | ttt | both, or one
    half of training-time test: ttt-levels (every level, regression kept) | ttt-noreg (no
    regression, the recipe's levels). The base has no fusion even where the shipped recipe now
    has it (stories260K-eagle), so every variant is measured against the same unfused base."""
    fused = variant in ("fusion", "both")
    recipe = dataclasses.replace(recipe, fusion_layers=FUSION[target] if fused else ())
    changes = {
        "ttt": {"levels": TTT_LEVELS, "feature_weight": 0.0},
        "both": {"levels": TTT_LEVELS, "feature_weight": 0.0},
        "ttt-levels": {"levels": TTT_LEVELS},
        "ttt-noreg": {"feature_weight": 0.0},
    }.get(variant, {})
    return dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, **changes))


def main(argv=None) -> int:
    import specjax
    from specjax.benchmark import device_header
    from specjax.drafters import load_drafter
    from specjax.paths import shared_path
    from specjax.train.pipeline import eval_prompts, measure_tau, train_drafter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=sorted(FUSION), default="stories260K")
    parser.add_argument("--kinds", nargs="+", choices=["eagle", "mdc"], default=["eagle", "mdc"])
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=["base", "fusion", "ttt", "both", "ttt-levels", "ttt-noreg"],
        default=["base", "fusion", "ttt", "both"],
    )
    parser.add_argument("--steps", type=int, default=None, help="override the recipe's steps")
    parser.add_argument("--recipe", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--n", type=int, default=40, help="held-out prompts")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--runs", default=None, help="where variants are trained")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    runs = Path(args.runs or ROOT / "experiments" / "cache" / "ablation" / args.target)
    out = Path(args.out or RESULTS / f"drafter_ablation_{args.target}.md")

    t_start = time.perf_counter()
    # Every variant trains on one feature cache that holds the fusion layers (the others ignore
    # them), so the data is built once.
    layers = FUSION[args.target]
    trained = {}
    for kind in args.kinds:
        target_path, recipe = RECIPES[f"{args.target}-{kind}"]
        if args.steps:
            recipe = dataclasses.replace(
                recipe, train=dataclasses.replace(recipe.train, steps=args.steps)
            )
        recipe = override(recipe, args.recipe, "recipe")
        for variant in args.variants:
            r = variant_recipe(recipe, args.target, variant)
            folder = runs / f"{kind}-{variant}"
            if not (folder / "drafter.json").exists():
                t0 = time.perf_counter()
                train_drafter(
                    shared_path(target_path),
                    r,
                    folder,
                    data_dir=features_dir(ANSWER_SET[args.target], layers),
                    extra_data={
                        name: (committed_answer_features(name, n, layers), n)
                        for name, n in r.extra_sets
                    },
                    data_fusion_layers=layers,
                    answers_dir=answers_dir(ANSWER_SET[args.target]),
                    eval_n=10,
                    reproduce=f"python experiments/drafter_ablation.py --target {args.target}",
                    calibrate=False,
                )
                (folder / "train_s.json").write_text(json.dumps(time.perf_counter() - t0))
            trained[(kind, variant)] = (folder, r)
            jax.clear_caches()

    loaded = specjax.load(shared_path(RECIPES[f"{args.target}-{args.kinds[0]}"][0]))
    eos = loaded.tokenizer.eos_id if loaded.tokenizer else None
    data_kind = RECIPES[f"{args.target}-{args.kinds[0]}"][1].data_kind
    what, prompts = eval_prompts(loaded, data_kind, args.n)  # TinyStories dev / MT-bench
    taus = {}
    for (kind, variant), (folder, _) in trained.items():
        drafter = load_drafter(folder, loaded.model, pre_verifier=False)
        for temperature in args.temperatures:
            stats = measure_tau(
                loaded.model,
                drafter,
                prompts,
                temperature=temperature,
                max_new_tokens=args.max_new_tokens,
                eos_id=eos,
            )
            taus[(kind, variant, temperature)] = np.asarray(stats["taus"])
            print(f"{kind} {variant} T={temperature:g}: tau {np.mean(stats['taus']):.3f}")
        jax.clear_caches()

    lines = [
        f"# EAGLE-3's changes, one at a time ({args.target})",
        "",
        f"- command: `python experiments/drafter_ablation.py {' '.join(argv or sys.argv[1:])}`",
        device_header(),
        f"- evaluation: {what}, {args.max_new_tokens} new tokens, tree 31 nodes / depth 6 / "
        "top-8, batches of 8 rows; tau = tokens per target call, per prompt, then averaged",
        "- variants: base = the recipe of experiments/train_drafters.py without fusion; "
        f"fusion = the hidden states after layers {FUSION[args.target]} fused into the last one's "
        f"(DrafterConfig.fusion_layers); ttt = training-time test: {TTT_LEVELS} unrolled levels "
        "(every depth of the tree) and no feature regression (feature_weight 0); both = the two; "
        "ttt-levels / ttt-noreg = the two halves of ttt alone",
        f"- wall time: {(time.perf_counter() - t_start) / 60:.1f} min",
        "",
        "| kind | variant | levels / feature weight | minutes (data, training, card) | "
        "final train agreement by level | "
        + " | ".join(f"tau T={t:g} (95% CI) | vs base" for t in args.temperatures)
        + " |",
        "|---|---|---|---|---|" + "---|---|" * len(args.temperatures),
    ]
    for (kind, variant), (folder, r) in trained.items():
        card = (folder / "CARD.md").read_text()
        metrics = next(
            line.split(": ", 1)[1] for line in card.splitlines() if "final train metrics" in line
        )
        accs = " ".join(
            f"{float(m.split()[1]):.2f}" for m in metrics.split(", ") if m.startswith("acc")
        )
        train_s = json.loads((folder / "train_s.json").read_text())
        cells = []
        for t in args.temperatures:
            x = taus[(kind, variant, t)]
            cell = f"{x.mean():.3f} ± {interval(x):.3f}"
            base = taus.get((kind, "base", t))
            diff = "-" if base is None or variant == "base" else None
            if diff is None:
                d = x - base
                diff = f"{d.mean():+.3f} ± {interval(d):.3f}"
            cells += [cell, diff]
        lines.append(
            f"| {kind} | {variant} | {r.train.levels} / {r.train.feature_weight:g} | "
            f"{train_s / 60:.1f} | {accs} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "vs base: the paired difference of tau on the same prompts (mean, 95% t-interval). "
        "Final train agreement: top-1 agreement with the target at each unrolled level on the "
        "last training batch (a variant with more levels reports more).",
    ]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
