"""What choosing a node count at run time costs around the target's forward, on this machine.

The speculative step picks how many nodes to verify per step (the pre-verifier's buckets, a text
chain verified where drafted) from a few static sizes. This times SmolLM2-135M's forward over 8
nodes at batch 1, repeated in a jitted loop, written three ways: alone; inside `lax.switch`
between an 8- and a 16-node branch; and inside `specjax.branching.switch_in_place` between the
same two (the 8-node branch runs in every variant). At three cache lengths, since XLA:CPU copies
a conditional's operands that a branch updates (the cache is one).

    python experiments/switch_cost.py          # writes experiments/results/switch_cost.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from specjax import io
from specjax.benchmark import device_header
from specjax.branching import switch_in_place
from specjax.cache import init_cache
from specjax.paths import SMOLLM2, shared_path

RESULTS = Path(__file__).resolve().parent / "results"
ITERS = 20
VARIANTS = ("forward alone", "lax.switch", "switch_in_place")


def forward(graph, state, cache, tokens, n):
    """The target's forward over the first n tokens as a causal block at the cache's lengths;
    returns the cache with the block written (lengths unchanged) and a scalar of its logits."""
    model = nnx.merge(graph, state)
    pos = cache.lengths[:, None] + jnp.arange(n)[None]
    mask = jnp.tril(jnp.ones((1, n, n), bool))
    out = model(tokens[:, :n], positions=pos, cache=cache, tree_mask=mask)
    return out.cache.replace(lengths=cache.lengths), jnp.sum(out.logits[:, :, :8])


def timed_loop(graph, variant: str):
    @jax.jit
    def run(state, cache, tokens):
        def body(i, carry):
            cache, acc = carry
            # Always 0, but not a constant the compiler could fold.
            index = (acc > 1e30).astype(jnp.int32) + jnp.minimum(i, 0)
            branches = [lambda c, n=n: forward(graph, state, c, tokens, n) for n in (8, 16)]
            if variant == "forward alone":
                cache, s = branches[0](cache)
            elif variant == "lax.switch":
                cache, s = jax.lax.switch(index, branches, cache)
            else:
                cache, s = switch_in_place(index, branches, cache)
            return cache, acc + s

        return jax.lax.fori_loop(0, ITERS, body, (cache, jnp.float32(0)))

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-lengths", default="256,512,2048")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "switch_cost.md"))
    args = parser.parse_args()
    loaded = io.load(shared_path(SMOLLM2))
    graph, state = nnx.split(loaded.model)
    tokens = jnp.arange(16, dtype=jnp.int32)[None] + 100
    loops = {v: timed_loop(graph, v) for v in VARIANTS}
    rows = []
    for length in (int(x) for x in args.cache_lengths.split(",")):
        cache = init_cache(loaded.config, 1, length)
        cache = cache.replace(lengths=jnp.full((1,), length // 2, jnp.int32))
        for run in loops.values():
            jax.block_until_ready(run(state, cache, tokens))  # compile and warm up
        best = {v: float("inf") for v in VARIANTS}
        for _ in range(args.rounds):  # interleaved: the CPU's speed drifts
            for v, run in loops.items():
                start = time.perf_counter()
                jax.block_until_ready(run(state, cache, tokens))
                best[v] = min(best[v], (time.perf_counter() - start) / ITERS * 1e3)
        rows.append((length, best))
        print(length, {v: round(t, 2) for v, t in best.items()}, flush=True)
    lines = [
        "# The cost of choosing a node count at run time around the target's forward",
        "",
        device_header(),
        "- SmolLM2-135M-Instruct, float32, batch 1, forward over 8 nodes at half the cache; "
        f"best of {args.rounds} interleaved rounds of a {ITERS}-forward jitted loop",
        "- command: python experiments/switch_cost.py "
        f"--cache-lengths {args.cache_lengths} --rounds {args.rounds}",
        "",
        "| cache positions | " + " | ".join(f"{v} (ms)" for v in VARIANTS) + " |",
        "|---|" + "---|" * len(VARIANTS),
    ]
    for length, best in rows:
        lines.append(f"| {length} | " + " | ".join(f"{best[v]:.2f}" for v in VARIANTS) + " |")
    lines += [
        "",
        "lax.switch passes the cache into the chosen branch, which writes the block into it: "
        "XLA:CPU copies the whole cache on every call. switch_in_place runs each branch in a "
        "while loop of zero or one trip, whose carry is updated in place.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
