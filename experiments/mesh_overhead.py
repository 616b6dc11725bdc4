"""Overhead of the device mesh on a CPU host mesh: step time of `generate` and of
`speculative_generate` (a draft model, or the target's first layer; chain of 3) on 1x1 and 2x4
meshes, against one device without a mesh, for a random model sized for the mesh (8 query and 8
kv heads, every split whole).
Writes experiments/results/mesh_overhead.md.

    taskset -c 1 python experiments/mesh_overhead.py            # the recorded run
    python experiments/mesh_overhead.py --meshes 1x1,2x4,1x8 --reps 5

The 8 host devices are XLA's simulated CPU devices (--xla_force_host_platform_device_count=8, set
below before JAX starts): they share the host's cores (one core under taskset -c 1), so a mesh
cannot be faster here; the ratio measures what the sharded program costs in collectives, copies
and per-device dispatch, and the tokens are checked equal to the single-device ones.
Time per step = wall seconds of one call (after a warm-up call that compiles) / target calls,
median over interleaved repetitions.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import specjax  # noqa: E402
from specjax.benchmark import cpu_model  # noqa: E402
from specjax.config import ModelConfig, SpecConfig, TreeConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = ModelConfig(
    vocab_size=2048, d_model=512, n_layers=4, n_heads=8, n_kv_heads=8, head_dim=64,
    ffn_dim=1536, max_seq_len=512,
)  # fmt: skip
DRAFT = ModelConfig(
    vocab_size=2048, d_model=128, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=64,
    ffn_dim=256, max_seq_len=512,
)  # fmt: skip


def build(cfg: ModelConfig, seed: int) -> specjax.Llama:
    model = specjax.Llama(cfg, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x * 3 if x.ndim >= 2 else x, state))


def timed_call(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", default="1x1,2x4")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "mesh_overhead.md"))
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, TARGET.vocab_size, 12 + 3 * i)) for i in range(args.batch)]
    cases = ["none", *args.meshes.split(",")]
    targets = {}
    for case in cases:
        model = build(TARGET, 0)
        if case != "none":
            data, m = (int(x) for x in case.split("x"))
            model = specjax.shard_model(model, specjax.make_mesh(data=data, model=m))
        targets[case] = model
    drafter = specjax.LMDrafter(build(DRAFT, 1))
    spec = SpecConfig(tree=TreeConfig.chain(3))
    kinds = {
        "generate": lambda t: specjax.generate(t, prompts, max_new_tokens=args.max_new_tokens),
        "speculative, draft model": lambda t: specjax.speculative_generate(
            t, drafter, prompts, max_new_tokens=args.max_new_tokens, config=spec
        ),
        # The target's first layer drafts: no replicated drafter weights (separates the
        # drafter's replicated compute from the engine's own overhead).
        "speculative, self-draft": lambda t: specjax.speculative_generate(
            t,
            specjax.LMDrafter.self_draft(1),
            prompts,
            max_new_tokens=args.max_new_tokens,
            config=spec,
        ),
    }
    rows = []
    for kind, fn in kinds.items():
        times = {c: [] for c in cases}
        tokens, calls = {}, {}
        for case in cases:  # warm-up: compile
            out, _ = timed_call(lambda case=case, fn=fn: fn(targets[case]))
            tokens[case] = np.asarray(out.tokens)
            calls[case] = (
                int(np.max(out.stats["target_calls"])) if out.stats else args.max_new_tokens - 1
            )
        for _ in range(args.reps):  # interleaved, so drift in the machine's load hits all
            for case in cases:
                times[case].append(timed_call(lambda case=case, fn=fn: fn(targets[case]))[1])
        base = statistics.median(times["none"]) / calls["none"]
        for case in cases:
            step = statistics.median(times[case]) / calls[case]
            same = bool((tokens[case] == tokens["none"]).all())
            rows.append((kind, case, step * 1e3, step / base, same))
            print(f"{kind:24s} {case:5s} {step * 1e3:8.2f} ms/step  x{step / base:.2f}  {same}")

    lines = [
        "# Device-mesh overhead on a CPU host mesh",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores visible, run under `taskset -c 1` "
        "(one core) as recorded; 8 simulated XLA host devices sharing it. "
        f"jax {jax.__version__}, float32, batch {args.batch}, {args.max_new_tokens} new tokens, "
        "greedy; speculative: a draft model (1 layer, d_model 128, replicated) or self-drafting "
        "with the target's first layer, chain of 3. "
        f"Target: {TARGET.n_layers} layers, d_model {TARGET.d_model}, {TARGET.n_heads} heads "
        f"({TARGET.n_kv_heads} kv), ffn {TARGET.ffn_dim}, vocab {TARGET.vocab_size} (random).",
        "",
        "Command: `taskset -c 1 python experiments/mesh_overhead.py`",
        "",
        "| engine | mesh | ms per target step | vs one device, no mesh | same tokens |",
        "|---|---|---:|---:|---|",
    ]
    for kind, case, ms, ratio, same in rows:
        lines.append(f"| {kind} | {case} | {ms:.2f} | {ratio:.2f}x | {same} |")
    lines += [
        "",
        "Median of interleaved repetitions after a compiling warm-up call. The simulated devices "
        "share one core, so this is the mesh program's overhead (collectives, per-device "
        "dispatch), not a speed-up measurement.",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
