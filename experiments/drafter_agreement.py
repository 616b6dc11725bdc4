"""Where a feature drafter's tau is lost: teacher-forced agreement with the target, per unrolled
level, on prompt sets the drafter was and was not trained on.

For each prompt set the target writes greedy answers (128 new tokens), one teacher-forced pass
records its hidden states, and the drafter's training forward (specjax.models.drafter.
unrolled_outputs, the exact conditions of a depth-(k+1) tree node) predicts every answer token.
Reported per level k: top-1 and top-8 agreement with the target's greedy token, and the share of
the target's tokens inside the draft vocabulary (a drafter can never propose the others).

    python experiments/drafter_agreement.py                 # SmolLM2 drafters, ~6 min on CPU
    python experiments/drafter_agreement.py --n 4 --levels 2    # a quick look
    python experiments/drafter_agreement.py --n 80 --sets mt_bench --drafter DIR --drafter DIR2
        # compare trained drafters on every MT-bench first turn (answers cached after one run)

Prompt sets: MT-bench first turns and EAGLE's qa set (held out), and prompts of the synthetic
and broad training generators, split into those with a committed answer under
experiments/answers (trained on, where the recipe uses that shard) and those without. Writes
experiments/results/drafter_agreement.md. The target's answers and hidden states of each set are
kept in experiments/cache/agreement/ (gitignored), so comparing drafters again costs only their
forward passes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = Path(__file__).resolve().parent / "cache" / "agreement"
TOPK = 8
# --sets names -> the prompt_sets keys they select
SET_NAMES = {
    "mt_bench": "MT-bench (held out)",
    "qa": "qa (held out)",
    "synthetic_seen": "synthetic, trained on",
    "synthetic_unseen": "synthetic, not trained on",
    "broad_seen": "broad, trained on",
    "broad_unseen": "broad, not trained on",
}


def prompt_sets(tokenizer, n: int) -> dict[str, list[list[int]]]:
    from specjax.datasets import (
        SPEC_BENCH_FILES,
        encode_question,
        read_spec_bench,
        select_questions,
    )
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


def cached_sequences(model, name: str, prompts, eos_id) -> dict:
    """answered_sequences, kept in CACHE under the set's name and prompt count; a cached shard
    whose prompts differ from `prompts` is rebuilt."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"{name}_{len(prompts)}.npz"
    if path.exists():
        shard = dict(np.load(path))
        same = len(shard["prompt_lens"]) == len(prompts) and all(
            shard["tokens"][i, : len(p)].tolist() == p for i, p in enumerate(prompts)
        )
        if same:
            return shard
    shard = answered_sequences(model, prompts, eos_id)
    np.savez(path, **shard)
    return shard


def agreement(model, net, shard: dict, levels: int, rows: int = 8) -> dict:
    """Per-level top-1 / top-8 agreement with the target's greedy token over answer positions,
    and the draft vocabulary's coverage of those tokens (computed `rows` sequences at a time)."""
    hits = {}
    for i in range(0, len(shard["lengths"]), rows):
        part = {k: v[i : i + rows] for k, v in shard.items()}
        for k, v in _agreement_counts(model, net, part, levels).items():
            hits[k] = hits.get(k, 0) + v
    row = {"coverage": hits["covered"] / hits["answer"]}
    for k in range(levels):
        row[f"top1_{k}"] = hits[f"top1_{k}"] / hits[f"valid_{k}"]
        row[f"top{TOPK}_{k}"] = hits[f"top{TOPK}_{k}"] / hits[f"valid_{k}"]
    return row


def _agreement_counts(model, net, shard: dict, levels: int) -> dict:
    """Counts behind `agreement` for one chunk of sequences."""
    from specjax.models.drafter import path_ancestors, target_parts, unrolled_outputs

    width = -(-int(shard["lengths"].max()) // 64) * 64
    ids = jnp.asarray(shard["tokens"][:, :width])
    feats = jnp.asarray(shard["feats"][:, :width].astype(np.float32))
    target_top = np.asarray(jnp.argmax(model.head(feats), axis=-1))  # [B, T]
    parts = target_parts(model, net.draft_vocab[...])
    vocab = np.asarray(net.draft_vocab[...])
    emb = jnp.take(parts.embed, ids, axis=0)
    outs = unrolled_outputs(net, parts, ids, feats, levels)
    pos = np.arange(width)[None, :]
    answer = (pos >= shard["prompt_lens"][:, None] - 1) & (pos < shard["lengths"][:, None] - 1)
    counts = {
        "answer": int(answer.sum()),
        "covered": int(np.isin(target_top[answer], vocab).sum()),
    }
    for k, out in enumerate(outs):
        logits = net.logits(parts, out, emb, path_ancestors(emb, net.config.path_tokens - 1))
        top = vocab[np.asarray(jax.lax.top_k(logits, TOPK)[1])]
        valid = answer & (pos >= k)
        counts[f"valid_{k}"] = int(valid.sum())
        counts[f"top1_{k}"] = int((top[..., 0] == target_top)[valid].sum())
        counts[f"top{TOPK}_{k}"] = int((top == target_top[..., None]).any(-1)[valid].sum())
    return counts


def main(argv=None) -> int:
    import specjax
    from specjax.benchmark import device_header
    from specjax.paths import SMOLLM2, SMOLLM2_EAGLE, SMOLLM2_MDC, repo_dir, shared_path
    from specjax.train.checkpoint import load_drafter_net

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10, help="prompts per set")
    parser.add_argument("--levels", type=int, default=6, help="unrolled levels (tree depth)")
    parser.add_argument("--out", default=str(RESULTS / "drafter_agreement.md"))
    parser.add_argument(
        "--sets", nargs="+", choices=sorted(SET_NAMES), default=sorted(SET_NAMES), metavar="SET"
    )
    parser.add_argument(
        "--drafter",
        action="append",
        default=None,
        help="a trained SmolLM2 drafter directory (default: the two shipped ones)",
    )
    args = parser.parse_args(argv)

    loaded = specjax.load(shared_path(SMOLLM2))
    paths = args.drafter or [repo_dir() / p for p in (SMOLLM2_MDC, SMOLLM2_EAGLE)]
    nets = {_label(p): load_drafter_net(p) for p in paths}
    wanted = {SET_NAMES[s] for s in args.sets}
    rows = []
    for set_name, prompts in prompt_sets(loaded.tokenizer, args.n).items():
        if set_name not in wanted:
            continue
        key = next(k for k, v in SET_NAMES.items() if v == set_name)
        shard = cached_sequences(loaded.model, key, prompts, loaded.tokenizer.eos_id)
        for drafter, net in nets.items():
            rows.append((set_name, drafter, agreement(loaded.model, net, shard, args.levels)))
            print(set_name, drafter, rows[-1][2], flush=True)

    levels = range(args.levels)
    head = ["prompt set", "drafter", "in draft vocab"]
    head += [f"L{k} top-1 / top-{TOPK}" for k in levels]
    lines = [
        "# Drafter agreement with the target, per unrolled level",
        "",
        f"`python experiments/drafter_agreement.py {' '.join(argv or sys.argv[1:])}`; "
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


def _label(path) -> str:
    """A drafter's row label: its directory name, with the parent's for a directory outside
    checkpoints/ (e.g. runs/a/smollm2-eagle -> a/smollm2-eagle)."""
    path = Path(path).resolve()
    return path.name if path.parent.name == "checkpoints" else f"{path.parent.name}/{path.name}"


if __name__ == "__main__":
    sys.exit(main())
