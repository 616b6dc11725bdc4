"""The weight layout on this backend, side by side in one process: canonical [in, out] matrices
(x @ W) against out_in [out, in] (the weight leads the product: specjax.models.layers.dense),
and out_in with its products of 2-32 rows written as dots instead of sums, or as sums over
unpadded rows (specjax.models.layers.weight_leading_product), and the target's matrices and LM
head packed for the CPU panel kernel (specjax.kernels.cpu_panels; the drafter keeps out_in),
for the target's cost over N tree nodes t(N), plain decoding, and speculative decoding with a
fixed tree, on the same prompts. The drafter (its layer, its own matrices and its readout
head) takes the same out_in layout as the target in each row, as binding it to a target does.

Why: on XLA:CPU a product of a few rows by a weight on the right runs a matrix-matrix routine
whose cost grows quickly with the rows; with the weight leading it grows less, and written as a
multiply-and-sum less again. The cost of verifying N nodes, relative to one, is what decides
whether speculation pays.

    python experiments/weight_layout.py                 # SmolLM2 + eagle, 8 MT-bench turns
    python experiments/weight_layout.py --n-prompts 2 --max-new-tokens 16 --reps 1 --out /tmp/w.md
    python experiments/weight_layout.py --layouts "out_in, unpadded sums" out_in --tree 5,3,4 \
        --nodes 1 4 5 6 8 12 16 28 31 32 --out experiments/results/weight_layout_padded_rows.md

Writes experiments/results/weight_layout.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
# name -> (out_in, few-row products as sums, their rows padded to a multiple of 8 above 4,
# the target's matrices and LM head packed for the CPU panel kernel)
LAYOUTS = {
    "canonical": (False, False, False, False),
    "out_in, dots": (True, False, False, False),
    "out_in, unpadded sums": (True, True, False, False),
    "out_in": (True, True, True, False),
    "panels": (True, True, True, True),
}
DEFAULT_LAYOUTS = ("canonical", "out_in", "panels")


def main(argv=None) -> int:
    import specjax
    from specjax import autotune
    from specjax.benchmark import device_header
    from specjax.compile_cache import enable_compilation_cache
    from specjax.config import SpecConfig, TreeConfig
    from specjax.datasets import encode_question, read_spec_bench, select_questions
    from specjax.models.layers import set_few_row_sums, set_row_padding
    from specjax.paths import SMOLLM2, SMOLLM2_EAGLE, repo_dir, shared_path

    parser = argparse.ArgumentParser(prog="python experiments/weight_layout.py")
    parser.add_argument("--drafter", default=SMOLLM2_EAGLE)
    parser.add_argument("--tree", default="7,3,4", help="dynamic tree budget,depth,top-k")
    parser.add_argument("--n-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--out", default=str(RESULTS / "weight_layout.md"))
    parser.add_argument(
        "--layouts", nargs="+", choices=list(LAYOUTS), default=list(DEFAULT_LAYOUTS),
        help="the layouts compared; the first one's plain decoding is every row's reference",
    )  # fmt: skip
    args = parser.parse_args(argv)
    layouts = list(dict.fromkeys(args.layouts))
    budget, depth, topk = (int(x) for x in args.tree.split(","))
    tree = TreeConfig.dynamic(budget, depth, topk)
    if min(args.n_prompts, args.max_new_tokens, args.reps) < 1:
        parser.error("--n-prompts, --max-new-tokens and --reps must be positive")

    enable_compilation_cache()  # each switch of layout recompiles; read back from the 2nd round
    loaded = specjax.load(shared_path(SMOLLM2))
    target = loaded.model
    drafter = specjax.load_drafter(repo_dir() / args.drafter, target, pre_verifier=False)
    questions = select_questions(read_spec_bench("mt_bench_question.jsonl"), args.n_prompts)
    prompts = [encode_question(loaded.tokenizer, q.turns[0]) for q in questions]
    kw = dict(max_new_tokens=args.max_new_tokens, eos_id=loaded.tokenizer.eos_id)
    config = SpecConfig(tree=tree)

    def set_layout(name):
        """Switch the layout; jit caches are cleared because the few-row setting is read at
        trace time (the persistent compilation cache makes the recompiles cheap)."""
        out_in, sums, pad, panels = LAYOUTS[name]
        target.layers.set_layout(out_in, panels)
        target.pack_head()
        drafter.set_layout(out_in)
        set_few_row_sums(sums)
        set_row_padding(pad)
        jax.clear_caches()

    def run(method):
        tokens, outs = 0, []
        for p in prompts:
            if method == "plain":
                out = specjax.generate(target, [p], **kw)
            else:
                out = specjax.speculative_generate(target, drafter, [p], config=config, **kw)
            jax.block_until_ready(out.tokens)
            tokens += int(np.asarray(out.lengths).sum())
            outs.append(out)
        return tokens, outs

    # t(N) in interleaved rounds: each layout's grid once per round.
    grids = {name: [] for name in layouts}
    for r in range(args.reps):
        for name in layouts:
            set_layout(name)
            costs = autotune.measure_verify_costs(
                target, context=args.context, nodes=args.nodes, reps=3, with_ar=False
            )
            grids[name].append(costs.seconds)
        print(f"[weight_layout] t(N) round {r + 1}/{args.reps}", flush=True)
    t_ms = {name: 1e3 * np.median(np.array(v), axis=0) for name, v in grids.items()}

    # Decoding: warm up (compile) every (layout, method), then interleaved timed repetitions.
    methods = ("plain", "speculative")
    seconds = {(n, m): [] for n in layouts for m in methods}
    outputs, taus = {}, {}
    for name in layouts:
        set_layout(name)
        for m in methods:
            _, outs = run(m)
            outputs[(name, m)] = [np.asarray(o.tokens) for o in outs]
            if m == "speculative":
                taus[name] = float(np.mean([np.mean(np.asarray(o.stats["tau"])) for o in outs]))
    for r in range(args.reps):
        for name in layouts:
            set_layout(name)
            for m in methods:
                run(m)  # untimed: the switch cleared the compiled functions
                t0 = time.perf_counter()
                n_tokens, _ = run(m)
                seconds[(name, m)].append(time.perf_counter() - t0)
        print(f"[weight_layout] decoding round {r + 1}/{args.reps}", flush=True)
    tps = {k: n_tokens / float(np.median(v)) for k, v in seconds.items()}
    base = outputs[(layouts[0], "plain")]
    equal = {
        k: sum(np.array_equal(a, b) for a, b in zip(v, base, strict=True))
        for k, v in outputs.items()
    }

    def grid_row(name):
        t = t_ms[name]
        cells = " | ".join(f"{x:.1f} ({x / t[0]:.2f}x)" for x in t)
        return f"| {name} | {cells} |"

    ref_plain = tps[(layouts[0], "plain")]
    rows = []
    for name in layouts:
        for m in methods:
            speed = tps[(name, m)]
            tau = taus[name] if m == "speculative" else 1.0
            rows.append(
                f"| {name} | {m} | {speed:.1f} | {speed / ref_plain:.2f}x | "
                f"{speed / tps[(name, 'plain')]:.2f}x | {tau:.2f} | "
                f"{equal[(name, m)]}/{len(prompts)} |"
            )
    command = "python experiments/weight_layout.py " + " ".join(argv or sys.argv[1:])
    text = "\n".join([
        "# The weight layout (target and drafter): canonical [in, out] against out_in [out, in], "
        "its few-row products as dots or as sums, and packed panels for the CPU kernel",
        "",
        device_header(command=command.strip(), drafter=args.drafter, tree=str(tree),
                      prompts=f"{args.n_prompts} MT-bench first turns x {args.max_new_tokens} "
                      "new tokens, greedy", reps=args.reps),  # fmt: skip
        "",
        f"## Target cost over N nodes, t(N) (ms, and / t(1); context {args.context}, batch 1)",
        "",
        "| layout | " + " | ".join(f"N={n}" for n in args.nodes) + " |",
        "|---|" + "---|" * len(args.nodes),
        *(grid_row(name) for name in layouts),
        "",
        "## Decoding (tokens/s: generated tokens over the median wall time of the prompt set)",
        "",
        f"| layout | method | tokens/s | vs {layouts[0]} plain | vs plain, same layout | tau | "
        f"greedy = {layouts[0]} plain |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Timed in one process: every (layout, method) compiled first, then the repetitions "
        "interleaved (each switch of layout clears the compiled functions and runs every method "
        "once untimed). out_in, dots: the out_in layout with its products of 2-32 rows "
        "written as dots (the layout before few-row sums); out_in, unpadded sums: its sums over "
        "the rows as they are (before padding above 4 rows to a multiple of 8); panels: the "
        "target's matrices and LM head packed for the CPU panel kernel, its products at every "
        "row count (the drafter as in out_in). On CPU, read "
        "the ratios, not the absolute speed.",
        "",
    ])  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
