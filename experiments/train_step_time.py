"""Where a drafter training step's time goes, and what the readouts-at-answer-positions change,
the answer windows and bfloat16 products save: the share of batch positions that are padding,
prompt and answer, and the step time of these variants, timed interleaved on the same batches:

- every: the readouts (LM head over the draft vocabulary) at every position;
- scored: at the scored answer positions only (specjax.train.trainer.scored_positions);
- scored-windows: besides, every unrolled level's queries on each row's answer window only
  (specjax.train.trainer.answer_window; the first level's keys and values still everywhere), as
  training runs now;
- scored-bf16: a bfloat16 LM head (its products in bfloat16 with float32 accumulation:
  specjax.models.drafter.readout);
- scored-bf16-all: every product of the drafter in bfloat16, forward and backward
  (TrainConfig(products="bfloat16"), specjax.models.precision: pays on CPUs with AMX).

For each variant it also gives the loss difference to `scored` on the first batch and the
training metrics after the timed steps (each variant trains its own copy from the same start
on the same batches).

    python experiments/train_step_time.py                     # SmolLM2 eagle, the cached features
    python experiments/train_step_time.py --kind mdc --levels 6 --steps 20
    python experiments/train_step_time.py --variants scored scored-windows

Reads the feature cache experiments/train_drafters.py builds (experiments/cache/distill/...);
writes experiments/results/train_step_time.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "every": "readouts at every position",
    "scored": "readouts at answer positions only (scored_positions)",
    "scored-windows": "and every level's queries on answer windows (answer_window)",
    "scored-bf16": "answer positions, bfloat16 readouts",
    "scored-bf16-all": "answer positions, every product bfloat16 (products='bfloat16')",
}


def main(argv=None) -> int:
    import specjax
    from specjax.benchmark import device_header
    from specjax.models.drafter import DrafterConfig, DrafterNet, target_parts
    from specjax.paths import SMOLLM2, shared_path
    from specjax.train.data import draft_vocabulary, load_dataset
    from specjax.train.trainer import (
        TrainConfig,
        batches,
        feature_scale,
        make_optimizer,
        train_step,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        default=str(ROOT / "experiments/cache/distill/smollm2-synthetic@layers-2-15"),
        help="a feature directory",
    )
    parser.add_argument("--kind", choices=["eagle", "mdc"], default="eagle")
    parser.add_argument("--levels", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12, help="timed steps per variant")
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="what is timed"
    )
    parser.add_argument("--width", type=int, default=256, help="the timed batches' width")
    parser.add_argument("--out", default=str(ROOT / "experiments/results/train_step_time.md"))
    args = parser.parse_args(argv)

    loaded = specjax.load(shared_path(SMOLLM2))
    target = loaded.model
    data = load_dataset(args.data)
    data.fusion_feats = None  # the plain drafter: fusion is measured by the ablation
    vocab = draft_vocabulary(data, 8192, target.config.vocab_size, (loaded.tokenizer.eos_id,))
    cfg = DrafterConfig(
        kind=args.kind,
        target=target.config,
        draft_vocab_size=len(vocab),
        path_tokens=2 if args.kind == "mdc" else 1,
    )
    net = DrafterNet(cfg, vocab, rngs=nnx.Rngs(0), target=target, input_scale=feature_scale(data))
    parts = target_parts(target, net.draft_vocab[...])
    tcfg = TrainConfig(steps=1000, batch=8, levels=args.levels)
    optimizer = make_optimizer(tcfg)
    graphdef, params0, rest = nnx.split(net, nnx.Param, ...)
    scale = jnp.float32(feature_scale(data))
    variants = tuple(dict.fromkeys(["scored", *args.variants]))  # scored: the losses' reference
    # Each variant trains its own copy (train_step donates its params and optimizer state).
    copies = {v: jax.tree.map(jnp.copy, params0) for v in variants}
    opts = {v: optimizer.init(copies[v]) for v in variants}
    parts_of = {v: parts for v in variants}
    if "scored-bf16" in variants:
        parts_of["scored-bf16"] = parts.replace(head_u=parts.head_u.astype(jnp.bfloat16))
    # Every product of the drafter (its layer, fusion and readouts, forward and backward) with
    # bfloat16 operands and float32 accumulation (TrainConfig.products); the teacher's readout
    # stays float32.
    cfg_of = {v: tcfg for v in variants}
    if "scored-bf16-all" in variants:
        cfg_of["scored-bf16-all"] = dataclasses.replace(tcfg, products="bfloat16")

    # Share of positions: the batches training sees (1000 of them).
    stream = batches(data, tcfg.batch, 0)
    pos = real = ans = 0
    for _ in range(1000):
        b = next(stream)
        pos += b["tokens"].size
        real += int(b["lengths"].sum())
        ans += int((b["lengths"] - b["prompt_lens"]).sum())

    # One fixed batch width and answer-window width (the window's commonest at that batch
    # width), so each variant compiles once; the batches are real ones of them.
    stream = batches(data, tcfg.batch, 1, levels=args.levels)
    width = args.width
    candidates = []
    while len(candidates) < max(8 * args.steps, 100):
        b = next(stream)
        if b["tokens"].shape[1] == width:
            candidates.append(b)
    # (a batch without a window: its window would be the batch's width, see trainer.batches)
    window_widths = [b["window"].shape[1] if "window" in b else width for b in candidates]
    common = max(set(window_widths), key=window_widths.count)
    chosen = [b for b, w in zip(candidates, window_widths, strict=True) if w == common]
    chosen = chosen[: args.steps]

    def run(batch, variant: str):
        if variant != "scored-windows":
            batch = {k: v for k, v in batch.items() if k != "window"}
        if variant == "every":
            batch = {k: v for k, v in batch.items() if not k.startswith("scored")}
        t0 = time.perf_counter()
        copies[variant], opts[variant], m = train_step(
            graphdef, copies[variant], rest, opts[variant], parts_of[variant], batch, scale,
            jax.random.key(0), optimizer=optimizer, cfg=cfg_of[variant],
        )  # fmt: skip
        jax.block_until_ready(m)
        return time.perf_counter() - t0, {k: float(x) for k, x in m.items()}

    # The first step of each variant compiles; its loss is the same batch from the same start.
    first = {v: run(chosen[0], v)[1] for v in variants}
    times, last = {v: [] for v in variants}, {}
    for batch in chosen:
        for v in variants:
            seconds, last[v] = run(batch, v)
            times[v].append(seconds)
    med = {v: float(np.median(times[v])) for v in variants}
    base = variants[0] if "every" not in variants else "every"
    share = window_widths.count(common) / len(window_widths)

    def gap(variant: str) -> float:
        return abs(first[variant]["loss"] - first["scored"]["loss"]) / first["scored"]["loss"]

    lines = [
        "# Drafter training step: where the positions go, and what each change saves",
        "",
        f"- command: `python experiments/train_step_time.py {' '.join(argv or sys.argv[1:])}`",
        device_header(),
        f"- data: {args.data.split('/')[-1]} ({len(data.lengths)} sequences); drafter: "
        f"{args.kind}, draft vocabulary {len(vocab)}, {args.levels} unrolled levels, batch 8",
        "",
        "Positions of 1000 training batches (sequences of similar length batched together, "
        "trimmed to the longest rounded up to 64):",
        "",
        "| padding | prompt | answer (where the loss is taken) |",
        "|---|---|---|",
        f"| {1 - real / pos:.1%} | {(real - ans) / pos:.1%} | {ans / pos:.1%} |",
        "",
        f"Step time, batches of width {width} with answer windows of {common} (the commonest "
        f"at that width: {share:.0%} of its batches), median of {len(chosen)} interleaved "
        f"steps, relative to {base}:",
        "",
        "| variant | ms / step | relative |",
        "|---|---|---|",
        *(f"| {VARIANTS[v]} | {med[v] * 1e3:.0f} | {med[v] / med[base]:.2f} |" for v in variants),
        "",
        *(
            f"{VARIANTS[v]}: first-step loss {first[v]['loss']:.4f} against "
            f"{first['scored']['loss']:.4f} (relative difference {gap(v):.1e}); after "
            f"{len(chosen) + 1} steps each: loss {last[v]['loss']:.4f} against "
            f"{last['scored']['loss']:.4f}, level-0 agreement {last[v]['acc0']:.3f} "
            f"against {last['scored']['acc0']:.3f}.\n"
            for v in variants
            if v != "scored"
        ),
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
