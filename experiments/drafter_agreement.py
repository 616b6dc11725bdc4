"""Where a feature drafter's tau is lost: teacher-forced agreement with the target, per unrolled
level, on prompt sets the drafter was and was not trained on.

For each prompt set the target writes greedy answers (128 new tokens), one teacher-forced pass
records its hidden states, and the drafter's training forward (specjax.models.drafter.
unrolled_outputs, the exact conditions of a depth-(k+1) tree node) predicts every answer token.
Reported per level k: top-1 and top-8 agreement with the target's greedy token, and the share of
the target's tokens inside the draft vocabulary (a drafter can never propose the others).

    python experiments/drafter_agreement.py                 # SmolLM2 drafters, ~6 min on CPU
    python experiments/drafter_agreement.py --n 4 --levels 2    # a quick look

Prompt sets: MT-bench first turns and EAGLE's qa set (held out), and prompts of the synthetic
and broad training generators, split into those with a committed answer under
experiments/answers (trained on, where the recipe uses that shard) and those without. Writes
experiments/results/drafter_agreement.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
TOPK = 8


def prompt_sets(tokenizer, n: int) -> dict[str, list[list[int]]]:
    from specjax.bench import SPEC_BENCH_FILES, encode_question, read_spec_bench, select_questions
    from specjax.train.broad_prompts import broad_prompts
    from specjax.train.prompts import synthetic_prompts

    def held_out(name):
        questions = select_questions(read_spec_bench(SPEC_BENCH_FILES[name]), n)
        return [q.turns[0] for q in questions]

    answered = answered_prompts()

    def split(texts):
        """(the first n prompts that were answered for training, the first n that were not)"""
        ids = [encode_question(tokenizer, t) for t in texts]
        seen = [p for p in ids if tuple(p) in answered][:n]
        return seen, [p for p in ids if tuple(p) not in answered][:n]

    # Both generators are deterministic prefixes: 4096 prompts cover every answered one.
    syn_seen, syn_unseen = split(synthetic_prompts(4096))
    broad_seen, broad_unseen = split(broad_prompts(4096))
    return {
        "MT-bench (held out)": [encode_question(tokenizer, t) for t in held_out("mt_bench")],
        "qa (held out)": [encode_question(tokenizer, t) for t in held_out("qa")],
        "synthetic, trained on": syn_seen,
        "synthetic, not trained on": syn_unseen,
        "broad, trained on": broad_seen,
        "broad, not trained on": broad_unseen,
    }


def answered_prompts() -> set[tuple[int, ...]]:
    """The prompt ids of every committed answer (experiments/answers/*/shard_*.npz)."""
    seen = set()
    for shard in sorted((RESULTS.parent / "answers").glob("*/shard_*.npz")):
        data = np.load(shard)
        for row, n in zip(data["tokens"], data["prompt_lens"], strict=True):
            seen.add(tuple(int(x) for x in row[:n]))
    return seen


def answered_sequences(model, prompts, eos_id, max_new_tokens=128) -> dict:
    """Greedy answers with their teacher-forced hidden states, as a distillation shard."""
    from specjax.decode import generate
    from specjax.train.data import add_features

    out = generate(model, prompts, max_new_tokens=max_new_tokens, eos_id=eos_id)
    tokens, n_new = np.asarray(out.tokens), np.asarray(out.lengths)
    seqs = [list(p) + tokens[i, : n_new[i]].tolist() for i, p in enumerate(prompts)]
    width = -(-max(map(len, seqs)) // 64) * 64
    ids = np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    shard = {
        "tokens": ids,
        "lengths": np.array([len(s) for s in seqs], np.int32),
        "prompt_lens": np.array([len(p) for p in prompts], np.int32),
    }
    return add_features(model, shard)


def agreement(model, net, shard: dict, levels: int) -> dict:
    """Per-level top-1 / top-8 agreement with the target's greedy token over answer positions,
    and the draft vocabulary's coverage of those tokens."""
    from specjax.models.drafter import shift_right, target_parts, unrolled_outputs

    ids = jnp.asarray(shard["tokens"])
    feats = jnp.asarray(shard["feats"].astype(np.float32))
    target_top = np.asarray(jnp.argmax(model.head(feats), axis=-1))  # [B, T]
    parts = target_parts(model, net.draft_vocab[...])
    vocab = np.asarray(net.draft_vocab[...])
    emb = jnp.take(parts.embed, ids, axis=0)
    outs = unrolled_outputs(net, parts, ids, feats, levels)
    pos = np.arange(ids.shape[1])[None, :]
    answer = (pos >= shard["prompt_lens"][:, None] - 1) & (pos < shard["lengths"][:, None] - 1)
    row = {"coverage": float(np.isin(target_top[answer], vocab).mean())}
    for k, out in enumerate(outs):
        logits = np.asarray(net.logits(parts, out, emb, shift_right(emb, 1)))
        top = vocab[np.argsort(-logits, axis=-1)[..., :TOPK]]
        valid = answer & (pos >= k)
        row[f"top1_{k}"] = float((top[..., 0] == target_top)[valid].mean())
        row[f"top{TOPK}_{k}"] = float((top == target_top[..., None]).any(-1)[valid].mean())
    return row


def main(argv=None) -> int:
    import specjax
    from specjax.benchmark import device_header
    from specjax.paths import SMOLLM2, SMOLLM2_EAGLE, SMOLLM2_MDC, shared_path
    from specjax.train.checkpoint import load_drafter_net

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10, help="prompts per set")
    parser.add_argument("--levels", type=int, default=6, help="unrolled levels (tree depth)")
    parser.add_argument("--out", default=str(RESULTS / "drafter_agreement.md"))
    args = parser.parse_args(argv)

    loaded = specjax.load(shared_path(SMOLLM2))
    nets = {Path(p).name: load_drafter_net(p) for p in (SMOLLM2_MDC, SMOLLM2_EAGLE)}
    rows = []
    for set_name, prompts in prompt_sets(loaded.tokenizer, args.n).items():
        shard = answered_sequences(loaded.model, prompts, loaded.tokenizer.eos_id)
        for drafter, net in nets.items():
            rows.append((set_name, drafter, agreement(loaded.model, net, shard, args.levels)))
            print(set_name, drafter, rows[-1][2], flush=True)

    levels = range(args.levels)
    head = ["prompt set", "drafter", "in draft vocab"]
    head += [f"L{k} top-1 / top-{TOPK}" for k in levels]
    lines = [
        "# Drafter agreement with the target, per unrolled level",
        "",
        f"`python experiments/drafter_agreement.py --n {args.n} --levels {args.levels}`; "
        f"{device_header()}. SmolLM2-135M-Instruct, greedy answers of 128 new tokens to "
        f"{args.n} prompts per set, teacher-forced; level k = a depth-(k+1) tree node (k draft "
        "tokens between it and the last verified token).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for set_name, drafter, r in rows:
        cells = [set_name, drafter, f"{r['coverage']:.3f}"]
        cells += [f"{r[f'top1_{k}']:.3f} / {r[f'top{TOPK}_{k}']:.3f}" for k in levels]
        lines.append("| " + " | ".join(cells) + " |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
