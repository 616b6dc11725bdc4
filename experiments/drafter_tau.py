"""Tau of the shipped SmolLM2 drafters on whole held-out prompt sets, with confidence intervals:
the acceptance comparison of the hidden-state (mdc) and EAGLE-style drafters at the bar's tree
budget, on more prompts than the timed comparison (experiments/drafters.py) can afford.

    python experiments/drafter_tau.py                      # 80 MT-bench + 80 qa turns, T=0 and 1
    python experiments/drafter_tau.py --n 10 --sets mt_bench --temperatures 0   # a quick look
    python experiments/drafter_tau.py --drafter DIR --drafter DIR2   # other drafter directories
    python experiments/drafter_tau.py --sets qa sum gsm8k --temperatures 0   # and all three
    python experiments/drafter_tau.py --drafter DIR --baseline results/drafter_tau_X.json \
        --baseline-name smollm2-eagle --baseline-name smollm2-mdc
        # a new drafter paired with each named drafter of an earlier run (not decoded again)

Every prompt is decoded with max_new_tokens new tokens in batches of 8 rows (rows never depend
on each other, so batching does not change a row's tokens), tree 31 nodes / depth 6 / top-8.
Per drafter and set: mean tau over prompts with a 95% interval (Student t,
specjax.benchmark.mean_ci; results before 2026-12-06 used the normal quantile, ~1.5% narrower
at 80 prompts), the paired difference of the two drafters on the same prompts, the
share of draft nodes served from reused hidden states (mdc), the drafter's layer calls per
step and the acceptance at each depth of the tree. Writes experiments/results/drafter_tau.md,
the per-prompt taus (and each run's steps by accepted tokens) in drafter_tau.json and the
acceptance by depth as a plot, drafter_tau_depth.png (`--replot X.json` redraws it from a json),
and tau on the first turns that training templates resemble apart from the rest (`--split
X.json` writes that table for an earlier run).
Cost on 2 CPU cores: ~20-27 min per drafter and temperature for 80 prompts; run it alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def depth_acceptance(accepted_hist) -> np.ndarray:
    """[D] P(a step accepts at least d draft tokens | it accepted at least d - 1), d = 1..D, from
    the steps counted by accepted draft tokens (accepted_hist [D + 1]); NaN where no step got
    that far. Where two drafters' taus differ, this says at which depth."""
    hist = np.asarray(accepted_hist, np.float64)
    reached = np.cumsum(hist[::-1])[::-1]  # reached[d]: steps that accepted at least d tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        return reached[1:] / reached[:-1]


