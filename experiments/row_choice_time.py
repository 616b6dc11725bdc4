"""What picking a token costs on the CPU: the row_choice kernel (specjax.token_choice) against
XLA's jnp.argmax and jax.random.categorical, on SmolLM2-sized rows (V = 49152), side by side in
one process (each op jitted alone; median of interleaved repetitions).

    python experiments/row_choice_time.py          # ~1 minute

Writes experiments/results/row_choice_time.md. Whole calls with and without the kernel are in
NOTES.md ("Forty-second session"): the op is a small part of a step, so a call's change is
within a 2-core host's noise at T=0.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 49152
ROWS = (1, 8, 16, 64)  # one decoded token; verification blocks; a batch of 8 rows x 8 nodes


def _median_ms(fns: dict, args: dict, reps: int) -> dict:
    """Median milliseconds per call of each fn, calls interleaved (one of each per round)."""
    for name, fn in fns.items():
        jax.block_until_ready(fn(*args[name]))
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args[name]))
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def main(argv=None) -> int:
    from specjax.kernels import cpu_panels
    from specjax.kernels.cpu_panels.row_choice import row_argmax, row_draw

    from specjax.benchmark import device_header

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "experiments/results/row_choice_time.md"))
    args = ap.parse_args(argv)
    if jax.default_backend() != "cpu" or not cpu_panels.available():
        raise SystemExit("the row_choice kernel runs on the CPU backend where it builds")

    def draw_kernel(key, probs):
        return row_draw(probs, jax.random.bits(key, (*probs.shape[:-1], 2), jnp.uint32))

    fns = {
        "argmax: jnp.argmax": jax.jit(lambda x: jnp.argmax(x, axis=-1)),
        "argmax: kernel": jax.jit(row_argmax),
        "draw: jax.random.categorical": jax.jit(
            lambda k, p: jax.random.categorical(k, jnp.log(p), axis=-1)
        ),
        "draw: kernel": jax.jit(draw_kernel),
    }
    rows_out = []
    for rows in ROWS:
        logits = jax.random.normal(jax.random.key(rows), (rows, VOCAB), jnp.float32)
        probs = jax.nn.softmax(logits, axis=-1)
        key = jax.random.key(0)
        inputs = {name: ((logits,) if name.startswith("argmax") else (key, probs)) for name in fns}
        ms = _median_ms(fns, inputs, args.reps)
        rows_out.append((rows, ms))
        print(rows, {k: round(v, 3) for k, v in ms.items()}, flush=True)

    header = device_header(vocabulary=VOCAB, repetitions=f"{args.reps} interleaved (median)")
    lines = [
        "# Picking a token on the CPU: the row_choice kernel against XLA's ops",
        "",
        header,
        "- command: python experiments/row_choice_time.py",
        "",
        "| rows | jnp.argmax ms | kernel argmax ms | ratio | categorical ms | kernel draw ms "
        "| ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for rows, ms in rows_out:
        a, ak = ms["argmax: jnp.argmax"], ms["argmax: kernel"]
        d, dk = ms["draw: jax.random.categorical"], ms["draw: kernel"]
        lines.append(
            f"| {rows} | {a:.3f} | {ak:.3f} | {a / ak:.1f}x | {d:.3f} | {dk:.3f} | {d / dk:.1f}x |"
        )
    lines += [
        "",
        "rows: logits [rows, V] (argmax) or probabilities (draw; the kernel's time includes making "
        "its 53 random bits a row from the key, categorical's its Gumbel variates). ratio: XLA's "
        "op over the kernel. Every sampled token of specjax on the CPU is one draw (plain decoding "
        "at T > 0, a speculative step's bonus or residual token); greedy verification takes the "
        "argmax of every node's row.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
