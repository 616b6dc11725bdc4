"""Does an exit head that attends over earlier positions agree with the last layer more often than
the position-wise heads HiSpec ships (specjax.models.exit_head)? SmolLM2-135M, exits at layers 4
and 8, three head shapes trained on the same sequences, steps and positions:

- "mlp":       the shipped kind (x + SwiGLU(rms x), reads its own position only);
- "attention": Kangaroo's adapter (x + attention(rms x) over the positions so far, the target's
               head layout and RoPE; query/key/value start from the target's layer E, the output
               projection at zero, so training starts from the untrained exit);
- "layer":     a whole decoder layer (attention + SwiGLU) starting as a copy of the target's
               layer E, so training starts from the stream entering layer E + 1.

Each reads the residual stream entering layer E and feeds the target's final norm and LM head over
the exit vocabulary; loss = cross-entropy to the target's distribution over that vocabulary at the
answer positions. Agreement = the share of answer positions where the exit's argmax is the target's
(full-vocabulary) argmax, on held-in answers and on the target's greedy answers to MT-bench first
turns (evaluation only). Writes experiments/results/exit_adapter_smollm2.md.

    python experiments/exit_adapter.py                  # ~1 h on one core
    python experiments/exit_adapter.py --steps 100 --train-seqs 40   # a quick look
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_exit_heads import ANSWER_SETS, answer_rows, mt_bench_rows, spread  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KINDS = ("mlp", "attention", "layer")
MAX_LEN = 320  # tokens kept per sequence (prompt + answer), so widths stay within 5 programs
WIDTH_MULTIPLE = 64


def collect_sequences(target, rows, starts, layers, batch=8):
    """Per sequence: {layer: [T, M] float16 stream entering it, and the last layer's output
    (the teacher) under L}, the target's next token [T] (argmax of the last layer) and the
    counted range [start, T)."""
    from specjax.train.exit_heads import teacher_forced

    last = target.config.n_layers
    stream, params = teacher_forced(target, (*layers, last), dtype=jnp.float32)

    def forward(params, ids):
        # The target's next token from the float32 last-layer stream, before storing float16
        # (the head runs outside the jitted pass: inside, the weights would be constants).
        hidden = stream(params, ids)
        nxt = jnp.argmax(target.head(hidden[last]), axis=-1).astype(jnp.int32)
        return {i: h.astype(jnp.float16) for i, h in hidden.items()}, nxt

    seqs = []
    rows = [r[:MAX_LEN] for r in rows]
    for i in range(0, len(rows), batch):
        chunk = list(range(i, min(i + batch, len(rows))))
        width = -(-max(len(rows[j]) for j in chunk) // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
        ids = np.zeros((batch, width), np.int32)
        for r, j in enumerate(chunk):
            ids[r, : len(rows[j])] = rows[j]
        hidden, nxt = forward(params, jnp.asarray(ids))
        hidden = {k: np.asarray(v) for k, v in hidden.items()}
        nxt = np.asarray(nxt)
        for r, j in enumerate(chunk):
            n = len(rows[j])
            if starts[j] < n - 1:
                seqs.append(dict(hidden={k: v[r, :n] for k, v in hidden.items()},
                                 next=nxt[r, :n], start=starts[j]))  # fmt: skip
    return seqs


def init_head(kind, target, layer, rng):
    cfg = target.config
    w = {k: np.asarray(v[layer], np.float32) for k, v in target.layers.arrays().items()}
    m = cfg.d_model
    if kind == "mlp":
        init = jax.nn.initializers.normal(m**-0.5)
        k1, k2 = jax.random.split(rng)
        return {"norm": jnp.ones((m,)), "w_gate": init(k1, (m, m)), "w_up": init(k2, (m, m)),
                "w_down": jnp.zeros((m, m))}  # fmt: skip
    p = {k: jnp.asarray(w[k]) for k in ("attn_norm", "wq", "wk", "wv", "wo")}
    p.update({k: jnp.asarray(w[k]) for k in ("bq", "bk", "bv") if k in w})
    if kind == "attention":
        p["wo"] = jnp.zeros_like(p["wo"])
    else:
        p.update({k: jnp.asarray(w[k]) for k in ("mlp_norm", "w_gate", "w_up", "w_down")})
    return p


def head_stream(kind, p, x, cfg):
    """[B, T, M] stream entering the exit layer -> [B, T, M] the head's stand-in for the last
    layer's output (causal over the block)."""
    from specjax.attention import reference_attention
    from specjax.models.layers import finish_layer, project_qkv, rms_norm, rope_angles, swiglu
    from specjax.tree import causal_mask

    if kind == "mlp":
        n = rms_norm(x, p["norm"], cfg.norm_eps)
        return x + swiglu(p, n)
    b, t, _ = x.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    cos, sin = rope_angles(positions, cfg.head_dim, cfg.rope_theta)
    q, k, v = project_qkv(p, rms_norm(x, p["attn_norm"], cfg.norm_eps), cos, sin, cfg)
    attn = reference_attention(q, k, v, jnp.zeros((b,), jnp.int32), causal_mask(b, t))
    if kind == "attention":
        return x + attn.reshape(b, t, -1) @ p["wo"]
    return finish_layer(p, x, attn, cfg)


