"""What the target's layer loop costs on this backend: the library's forward (a `lax.scan` over
layers whose weights are stacked [L, ...] arrays) against the same layers run as an unrolled
Python loop over per-layer weight arrays, for blocks of N tokens at a fixed context.

Why: on XLA:CPU a matmul cannot read a slice of a larger buffer, so each step of the layer scan
first copies that layer's weights out of the stacked arrays (a dynamic-slice fusion per weight:
every weight is read twice and written once per forward). Per-layer arrays need no copy, at the
price of a program that holds every layer (compile time grows with the layer count). This
measures both sides of that trade with canonical [in, out] matrices on both sides; the library
keeps the scan (see NOTES.md).

Each variant runs a jitted loop of forwards (the block's first token is the last block's argmax,
the cache length fixed), timed in interleaved rounds; the logits of one forward are compared
first, so both sides compute the same function.

    python experiments/layer_loop.py                       # SmolLM2, N = 1, 2, 4, 8
    python experiments/layer_loop.py --nodes 1 4 --rounds 3 --out /tmp/layer_loop.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

RESULTS = Path(__file__).resolve().parent / "results"


def per_layer_forward(model, layers, tokens, positions, cache, tree_mask):
    """The library's forward (reference attention), layers unrolled over per-layer arrays.
    tokens / positions [B, T], tree_mask [B, T, T] -> (logits [B, T, V], cache)."""
    from specjax.attention import attend, block_visibility
    from specjax.models.layers import finish_layer, project_qkv, rms_norm, rope_angles
    from specjax.models.target import write_layer_block

    cfg = model.config
    x = model.embed_tokens(tokens)
    cos, sin = rope_angles(positions, cfg.head_dim, cfg.rope_theta)
    visible = block_visibility(cache.lengths, tree_mask, cache.max_len)
    k_all, v_all = cache.k, cache.v
    for i, p in enumerate(layers):
        q, k, v = project_qkv(p, rms_norm(x, p["attn_norm"], cfg.norm_eps), cos, sin, cfg)
        k_all = write_layer_block(k_all, jnp.int32(i), k, cache.lengths)
        v_all = write_layer_block(v_all, jnp.int32(i), v, cache.lengths)
        attn = attend(q, k_all[i], v_all[i], cache.lengths, tree_mask, "reference",
                      visible=visible)  # fmt: skip
        x = finish_layer(p, x, attn, cfg)
    return model.head(x), cache.replace(k=k_all, v=v_all)


def main(argv=None) -> int:
    import specjax
    from specjax.benchmark import device_header
    from specjax.cache import init_cache
    from specjax.paths import SMOLLM2, shared_path
    from specjax.tree import causal_mask

    parser = argparse.ArgumentParser(prog="python experiments/layer_loop.py")
    parser.add_argument("--model", default=SMOLLM2, help="model under the shared folder")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--iters", type=int, default=8, help="forwards per timed call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS / "layer_loop.md"))
    args = parser.parse_args(argv)
    if min(args.nodes) < 1 or args.rounds < 1 or args.iters < 1:
        parser.error("--nodes, --rounds and --iters must be positive")

    loaded = specjax.load(shared_path(args.model))
    model, cfg = loaded.model, loaded.model.config
    model.layers.set_layout(False)  # both sides with canonical [in, out] matrices
    if args.context + max(args.nodes) > cfg.max_seq_len:
        parser.error(f"context + nodes exceeds the model's max_seq_len {cfg.max_seq_len}")
    graphdef, params = nnx.split(model)
    stacked = model.layers.arrays()
    layers = [{n: jnp.array(w[i]) for n, w in stacked.items()} for i in range(cfg.n_layers)]
    cache = init_cache(cfg, 1, args.context + max(args.nodes))
    cache = cache.replace(lengths=jnp.full((1,), args.context, jnp.int32))

    def forward(kind, weights, tokens, positions, cache, mask):
        if kind == "scan":
            out = nnx.merge(graphdef, weights)(
                tokens, positions=positions, cache=cache, tree_mask=mask, attn_impl="reference"
            )
            return out.logits, out.cache
        return per_layer_forward(model, weights, tokens, positions, cache, mask)

    def loop_of(kind, n):
        def one(weights, carry):
            cache, token = carry
            tokens = jnp.ones((1, n), jnp.int32).at[:, 0].set(token)
            positions = cache.lengths[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]
            logits, new = forward(kind, weights, tokens, positions, cache, causal_mask(1, n))
            token = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
            return new.replace(lengths=cache.lengths), token

        @jax.jit
        def loop(weights, cache, token):
            return jax.lax.fori_loop(0, args.iters, lambda i, c: one(weights, c), (cache, token))

        return loop

    weights_of = {"scan": params, "per-layer": layers}
    # Same function: one forward's logits from each side.
    n0 = max(args.nodes)
    tokens = jnp.asarray(np.arange(1, n0 + 1)[None, :] % cfg.vocab_size, jnp.int32)
    positions = cache.lengths[:, None] + jnp.arange(n0, dtype=jnp.int32)[None, :]
    ref, got = (
        jax.jit(lambda w, k=kind: forward(k, w, tokens, positions, cache, causal_mask(1, n0))[0])(
            weights_of[kind]
        )
        for kind in ("scan", "per-layer")
    )
    max_diff = float(jnp.max(jnp.abs(ref - got)))
    scale = float(jnp.max(jnp.abs(ref)))
    print(f"[layer_loop] logits max |diff| {max_diff:.2e} (max |logit| {scale:.1f})", flush=True)

    token = jnp.ones((1,), jnp.int32)
    loops, compile_s = {}, {}
    for n in args.nodes:
        for kind in ("scan", "per-layer"):
            f = loop_of(kind, n)
            t0 = time.perf_counter()
            jax.block_until_ready(f(weights_of[kind], cache, token))
            compile_s[(n, kind)] = time.perf_counter() - t0
            loops[(n, kind)] = f
            print(f"[layer_loop] N={n} {kind}: compiled in {compile_s[(n, kind)]:.1f} s",
                  flush=True)  # fmt: skip
    times = {key: [] for key in loops}
    for r in range(args.rounds):
        for (n, kind), f in loops.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(weights_of[kind], cache, token))
            times[(n, kind)].append((time.perf_counter() - t0) / args.iters)
        print(f"[layer_loop] round {r + 1}/{args.rounds}", flush=True)
    ms = {key: 1e3 * float(np.median(v)) for key, v in times.items()}

    t1 = {kind: ms[(min(args.nodes), kind)] for kind in ("scan", "per-layer")}
    rows = [
        "| N | scan ms (/ t(min N)) | per-layer ms (/ t(min N)) | scan / per-layer | compile s: "
        "scan / per-layer |",
        "|---|---|---|---|---|",
    ]
    for n in args.nodes:
        s, p = ms[(n, "scan")], ms[(n, "per-layer")]
        rows.append(
            f"| {n} | {s:.1f} ({s / t1['scan']:.2f}x) | {p:.1f} ({p / t1['per-layer']:.2f}x) "
            f"| {s / p:.2f}x | {compile_s[(n, 'scan')]:.1f} / {compile_s[(n, 'per-layer')]:.1f} |"
        )
    name = Path(args.model).stem
    text = "\n".join([
        f"# The layer loop: scan over stacked weights against per-layer arrays ({name})",
        "",
        device_header(
            command="python experiments/layer_loop.py " + " ".join(argv or sys.argv[1:]),
            context=args.context, forwards_per_call=args.iters, rounds=args.rounds,
        ),
        "",
        f"Batch 1, {cfg.n_layers} layers, reference attention. ms per forward over N tokens "
        f"(median over the rounds of a jitted loop of {args.iters} forwards, variants "
        "interleaved); compile s: the first call of each loop (compile + one call). Logits of "
        f"one forward of {n0} tokens: max |scan - per-layer| = {max_diff:.2e} (max |logit| "
        f"{scale:.1f}).",
        "",
        *rows,
        "",
    ])  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