def plot_depth_acceptance(per_prompt_json: dict, png: Path) -> bool:
    """Acceptance by depth (depth_acceptance) of every drafter, one panel per set and
    temperature, from a drafter_tau .json's "accepted_hist|SET|T|NAME" entries; written to png.
    False (nothing written) when the json has no such entries."""
    panels: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    for key, hist in per_prompt_json.items():
        if key.startswith("accepted_hist|"):
            _, set_name, temperature, name = key.split("|", 3)
            panels.setdefault((set_name, temperature), {})[name] = depth_acceptance(hist)
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2), squeeze=False)
    for ax, ((set_name, temperature), curves) in zip(axes[0], sorted(panels.items()), strict=True):
        for name, rates in sorted(curves.items()):
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=name)
        ax.set_title(f"{set_name}, T={temperature}", fontsize=9)
        ax.set_xlabel("tree depth d")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("P(accept >= d | accepted >= d - 1)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def depth_plot_path(out: Path) -> Path:
    """The acceptance-by-depth plot beside a results file: X.md -> X_depth.png."""
    return out.with_name(out.stem + "_depth.png")


def prompt_digest(prompts) -> str:
    """A short sha256 of a prompt set's token ids: a paired baseline must have decoded the
    same prompts (the question file, its order and the chat template all change them)."""
    ids = json.dumps([[int(t) for t in p] for p in prompts])
    return hashlib.sha256(ids.encode()).hexdigest()[:16]


def _agrees(baseline: dict, key: str, here, path) -> bool:
    """Whether a --baseline json's `key` equals this run's value (here); a file written before
    the key was kept gets a note and is taken to agree."""
    kept = baseline.get(key)
    if kept is None:
        print(f"note: {path} records no {key} (written before it was kept): pairing assumes "
              "this run's", file=sys.stderr)  # fmt: skip
        return True
    return kept == here


def check_baseline(baseline: dict, path, settings: dict, names, sets, temperatures, machine):
    """Refuse, before anything is decoded, a --baseline json this run cannot be paired with:
    other settings, no taus for a set / temperature / name asked for, or decoded on another
    machine (greedy taus reproduce on one machine only: another CPU's floats can flip a near
    tie and every token after it)."""
    if not _agrees(baseline, "settings", settings, path):
        raise SystemExit(
            f"--baseline {path} was run with {baseline['settings']}, this run uses {settings}: "
            "pair runs of the same settings"
        )
    missing = [f"{s}|{t:g}|{n}" for s in sets for t in temperatures for n in names
               if f"{s}|{t:g}|{n}" not in baseline]  # fmt: skip
    if missing:
        held = sorted({k.split("|")[2] for k in baseline if k.count("|") == 2})
        raise SystemExit(
            f"--baseline {path} has no taus for {', '.join(missing)} (set|T|name); its "
            f"drafters: {', '.join(held) or 'none'}"
        )
    if not _agrees(baseline, "machine", machine, path):
        raise SystemExit(
            f"--baseline {path} was decoded on {baseline['machine']}; this is {machine}. Greedy "
            "taus reproduce on one machine only: decode the baseline's drafter here instead "
            "(give it as a second --drafter)"
        )


def check_prompts(baseline: dict, path, digests: dict) -> None:
    """Refuse a --baseline json whose prompts (prompt_digest per set) differ from this run's."""
    for set_name, digest in digests.items():
        if not _agrees(baseline, f"prompts|{set_name}", digest, path):
            raise SystemExit(
                f"--baseline {path} decoded other {set_name} prompts than this run (prompt "
                "digest differs: the question file, its order or the chat template changed); "
                "decode its drafter here instead"
            )


def resembled_mask(set_name: str, n: int) -> np.ndarray:
    """[n] bool: which of a set's first n prompts (the order drafter_tau.py decodes) are first
    turns a training template was written after (specjax.train.evaluation_like.RESEMBLED)."""
    from specjax.datasets import SPEC_BENCH_FILES, read_spec_bench, select_questions
    from specjax.train.evaluation_like import RESEMBLED

    ids = [q.question_id for q in select_questions(read_spec_bench(SPEC_BENCH_FILES[set_name]), n)]
    return np.array([i in RESEMBLED.get(set_name, ()) for i in ids])


def resemblance_lines(per_prompt_json: dict) -> list[str]:
    """Markdown: per set, temperature and drafter of a drafter_tau .json, tau on the first
    turns that a training template was written after (specjax.train.evaluation_like.RESEMBLED)
    and on the rest; the pair's difference on the rest. [] where no set has such turns."""
    from specjax.benchmark import mean_ci
    from specjax.train.evaluation_like import RESEMBLED

    runs = {}  # (set, T) -> {drafter: taus}
    for key, taus in per_prompt_json.items():
        parts = key.split("|")
        if len(parts) == 3 and parts[0] in RESEMBLED:
            runs.setdefault((parts[0], parts[1]), {})[parts[2]] = np.asarray(taus)
    lines = []
    for (set_name, temperature), by_name in runs.items():
        mask = resembled_mask(set_name, len(next(iter(by_name.values()))))
        if not mask.any():
            continue
        for name, taus in by_name.items():
            rest, half = mean_ci(taus[~mask])
            lines.append(
                f"| {set_name} | {temperature} | {name} | {taus[mask].mean():.3f} ({mask.sum()}) | "
                f"{rest:.3f} ± {half:.3f} ({(~mask).sum()}) | {taus.mean():.3f} |"
            )
        names = list(by_name)
        for b in names[1:]:
            d, half = mean_ci(by_name[names[0]][~mask] - by_name[b][~mask])
            lines.append(
                f"| {set_name} | {temperature} | {names[0]} - {b} | | {d:+.3f} ± {half:.3f} | |"
            )
    if not lines:
        return []
    return [
        "",
        "The first turns a training template was written after (specjax.train.evaluation_like."
        "RESEMBLED; their answers are left out of training only where a drafter's card says so) "
        "and the rest:",
        "",
        "| set | T | drafter | tau, resembled turns (n) | tau, the rest (n) | tau, all |",
        "|---|---|---|---|---|---|",
        *lines,
    ]


def main(argv=None) -> int:
    import specjax
    from specjax.benchmark import machine_line, mean_ci
    from specjax.datasets import (
        SPEC_BENCH_FILES,
        encode_question,
        read_spec_bench,
        select_questions,
    )
    from specjax.drafters import load_drafter
    from specjax.drafters.spec import split_drafter_switch
    from specjax.paths import SMOLLM2, SMOLLM2_EAGLE, SMOLLM2_MDC, repo_dir, shared_path
    from specjax.train.pipeline import measure_tau

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=80, help="prompts per set (first turns)")
    parser.add_argument(
        "--sets", nargs="+", default=["mt_bench", "qa"], choices=sorted(SPEC_BENCH_FILES)
    )
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--drafter", action="append", default=None, help="drafter directory (or DIR:stale, ...)"
    )
    parser.add_argument("--out", default=str(RESULTS / "drafter_tau.md"))
    parser.add_argument(
        "--baseline",
        default=None,
        help="a drafter_tau .json of an earlier run: its --baseline-name taus on the same sets, "
        "temperatures and n are paired with this run's drafter instead of decoding again "
        "(greedy taus reproduce on one machine: a file from another machine, with other "
        "prompts or settings is refused before decoding)",
    )
    parser.add_argument(
        "--baseline-name",
        action="append",
        default=None,
        help="a drafter of the --baseline json (repeatable; default smollm2-eagle)",
    )
    parser.add_argument(
        "--replot",
        default=None,
        help="a drafter_tau .json: write its acceptance-by-depth plot beside it and stop "
        "(nothing is decoded)",
    )
    parser.add_argument(
        "--split",
        default=None,
        help="a drafter_tau .json: write its taus on resembled turns and on the rest beside it "
        "(X_resemblance.md) and stop (nothing is decoded)",
    )
    args = parser.parse_args(argv)
    if args.split:
        json_path = Path(args.split)
        lines = resemblance_lines(json.loads(json_path.read_text()))
        if not lines:
            raise SystemExit(f"error: {json_path} has no set with resembled turns")
        out = json_path.with_name(json_path.stem + "_resemblance.md")
        header = [
            f"# {json_path.stem}: resembled turns apart",
            "",
            f"Command: `python experiments/drafter_tau.py --split {args.split}`.",
        ]
        out.write_text("\n".join(header + lines) + "\n")
        print("\n".join(lines))
        return 0
    if args.replot:
        json_path = Path(args.replot)
        png = depth_plot_path(json_path)
        if not plot_depth_acceptance(json.loads(json_path.read_text()), png):
            raise SystemExit(f"error: {json_path} has no accepted_hist entries to plot")
        print(f"wrote {png}")
        return 0
    from specjax.train.pipeline import CARD_TREE

    # What a paired baseline must share with this run (tau depends on each).
    settings = {"max_new_tokens": args.max_new_tokens, "tree": str(CARD_TREE), "batch": 8,
                "pre_verifier": False}  # fmt: skip
    baseline = json.loads(Path(args.baseline).read_text()) if args.baseline else None
    baseline_names = (args.baseline_name or ["smollm2-eagle"]) if baseline is not None else []
    if args.baseline_name and baseline is None:
        raise SystemExit("error: --baseline-name names a drafter of a --baseline json: give one")
    machine = machine_line()
    if baseline is not None:
        check_baseline(baseline, args.baseline, settings, baseline_names, args.sets,
                       args.temperatures, machine)  # fmt: skip

    t_start = time.perf_counter()
    loaded = specjax.load(shared_path(SMOLLM2))
    eos = loaded.tokenizer.eos_id
    paths = args.drafter or [repo_dir() / p for p in (SMOLLM2_MDC, SMOLLM2_EAGLE)]
    # No pre-verifier: tau at the full tree is what the drafters are compared on.
    drafters = {}
    for spec in map(str, paths):  # DIR or DIR:SWITCH (specjax.drafters.spec)
        path, switches = split_drafter_switch(spec)
        name = Path(path).name + spec[len(path) :]
        # A drafter outside checkpoints/ (a retrained smollm2-eagle, say) is named with the
        # folder above, so that it never reads as the shipped one of the same name.
        if Path(path).parent.name != "checkpoints" or name in baseline_names:
            name = f"{Path(path).parent.name}/{name}"
        if name in drafters:
            raise SystemExit(f"error: two drafters named {name}: give each once")
        drafters[name] = load_drafter(path, loaded.model, **{**switches, "pre_verifier": False})
    prompt_sets = {}
    for set_name in args.sets:
        questions = select_questions(read_spec_bench(SPEC_BENCH_FILES[set_name]), args.n)
        prompt_sets[set_name] = [encode_question(loaded.tokenizer, q.turns[0]) for q in questions]
    digests = {s: prompt_digest(p) for s, p in prompt_sets.items()}
    if baseline is not None:
        check_prompts(baseline, args.baseline, digests)
    rows, per_prompt = [], {}
    for set_name, prompts in prompt_sets.items():
        for temperature in args.temperatures:
            for name, drafter in drafters.items():
                stats = measure_tau(
                    loaded.model,
                    drafter,
                    prompts,
                    tree=CARD_TREE,
                    batch=settings["batch"],
                    temperature=temperature,
                    max_new_tokens=args.max_new_tokens,
                    eos_id=eos,
                )
                taus = np.asarray(stats["taus"])
                per_prompt[(set_name, temperature, name)] = taus
                rows.append((set_name, temperature, name, len(prompts), taus, stats))
                print(f"{set_name} T={temperature} {name}: tau {taus.mean():.3f}", flush=True)
            for name in baseline_names:
                taus = np.asarray(baseline[f"{set_name}|{temperature:g}|{name}"])
                if len(taus) != len(prompts):
                    raise SystemExit(
                        f"--baseline has {len(taus)} {set_name} prompts, not {len(prompts)}"
                    )
                per_prompt[(set_name, temperature, name)] = taus
                # Its depth counts too, where the earlier run recorded them.
                hist = baseline.get(f"accepted_hist|{set_name}|{temperature:g}|{name}")
                depth_stats = {"accepted_hist": hist} if hist is not None else {}
                rows.append((set_name, temperature, name, len(prompts), taus, depth_stats))
                print(f"{set_name} T={temperature} {name}: tau {taus.mean():.3f} (baseline)")
            jax.clear_caches()  # one process, many compiled programs (see NOTES.md)

    lines = [
        "# Drafter tau on whole held-out prompt sets",
        "",
        f"- command: `python experiments/drafter_tau.py {' '.join(argv or sys.argv[1:])}`",
        f"- {machine}",
        f"- target: SmolLM2-135M-Instruct (GGUF Q4_1, dequantized, float32); "
        f"{args.max_new_tokens} new tokens per prompt (EOS ends a row earlier); batches of "
        f"{settings['batch']} rows; tree of {CARD_TREE.budget} draft nodes, depth "
        f"{CARD_TREE.max_depth}, top-{CARD_TREE.topk} (the acceptance bar's budget)",
        "- prompts: the first turns of the first n questions of each set, round-robin over "
        "categories (all 80 MT-bench questions at n = 80); chat template",
        f"- wall time: {(time.perf_counter() - t_start) / 60:.1f} min",
        *(
            f"- {name}: per-prompt taus read from {args.baseline} (not decoded)"
            for name in baseline_names
        ),
        "",
        "| set | T | drafter | prompts | tau (95% CI) | reused nodes | layer calls / step |",
        "|---|---|---|---|---|---|---|",
    ]
    for set_name, temperature, name, n, taus, stats in rows:
        reused = calls = "-"
        if stats.get("chain_calls"):
            reused = f"{stats['reused'] / max(stats['drafted'], 1):.1%}"
            calls = f"{stats['chain_calls'] / stats['target_calls']:.2f}"
        lines.append(
            f"| {set_name} | {temperature:g} | {name} | {n} | {taus.mean():.3f} ± "
            f"{mean_ci(taus)[1]:.3f} | {reused} | {calls} |"
        )
    with_depths = [r for r in rows if "accepted_hist" in r[5]]
    if with_depths:
        depth = len(with_depths[0][5]["accepted_hist"]) - 1
        lines += [
            "",
            "Acceptance by depth: P(a step accepts at least d draft tokens | it accepted at least "
            "d - 1), all steps of all prompts:",
            "",
            "| set | T | drafter | " + " | ".join(f"d={d}" for d in range(1, depth + 1)) + " |",
            "|---|---|---|" + "---|" * depth,
        ]
        for set_name, temperature, name, _, _, stats in with_depths:
            rates = depth_acceptance(stats["accepted_hist"])
            lines.append(
                f"| {set_name} | {temperature:g} | {name} | "
                + " | ".join("-" if np.isnan(r) else f"{r:.3f}" for r in rates)
                + " |"
            )
        lines += ["", f"![acceptance by depth]({depth_plot_path(Path(args.out)).name})"]
    names = list(drafters) + baseline_names
    if len(args.sets) > 1:
        lines += ["", "All sets together (every prompt weighs the same):", ""]
        for temperature in args.temperatures:
            for name in names:
                x = np.concatenate([per_prompt[(s, temperature, name)] for s in args.sets])
                lines.append(
                    f"- {'+'.join(args.sets)} T={temperature:g} {name}: {x.mean():.3f} ± "
                    f"{mean_ci(x)[1]:.3f} ({len(x)} prompts)"
                )
    a = names[0]
    for b in names[1:]:  # the first drafter against each of the others
        lines += [
            "",
            f"Paired difference {a} - {b} (same prompts, mean over prompts, 95% CI):",
            "",
        ]
        for set_name in args.sets:
            for temperature in args.temperatures:
                d = per_prompt[(set_name, temperature, a)] - per_prompt[(set_name, temperature, b)]
                half = mean_ci(d)[1]
                lines.append(f"- {set_name} T={temperature:g}: {d.mean():+.3f} ± {half:.3f}")
        if len(args.sets) > 1:  # every prompt of every set weighs the same, as above
            for temperature in args.temperatures:
                d = np.concatenate(
                    [per_prompt[(st, temperature, a)] - per_prompt[(st, temperature, b)]
                     for st in args.sets]
                )  # fmt: skip
                half = mean_ci(d)[1]
                lines.append(
                    f"- {'+'.join(args.sets)} T={temperature:g}: {d.mean():+.3f} ± {half:.3f}"
                )
    lines += resemblance_lines({f"{st}|{t:g}|{n}": taus for (st, t, n), taus in per_prompt.items()})
    lines += [
        "",
        "tau: accepted + 1 per target call (the acceptance length: a row's last call counts "
        "its whole accepted path where max_new_tokens or EOS cut it), per prompt, then "
        "averaged. reused "
        "nodes: draft nodes whose distribution came from a reused hidden state (mdc draft "
        "reuse), as a share of all draft nodes; layer calls / step: the drafter's layer calls per "
        "verification step while drafting (mdc: chain calls, 6 without reuse at depth 6; eagle: "
        "one frontier-wide call per tree level).",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    # Per-prompt taus beside the table, so a later run can pair another drafter against them.
    per_prompt_json = {
        "settings": settings,
        "machine": machine,
        **{f"prompts|{s}": d for s, d in digests.items()},
        **{f"{s}|{t:g}|{n}": [float(x) for x in taus] for (s, t, n), taus in per_prompt.items()},
    }
    for set_name, temperature, name, _, _, stats in with_depths:
        key = f"accepted_hist|{set_name}|{temperature:g}|{name}"
        per_prompt_json[key] = [int(x) for x in stats["accepted_hist"]]
    Path(args.out).with_suffix(".json").write_text(json.dumps(per_prompt_json, indent=1) + "\n")
    plot_depth_acceptance(per_prompt_json, depth_plot_path(Path(args.out)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