def train_step(readout, exit_logits, kind, opt, p, state, x, teacher, mask):
    """One AdamW step of the cross-entropy to the teacher's distribution at masked positions."""
    p_teacher = jax.nn.softmax(readout(teacher), axis=-1)

    def loss_fn(p):
        logq = jax.nn.log_softmax(exit_logits(kind, p, x), axis=-1)
        ce = -jnp.sum(p_teacher * logq, axis=-1)
        return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1)

    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, state = opt.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss


def choose(exit_logits, kind, vocab, p, x):
    """The exit's argmax as target ids [B, T]."""
    return vocab[jnp.argmax(exit_logits(kind, p, x), axis=-1)]


def make_batch(seqs, idx, layer, teacher_layer):
    width = max(len(seqs[i]["next"]) for i in idx)
    width = -(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
    m = seqs[idx[0]]["hidden"][layer].shape[-1]
    x = np.zeros((len(idx), width, m), np.float32)
    teacher = np.zeros((len(idx), width, m), np.float32)
    nxt = np.zeros((len(idx), width), np.int32)
    mask = np.zeros((len(idx), width), bool)
    for r, i in enumerate(idx):
        s = seqs[i]
        n = len(s["next"])
        x[r, :n] = s["hidden"][layer]
        teacher[r, :n] = s["hidden"][teacher_layer]
        nxt[r, :n] = s["next"]
        mask[r, s["start"] : n] = True
    return jnp.asarray(x), jnp.asarray(teacher), jnp.asarray(nxt), jnp.asarray(mask)


def write_report(args, argv, sets, results) -> None:
    """The results file, rewritten after every head (a stopped run keeps what it measured)."""
    from specjax.benchmark import device_header

    positions = {n: int(sum(len(s["next"]) - s["start"] for s in v)) for n, v in sets.items()}
    lines = [
        "# Exit heads that attend: agreement with the last layer, SmolLM2-135M",
        "",
        device_header(),
        f"- command: `python experiments/exit_adapter.py {' '.join(argv or sys.argv[1:])}`",
        f"- data: {len(sets['train'])} answer sequences of {', '.join(ANSWER_SETS)} for "
        f"training ({positions['train']} answer positions; smollm2-chat left out), "
        f"{len(sets['held-in'])} held-in sequences from the last shards "
        f"({positions['held-in']} positions), the target's greedy answers to 16 MT-bench "
        f"first turns ({positions['MT-bench']} positions; evaluation only); sequences cut at "
        f"{MAX_LEN} tokens",
        f"- training: {args.steps} steps x {args.rows} sequences, AdamW lr {args.lr} "
        f"(warmup 50, cosine), loss at answer positions only; exit vocabulary {args.vocab} ids",
        "",
        "| layer | kind | held-in agreement | MT-bench agreement | final loss | train s |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['layer']} | {r['kind']} | {r['held-in']:.3f} | {r['MT-bench']:.3f} "
                     f"| {r['loss']:.3f} | {r['train_s']:.0f} |")  # fmt: skip
    Path(args.out).write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    import specjax
    from specjax.models.layers import rms_norm
    from specjax.paths import SMOLLM2, shared_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--rows", type=int, default=4, help="sequences per training step")
    parser.add_argument("--train-seqs", type=int, default=300)
    parser.add_argument("--eval-seqs", type=int, default=60)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default=str(REPO / "experiments/results/exit_adapter_smollm2.md"))
    args = parser.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    loaded = specjax.load(shared_path(SMOLLM2))
    target, cfg = loaded.model, loaded.model.config
    train_all, eval_all = answer_rows(ANSWER_SETS, eval_shards=2)
    train = spread(train_all, args.train_seqs, 0)
    held = spread(eval_all, args.eval_seqs, 1)
    log("generating MT-bench answers (evaluation only)")
    outside = mt_bench_rows(loaded, 16)
    t0 = time.perf_counter()
    named = (("train", train), ("held-in", held), ("MT-bench", outside))
    sets = {name: collect_sequences(target, *rs, args.layers) for name, rs in named}
    log(f"collected features in {time.perf_counter() - t0:.0f}s")

    def counted(seqs):
        return np.concatenate([s["next"][s["start"] : len(s["next"])] for s in seqs])

    counts = np.bincount(counted(sets["train"]), minlength=cfg.vocab_size)
    vocab = np.sort(np.argsort(-counts, kind="stable")[: args.vocab]).astype(np.int32)
    w_head = target.embed[...].T if cfg.tie_embeddings else target.lm_head[...]
    head_u = jnp.take(w_head, jnp.asarray(vocab), axis=1).astype(jnp.float32)
    final_norm = target.final_norm[...].astype(jnp.float32)

    def readout(h):
        return rms_norm(h, final_norm, cfg.norm_eps) @ head_u

    def exit_logits(kind, p, x):
        return readout(head_stream(kind, p, x, cfg))

    last = cfg.n_layers
    results = []
    for layer in args.layers:
        for kind in args.kinds:
            p = init_head(kind, target, layer, jax.random.key(0))
            warmup = min(50, args.steps // 4)
            schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, args.steps)
            opt = optax.adamw(schedule, weight_decay=0.0)
            state = opt.init(p)

            step = jax.jit(functools.partial(train_step, readout, exit_logits, kind, opt))

            rng = np.random.default_rng(0)
            t0 = time.perf_counter()
            losses = []
            for s in range(args.steps):
                idx = rng.choice(len(sets["train"]), args.rows, replace=False)
                x, teacher, _, mask = make_batch(sets["train"], idx, layer, last)
                p, state, loss = step(p, state, x, teacher, mask)
                if s % 50 == 0 or s == args.steps - 1:
                    losses.append(float(loss))
                    log(f"layer {layer} {kind}: step {s}/{args.steps} loss {losses[-1]:.3f} "
                        f"({time.perf_counter() - t0:.0f}s)")  # fmt: skip
            train_s = time.perf_counter() - t0

            pick = jax.jit(functools.partial(choose, exit_logits, kind, jnp.asarray(vocab)))
            agree = {}
            for name in ("held-in", "MT-bench"):
                hits = total = 0
                seqs = sets[name]
                for i in range(0, len(seqs), 4):
                    idx = list(range(i, min(i + 4, len(seqs))))
                    x, _, nxt, mask = make_batch(seqs, idx, layer, last)
                    chosen = np.asarray(pick(p, x))
                    m = np.asarray(mask)
                    hits += int(np.sum((chosen == np.asarray(nxt)) & m))
                    total += int(m.sum())
                agree[name] = hits / total
            results.append(dict(layer=layer, kind=kind, loss=losses[-1], train_s=train_s,
                                **agree))  # fmt: skip
            write_report(args, argv, sets, results)
            log(f"layer {layer} {kind}: held-in {agree['held-in']:.3f} MT-bench "
                f"{agree['MT-bench']:.3f} ({train_s:.0f}s)")  # fmt: skip

    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
