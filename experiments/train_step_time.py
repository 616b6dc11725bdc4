"""Where a drafter training step's time goes, and what the readouts-at-answer-positions change
and bfloat16 products save: the share of batch positions that are padding, prompt and answer, and
the step time with the readouts (LM head over the draft vocabulary) at every position, at the
scored answer positions only (specjax.train.trainer.scored_positions), at those positions with a
bfloat16 LM head (its products in bfloat16 with float32 accumulation:
specjax.models.drafter.readout), and with every product of the drafter in bfloat16, forward and
backward (TrainConfig(products="bfloat16"), specjax.models.precision: pays on CPUs with AMX),
timed interleaved on the same batches. For the bfloat16 variants it also gives the loss
difference on the first batch and the training metrics after the timed steps of each variant
(each variant trains its own copy from the same start on the same batches).

    python experiments/train_step_time.py                     # SmolLM2 eagle, the cached features
    python experiments/train_step_time.py --kind mdc --levels 6 --steps 20

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
    variants = ("every", "scored", "scored-bf16", "scored-bf16-all")
    # Each variant trains its own copy (train_step donates its params and optimizer state).
    copies = {v: jax.tree.map(jnp.copy, params0) for v in variants}
    opts = {v: optimizer.init(copies[v]) for v in variants}
    parts_of = {v: parts for v in variants}
    parts_of["scored-bf16"] = parts.replace(head_u=parts.head_u.astype(jnp.bfloat16))
    # Every product of the drafter (its layer, fusion and readouts, forward and backward) with
    # bfloat16 operands and float32 accumulation (TrainConfig.products); the teacher's readout
    # stays float32.
    cfg_of = {v: tcfg for v in variants}
    cfg_of["scored-bf16-all"] = dataclasses.replace(tcfg, products="bfloat16")

    # Share of positions: the batches training sees (1000 of them).
    stream = batches(data, tcfg.batch, 0)
    pos = real = ans = 0
    for _ in range(1000):
        b = next(stream)
        pos += b["tokens"].size
        real += int(b["lengths"].sum())
        ans += int((b["lengths"] - b["prompt_lens"]).sum())

    # One fixed batch width, so each variant compiles once; the batches are real ones of it.
    stream = batches(data, tcfg.batch, 1)
    width = 256
    chosen = []
    while len(chosen) < args.steps:
        b = next(stream)
        if b["tokens"].shape[1] == width:
            chosen.append(b)

    def run(batch, variant: str):
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
    every, picked, bf16 = med["every"], med["scored"], med["scored-bf16"]
    bf16_all = med["scored-bf16-all"]

    def gap(variant: str) -> float:
        return abs(first[variant]["loss"] - first["scored"]["loss"]) / first["scored"]["loss"]

    lines = [
        "# Drafter training step: where the positions go, and readouts at answer positions",
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
        f"Step time, batches of width {width}, median of {args.steps} interleaved steps:",
        "",
        "| readouts at | ms / step | relative |",
        "|---|---|---|",
        f"| every position | {every * 1e3:.0f} | 1.00 |",
        f"| answer positions only (scored_positions) | {picked * 1e3:.0f} | {picked / every:.2f} |",
        f"| answer positions, bfloat16 readouts | {bf16 * 1e3:.0f} | {bf16 / every:.2f} |",
        f"| answer positions, every product bfloat16 (products='bfloat16') | "
        f"{bf16_all * 1e3:.0f} | {bf16_all / every:.2f} |",
        "",
        *(
            f"{label}: first-step loss {first[v]['loss']:.4f} against "
            f"{first['scored']['loss']:.4f} in float32 (relative difference {gap(v):.1e}); after "
            f"{args.steps + 1} steps each: loss {last[v]['loss']:.4f} against "
            f"{last['scored']['loss']:.4f}, level-0 agreement {last[v]['acc0']:.3f} "
            f"against {last['scored']['acc0']:.3f}.\n"
            for label, v in (
                ("bfloat16 readouts", "scored-bf16"),
                ("Every product bfloat16", "scored-bf16-all"),
            )
        ),
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
