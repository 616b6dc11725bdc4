"""Speculative engine benchmark: tau and wall-clock speedup over autoregressive decoding.

stories260K drafted by llama2xs-279K (chains of 2/4/6, a 16-node tree) and SmolLM2-135M-Instruct
self-drafting with its first layers, greedy and temperature 1, every method timed side by side
with `specjax.generate` in this process (interleaved repetitions, median). Writes
experiments/results/engine.md and engine.png.

    python experiments/bench_engine.py            # full run (about 15 minutes on 2 CPU cores)
    python experiments/bench_engine.py --quick    # a smoke run with few prompts
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
from pathlib import Path

import jax
import numpy as np

import specjax
from specjax.benchmark import device_header, mean_ci, time_interleaved
from specjax.config import SamplingConfig, SpecConfig, TreeConfig
from specjax.datasets import jsonl_prompts, tinystories_prompts
from specjax.paths import LLAMA2XS, SMOLLM2, STORIES260K, shared_path

RESULTS = Path(__file__).resolve().parent / "results"


def run_all(model, prompts, *, max_new, sampling, drafter=None, config=None, eos=None):
    """Decode every prompt (batch 1, one call each); returns the list of outputs."""
    outs = []
    for i, p in enumerate(prompts):
        kw = dict(max_new_tokens=max_new, sampling=sampling, key=jax.random.key(i), eos_id=eos)
        if drafter is None:
            outs.append(specjax.generate(model, [p], **kw))
        else:
            outs.append(specjax.speculative_generate(model, drafter, [p], config=config, **kw))
    return outs


def bench_target(name, loaded, prompts, methods, *, max_new, temperatures, reps, eos):
    rows = []
    for temp in temperatures:
        sampling = SamplingConfig(temperature=temp)
        run = functools.partial(
            run_all, loaded.model, prompts, max_new=max_new, sampling=sampling, eos=eos
        )
        calls = {"autoregressive": run}
        for label, (drafter, cfg) in methods.items():
            calls[label] = functools.partial(run, drafter=drafter, config=cfg)
        timings = time_interleaved(calls, reps=reps)
        ref = run_all(loaded.model, prompts, max_new=max_new, sampling=sampling, eos=eos)
        base = timings["autoregressive"]
        n_tokens = sum(int(o.lengths[0]) for o in ref)
        rows.append(
            (
                name,
                temp,
                "autoregressive",
                "-",
                1.0,
                float("nan"),
                1.0,
                (1.0, 1.0),
                base.compile_s,
                float("nan"),
                n_tokens,
            )
        )
        for label, (drafter, cfg) in methods.items():
            outs = run_all(
                loaded.model,
                prompts,
                max_new=max_new,
                sampling=sampling,
                drafter=drafter,
                config=cfg,
                eos=eos,
            )
            taus = [float(o.stats["tau"][0]) for o in outs]
            tau, ci = mean_ci(taus)
            t = timings[label]
            # Throughput over autoregressive decoding, paired per interleaved repetition (sampled
            # rows stop at other lengths than plain decoding's: tokens count, not just time).
            n_method = sum(int(o.lengths[0]) for o in outs)
            ratios = [
                (n_method / tm) / (n_tokens / tb)
                for tb, tm in zip(base.runs_s, t.runs_s, strict=True)
            ]
            speedup, spread = float(np.median(ratios)), (min(ratios), max(ratios))
            same = np.mean(
                [bool((o.tokens == r.tokens).all()) for o, r in zip(outs, ref, strict=True)]
            )
            rows.append(
                (
                    name,
                    temp,
                    label,
                    cfg.tree.num_nodes - 1,
                    tau,
                    ci,
                    speedup,
                    spread,
                    t.compile_s,
                    same if temp == 0 else float("nan"),
                    n_tokens,
                )
            )
            print(
                f"{name} T={temp} {label}: tau {tau:.2f}±{ci:.2f} speedup {speedup:.2f}x",
                flush=True,
            )
    return rows


def write_results(rows, header, path_md, path_png):
    lines = [
        "# Speculative engine: tau and speedup over autoregressive decoding",
        "",
        header,
        "",
        "| target | T | method | draft nodes | tau (95% CI) | speedup (min-max) | compile s "
        "| greedy = AR |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, temp, label, nodes, tau, ci, sp, spread, comp, same, _ in rows:
        tau_s = "1.00" if label == "autoregressive" else f"{tau:.2f} ± {ci:.2f}"
        same_s = "" if np.isnan(same) else f"{100 * same:.0f}%"
        lines.append(
            f"| {name} | {temp:g} | {label} | {nodes} | {tau_s} | {sp:.2f}x "
            f"({spread[0]:.2f}-{spread[1]:.2f}) | {comp:.1f} | {same_s} |"
        )
    lines += [
        "",
        "tau: the acceptance length (accepted + 1 per target call), mean over prompts. "
        "speedup: tokens per second over autoregressive decoding's, paired per interleaved "
        "repetition in the same process, median (min-max) (CPU ratios, not absolute speed). "
        "greedy = AR: fraction of "
        "prompts whose greedy speculative output equals `specjax.generate` token for token.",
    ]
    path_md.write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    sd = [r for r in rows if r[2] != "autoregressive"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{r[0]}\n{r[2]}\nT={r[1]:g}" for r in sd]
    axes[0].bar(range(len(sd)), [r[4] for r in sd], yerr=[r[5] for r in sd], color="tab:blue")
    axes[0].set_ylabel("tau (tokens per target call)")
    axes[1].bar(range(len(sd)), [r[6] for r in sd], color="tab:green")
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].set_ylabel("speedup over autoregressive (CPU)")
    for ax in axes:
        ax.set_xticks(range(len(sd)), labels, fontsize=6, rotation=90)
    fig.tight_layout()
    fig.savefig(path_png, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--self-draft-layers", type=int, default=8)
    args = parser.parse_args()
    n_stories, n_mt = (4, 2) if args.quick else (20, 10)
    stories_new, smol_new = (32, 16) if args.quick else (128, 64)

    stories = specjax.load(shared_path(STORIES260K))
    draft = specjax.LMDrafter(specjax.load(shared_path(LLAMA2XS)).model)
    tree16 = TreeConfig(branching=(4, 1, 1, 1))
    methods = {
        f"llama2xs chain {k}": (draft, SpecConfig(tree=TreeConfig.chain(k))) for k in (2, 4, 6)
    }
    methods["llama2xs tree (4,1,1,1)"] = (draft, SpecConfig(tree=tree16))
    rows = bench_target(
        "stories260K",
        stories,
        tinystories_prompts(stories.tokenizer, n_stories),
        methods,
        max_new=stories_new,
        temperatures=(0.0, 1.0),
        reps=args.reps,
        eos=None,
    )

    smol = specjax.load(shared_path(SMOLLM2))
    k = args.self_draft_layers
    self_draft = specjax.LMDrafter.self_draft(k)
    methods = {
        f"self-draft {k}/30 chain 3": (self_draft, SpecConfig(tree=TreeConfig.chain(3))),
        f"self-draft {k}/30 tree (3,1)": (
            self_draft,
            SpecConfig(tree=TreeConfig(branching=(3, 1))),
        ),
    }
    prompts = jsonl_prompts("mt_bench_question.jsonl", smol.tokenizer, n_mt)
    rows += bench_target(
        "SmolLM2-135M",
        smol,
        prompts,
        methods,
        max_new=smol_new,
        temperatures=(0.0, 1.0),
        reps=args.reps,
        eos=smol.tokenizer.eos_id,
    )

    header = device_header(
        dtype="float32",
        batch="1 (prompts decoded one after another)",
        prompts=f"{n_stories} TinyStories dev prefixes (stories260K, {stories_new} new tokens); "
        f"{n_mt} MT-bench first turns with the chat template (SmolLM2, {smol_new} new "
        "tokens, stops at EOS)",
        repetitions=f"{args.reps} interleaved",
        command=shlex.join(["python", "experiments/bench_engine.py", *sys.argv[1:]]),
    )
    RESULTS.mkdir(exist_ok=True)
    suffix = "_quick" if args.quick else ""
    write_results(rows, header, RESULTS / f"engine{suffix}.md", RESULTS / f"engine{suffix}.png")
    print((RESULTS / f"engine{suffix}.md").read_text())


if __name__ == "__main__":
    main()
