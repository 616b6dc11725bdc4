"""What a forward over a range of the target's layers costs against the whole forward, side by
side in one process: the ranges the layer-range users run (HiSpec's draft exit [0, E_d), its
intermediate verifier [E_d, E_v) and its flush [E_v, L); self-drafting with the first 8 layers;
EarlyExitVerifier's two halves), at a few block sizes N, with the target's weights as the
default call holds them.

Why: every one of those paths is priced and timed by its layers' share of the target. A range
that costs more than its share (e.g. a copy of its slice of the stacked weights on every call)
makes the path lose against plain decoding whatever its acceptance.

    python experiments/layer_range.py                  # SmolLM2, N = 1 and 4
    python experiments/layer_range.py --ranges 0,4 8,30 --nodes 1 --out /tmp/r.md

Writes experiments/results/layer_range.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
# checkpoints/smollm2-hispec: draft exit 4, verify exit 8 of 30; self-draft "self:8" (bench.md)
DEFAULT_RANGES = ("0,30", "0,4", "4,8", "8,30", "0,8")


def parse_range(text: str, n_layers: int) -> tuple[int, int]:
    lo, hi = (int(x) for x in text.split(","))
    if not 0 <= lo < hi <= n_layers:
        raise SystemExit(f"--ranges {text}: need 0 <= lo < hi <= {n_layers}")
    return lo, hi


def main(argv=None) -> int:
    import jax.numpy as jnp
    from flax import nnx

    import specjax
    from specjax import autotune
    from specjax.benchmark import device_header
    from specjax.cache import init_cache
    from specjax.paths import SMOLLM2, shared_path
    from specjax.tree import causal_mask

    parser = argparse.ArgumentParser(prog="python experiments/layer_range.py")
    parser.add_argument("--ranges", nargs="+", default=list(DEFAULT_RANGES), metavar="LO,HI")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default=str(RESULTS / "layer_range.md"))
    args = parser.parse_args(argv)
    if min(args.nodes) < 1 or args.reps < 1:
        parser.error("--nodes and --reps must be positive")

    t_start = time.perf_counter()
    code = Path(specjax.__file__).resolve().parents[1]
    commit = subprocess.run(
        ["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    target = specjax.load(shared_path(SMOLLM2)).model
    cfg = target.config
    ranges = [parse_range(r, cfg.n_layers) for r in args.ranges]
    graphdef, params = nnx.split(target)
    cache = init_cache(cfg, 1, args.context + max(args.nodes))
    cache = cache.replace(lengths=jnp.full((1,), args.context, jnp.int32))

    def body_for(n, lo, hi):
        """Layers [lo, hi) over a block of n tokens at the context, no LM head; the block's
        stream feeds the next iteration (nothing to hoist)."""

        def body(params, carry):
            cache, x = carry
            model = nnx.merge(graphdef, params)
            out = model(
                jnp.ones((1, n), jnp.int32) if lo == 0 else None,
                hidden=None if lo == 0 else x,
                positions=cache.lengths[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :],
                cache=cache,
                tree_mask=causal_mask(1, n),
                layer_range=(lo, hi),
                return_hidden=(hi,),
                compute_logits=False,
            )
            return out.cache.replace(lengths=cache.lengths), 0.5 * (x + out.hidden[hi])

        return body

    loops = {}
    for n in args.nodes:
        for lo, hi in ranges:
            print(f"[layer-range] compiling N={n} layers [{lo}, {hi})", file=sys.stderr)
            init = (cache, jnp.zeros((1, n, cfg.d_model), jnp.float32))
            loops[n, lo, hi] = autotune.sized_loop(body_for(n, lo, hi), params, init, 0.3)
    samples = {key: [] for key in loops}
    for _ in range(args.reps):  # interleaved rounds: a slow spell lands on every range alike
        for key, loop in loops.items():
            samples[key].append(loop.per_iteration())
    ms = {key: 1e3 * float(np.median(v)) for key, v in samples.items()}

    lines = [
        "# A range of the target's layers against the whole forward",
        "",
        device_header(
            model=f"{Path(SMOLLM2).name} (float32, weights in the layout the default call "
            f"uses: out_in={target.layers.out_in})",
            context=f"{args.context} committed positions, batch 1",
            repetitions=f"{args.reps} interleaved rounds, median; no LM head in any row",
            specjax=f"the code at commit {commit or 'unknown'} (the code timed)",
            command="python experiments/layer_range.py " + " ".join(sys.argv[1:]),
            wall_time=f"{(time.perf_counter() - t_start) / 60:.1f} min",
        ),
        "",
        "| N | layers | share of the layers | ms | / whole forward |",
        "|---|---|---|---|---|",
    ]
    for n in args.nodes:
        whole = ms.get((n, 0, cfg.n_layers))
        for lo, hi in ranges:
            ratio = f"{ms[n, lo, hi] / whole:.2f}" if whole else "-"
            share = (hi - lo) / cfg.n_layers
            lines.append(f"| {n} | [{lo}, {hi}) | {share:.2f} | {ms[n, lo, hi]:.1f} | {ratio} |")
    lines += [
        "",
        "share of the layers: (hi - lo) / L, what the range would cost if each layer cost the "
        "same and nothing else did (the embedding lookup is in [0, ...) rows only). / whole "
        "forward: the range's time over layers [0, L) at the same N, both in this process.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
