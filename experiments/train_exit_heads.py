"""Train HiSpec's exit heads for a target, pick the draft and verify exits by measured agreement,
and write checkpoints/<target>-hispec (orbax + hispec.json + CARD.md) and
experiments/results/exit_heads_<target>.md.

    python experiments/train_exit_heads.py --target smollm2       # ~25 min on 2 CPU cores
    python experiments/train_exit_heads.py --target stories260K   # ~2 min

Data (held-in, never MT-bench or the EAGLE question files):
  smollm2:     the target's own answers in experiments/answers/smollm2-broad and
               smollm2-synthetic (smollm2-chat is left out: its prompts came from EAGLE's
               question files); the last shards of each are the held-in evaluation split.
  stories260K: TinyStories training paragraphs (shared data/tinystories_train_head.txt); the
               last 10% are the held-in evaluation split.
Evaluation only: the target's greedy answers to MT-bench first turns (smollm2) and TinyStories
dev paragraphs (stories260K).

Every candidate exit layer gets the untrained exit (identity) and the mlp head; every head kind
(identity, linear, mlp) is compared at one layer (all layers for stories260K); same data and
steps for all. Agreement = share of answer positions where the exit's argmax (over the exit
vocabulary) is the target's argmax (over the full vocabulary). Choice: each level of HiSpec is a
drafter for the level above it, so a layer E with agreement a is scored by the speedup a chain
drafter of relative cost c would give (Leviathan et al.): max over k of
(1 - a^(k+1)) / ((1 - a)(k c + 1)), c = the multiply-adds of layers [0, E) and the exit readout
over the whole target's (layers and full LM head). The draft exit is the best-scoring layer at
most L/4; the verify exit the best-scoring layer above it. A run without such a pair (a sweep
of upper layers, e.g. --layers 12 16 20 24 27 --out runs/x) reports agreement only and saves no
heads.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"
# kinds_at: the layer where every head kind is trained (elsewhere: the untrained exit and "mlp",
# which beat "linear" at every layer of stories260K at equal steps).
TARGETS = {
    "smollm2": dict(
        layers=(4, 8, 12), kinds_at=8, vocab=8192, steps=1000, train_seqs=300, eval_seqs=60
    ),  # fmt: skip
    "stories260K": dict(
        layers=(1, 2, 3), kinds_at=None, vocab=512, steps=3000, train_seqs=1500, eval_seqs=150
    ),  # fmt: skip
}
ANSWER_SETS = ("smollm2-broad", "smollm2-synthetic")
# smollm2-chat is not among them: its prompts came from EAGLE's question files.
CLEAN_ANSWER_SETS = ("smollm2-broad", "smollm2-synthetic", "smollm2-tasks")


def chain_speedup(a: float, c: float, max_k: int = 8) -> tuple[float, int]:
    """(best speedup, its chain length) of a drafter with per-token acceptance a and relative
    cost c per drafted token."""
    a = min(a, 0.999)
    best = max(((1 - a ** (k + 1)) / ((1 - a) * (k * c + 1)), k) for k in range(1, max_k + 1))
    return best


def relative_cost(cfg, layer: int, exit_vocab: int) -> float:
    """Multiply-adds of layers [0, E) plus the exit readout over U ids, over a full token's
    (L layers plus the LM head over V): what a drafted token costs relative to the target."""
    kv = cfg.n_kv_heads * cfg.head_dim
    per_layer = (
        cfg.d_model * (2 * cfg.n_heads * cfg.head_dim + 2 * kv) + 3 * cfg.d_model * cfg.ffn_dim
    )
    full = cfg.n_layers * per_layer + cfg.d_model * cfg.vocab_size
    return (layer * per_layer + cfg.d_model * exit_vocab) / full


def answer_rows(names, eval_shards: int):
    """(train rows, train starts, eval rows, eval starts) from answer shards: the last
    eval_shards of each set are the evaluation split."""
    from distill_answers import answer_shards, shard_answers

    train, eval_ = ([], []), ([], [])
    for name in names:
        shards = answer_shards(name)
        for i, path in enumerate(shards):
            dest = eval_ if i >= len(shards) - eval_shards else train
            for row, p in shard_answers(path):
                if len(row) > p:
                    dest[0].append(row.tolist())
                    dest[1].append(p - 1)
    return train, eval_


def spread(rows_starts, n: int, seed: int):
    rows, starts = rows_starts
    idx = np.random.default_rng(seed).permutation(len(rows))[:n]
    return [rows[i] for i in idx], [starts[i] for i in idx]


def mt_bench_rows(loaded, n: int, max_new_tokens: int = 96):
    import specjax
    from specjax.datasets import encode_question, read_spec_bench, select_questions

    questions = select_questions(read_spec_bench("mt_bench_question.jsonl"), n)
    prompts = [encode_question(loaded.tokenizer, q.turns[0]) for q in questions]
    out = specjax.generate(loaded.model, prompts, max_new_tokens=max_new_tokens,
                           eos_id=loaded.tokenizer.eos_id)  # fmt: skip
    toks, lens = np.asarray(out.tokens), np.asarray(out.lengths)
    rows = [p + toks[i, : lens[i]].tolist() for i, p in enumerate(prompts)]
    return rows, [len(p) - 1 for p in prompts]


def story_rows(tokenizer, path: Path, lo: float, hi: float):
    paras = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    paras = paras[int(lo * len(paras)) : int(hi * len(paras))]
    rows = [tokenizer.encode(p, bos=True)[:256] for p in paras if len(p.split()) >= 12]
    return rows, [1] * len(rows)


def main(argv=None) -> int:
    from flax import nnx

    import specjax
    from specjax.benchmark import device_header
    from specjax.models.exit_head import EXIT_KINDS, ExitHead
    from specjax.paths import SMOLLM2, STORIES260K, shared_dir, shared_path
    from specjax.train.exit_heads import (
        ExitTrainConfig,
        agreement,
        collect,
        exit_parts,
        save_exit_heads,
        train_exit_head,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=list(TARGETS), default="smollm2")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--layers", type=int, nargs="+", default=None)
    parser.add_argument("--train-seqs", type=int, default=None)
    parser.add_argument("--out", default=None, help="checkpoint dir (default checkpoints/...)")
    parser.add_argument(
        "--answer-sets", nargs="+", default=list(ANSWER_SETS), choices=CLEAN_ANSWER_SETS,
        help="smollm2: answer sets to train and evaluate on (never smollm2-chat)",
    )  # fmt: skip
    parser.add_argument(
        "--all-kinds-at", type=int, default=None,
        help="the layer where every head kind is trained (default: the target's; -1: none)",
    )  # fmt: skip
    parser.add_argument("--results", default=None, help="report path (default results/...)")
    args = parser.parse_args(argv)
    spec = TARGETS[args.target]
    layers = tuple(args.layers or spec["layers"])
    steps = args.steps or spec["steps"]
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t_start = time.perf_counter()

    model_path = shared_path(SMOLLM2 if args.target == "smollm2" else STORIES260K)
    loaded = specjax.load(model_path)
    target, cfg = loaded.model, loaded.model.config
    n_train = args.train_seqs or spec["train_seqs"]
    if args.target == "smollm2":
        answer_sets = tuple(args.answer_sets)
        train_all, eval_all = answer_rows(answer_sets, eval_shards=2)
        if not train_all[0] or not eval_all[0]:
            raise SystemExit(
                f"error: the answer sets {', '.join(answer_sets)} hold too few shards (2 are kept "
                "for evaluation): run python experiments/distill_answers.py --set NAME"
            )
        train = spread(train_all, n_train, 0)
        held = spread(eval_all, spec["eval_seqs"], 1)
        log("generating MT-bench answers (evaluation only)")
        outside, outside_name = mt_bench_rows(loaded, 16), "MT-bench (16 first turns, greedy)"
        data_line = (f"{n_train} answer sequences of {', '.join(answer_sets)} (target's own "
                     "greedy answers to held-in prompts; smollm2-chat left out)")  # fmt: skip
    else:
        text = shared_dir() / "data" / "tinystories_train_head.txt"
        train = spread(story_rows(loaded.tokenizer, text, 0.0, 0.9), n_train, 0)
        held = spread(story_rows(loaded.tokenizer, text, 0.9, 1.0), spec["eval_seqs"], 1)
        dev = shared_dir() / "data" / "tinystories_dev.txt"
        outside = spread(story_rows(loaded.tokenizer, dev, 0.0, 1.0), 150, 2)
        outside_name = "TinyStories dev (150 paragraphs)"
        data_line = (
            f"{n_train} paragraphs of $SPECJAX_SHARED/data/tinystories_train_head.txt (first 90%)"
        )

    t0 = time.perf_counter()
    sets = {}
    for name, (rows, starts) in (("train", train), ("held-in", held), ("outside", outside)):
        log(f"collecting {name} features")
        sets[name] = collect(target, rows, starts, layers, progress=log)
    collect_s = time.perf_counter() - t0

    # Exit vocabulary: the most frequent next tokens of the training positions.
    counts = np.bincount(sets["train"].target_next, minlength=cfg.vocab_size).astype(float)
    vocab = np.sort(np.argsort(-counts, kind="stable")[: spec["vocab"]]).astype(np.int32)
    coverage = float(np.isin(sets["held-in"].target_next, vocab).mean())
    parts = exit_parts(target, vocab)
    train_cfg = ExitTrainConfig(steps=steps)

    results, heads = [], {}
    for layer in layers:
        kinds_at = spec["kinds_at"] if args.all_kinds_at is None else args.all_kinds_at
        every = kinds_at in (None, layer)
        for kind in EXIT_KINDS if every else ("identity", "mlp"):
            head = ExitHead(cfg.d_model, layer=layer, kind=kind, vocab=vocab, eps=cfg.norm_eps,
                            rngs=nnx.Rngs(0))  # fmt: skip
            t0 = time.perf_counter()
            losses = train_exit_head(head, parts, sets["train"], train_cfg, log=log)
            train_s = time.perf_counter() - t0
            agree = {n: agreement(head, parts, sets[n]) for n in ("held-in", "outside")}
            score, k = chain_speedup(agree["held-in"], relative_cost(cfg, layer, len(vocab)))
            results.append(dict(layer=layer, kind=kind, loss=losses[-1] if losses else None,
                                train_s=train_s, score=score, k=k, **agree))  # fmt: skip
            heads[(layer, kind)] = head
            log(f"layer {layer} {kind}: held-in {agree['held-in']:.3f} outside "
                f"{agree['outside']:.3f} score {score:.2f} (k={k}) {train_s:.0f}s")  # fmt: skip

    chosen = choose_exits(results, cfg.n_layers)
    out_dir = Path(args.out or REPO / "checkpoints" / f"{args.target}-hispec")
    if chosen is not None:
        save_exit_heads({r: heads[(c["layer"], c["kind"])] for r, c in chosen.items()},
                        out_dir, target=target, target_name=model_path.name)  # fmt: skip

    total_s = time.perf_counter() - t_start
    command = " ".join(["python experiments/train_exit_heads.py", *(argv or sys.argv[1:])])
    header = device_header()
    table = [
        "| layer | kind | relative cost c | held-in agreement | "
        + outside_name
        + " agreement | final loss | score (chain k) | train s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        loss = "" if r["loss"] is None else f"{r['loss']:.3f}"
        c = relative_cost(cfg, r["layer"], len(vocab))
        table.append(f"| {r['layer']} | {r['kind']} | {c:.3f} | {r['held-in']:.3f} | "
                     f"{r['outside']:.3f} | "
                     f"{loss} | {r['score']:.2f} ({r['k']}) | {r['train_s']:.0f} |")  # fmt: skip
    why = (
        "Each level is a drafter for the level above it: a layer E with agreement a scores the "
        "speedup of a chain drafter of relative cost c, max over k of "
        "(1 - a^(k+1)) / ((1 - a)(k c + 1)) (held-in agreement; c = multiply-adds of layers "
        "[0, E) and the exit readout over those of the whole target). Draft exit: the best "
        f"score at most L/4 = {cfg.n_layers / 4:g}; verify exit: the best score above it."
    )
    sizes = {n: d.size for n, d in sets.items()}
    report = "\n".join([
        f"# Exit heads for {model_path.name} ({cfg.n_layers} layers)", "",
        header, f"- command: {command}",
        f"- data: {data_line}; {sizes['train']} training positions, {sizes['held-in']} held-in "
        f"and {sizes['outside']} {outside_name} evaluation positions",
        f"- exit vocabulary: {len(vocab)} most frequent target next tokens of the training "
        f"positions (covers {coverage:.1%} of held-in target tokens)",
        f"- training: {steps} steps x {train_cfg.batch} positions, AdamW lr {train_cfg.lr}, "
        "cross-entropy to the target's distribution over the exit vocabulary",
        f"- feature collection {collect_s:.0f}s; whole run {total_s / 60:.1f} min", "",
        *table, "",
        _chosen_line(chosen, cfg.n_layers) + f" {why}", "",
    ])  # fmt: skip
    results_path = Path(args.results or RESULTS / f"exit_heads_{args.target}.md")
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(report)
    print(report)
    if chosen is None:
        return 0
    draft, verify = chosen["draft"], chosen["verify"]
    card = "\n".join([
        f"# HiSpec exit heads for {model_path.name}", "",
        f"- reproduce: `{command}` ({total_s / 60:.1f} min here)", header,
        f"- draft exit: layer {draft['layer']} of {cfg.n_layers}, {draft['kind']} head; top-1 "
        f"agreement with the last layer {draft['held-in']:.3f} held-in, {draft['outside']:.3f} "
        f"on {outside_name}",
        f"- verify exit: layer {verify['layer']} of {cfg.n_layers}, {verify['kind']} head; "
        f"agreement {verify['held-in']:.3f} held-in, {verify['outside']:.3f} on {outside_name}",
        f"- exit vocabulary: {len(vocab)} ids ({coverage:.1%} of held-in target tokens)",
        f"- data: {data_line}",
        f"- training: {steps} steps x {train_cfg.batch} positions per head "
        f"({draft['train_s']:.0f}s and {verify['train_s']:.0f}s)",
        f"- why these layers: {why} Every candidate: "
        f"{results_path.relative_to(REPO) if results_path.is_relative_to(REPO) else results_path}",
        "",
    ])  # fmt: skip
    (out_dir / "CARD.md").write_text(card)
    return 0


def choose_exits(results: list[dict], n_layers: int) -> dict | None:
    """The draft exit (the best score at a layer at most L/4) and the verify exit (the best
    score above it), or None when the run trained no layer that can be a draft exit or none
    above it (a sweep of upper layers, which reports agreement only)."""

    def best(rows):
        return max(rows, key=lambda r: r["score"]) if rows else None

    draft = best([r for r in results if r["layer"] <= n_layers / 4])
    if draft is None:
        return None
    verify = best([r for r in results if r["layer"] > draft["layer"]])
    return None if verify is None else {"draft": draft, "verify": verify}


def _chosen_line(chosen: dict | None, n_layers: int) -> str:
    if chosen is None:
        return (f"Chosen: none (no trained layer at most L/4 = {n_layers / 4:g} with one above "
                "it; no heads saved).")  # fmt: skip
    draft, verify = chosen["draft"], chosen["verify"]
    return (f"Chosen: draft exit layer {draft['layer']} ({draft['kind']}), verify exit layer "
            f"{verify['layer']} ({verify['kind']}).")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
