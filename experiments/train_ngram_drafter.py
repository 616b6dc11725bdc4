"""Build an n-gram drafter (specjax.drafters.ngram) by distillation: the tables count what the
target itself wrote.

stories260K: the target writes greedy continuations of training prefixes, the first 8 words of
every paragraph of tinystories_train_head.txt and the first 6 words of its sentences (of 8+
words), except the last CALIBRATION_HOLDOUT paragraphs (and their sentences), the source of
specjax.calibration's held-in story prompts. The acceptance profile is calibrated on all 64
held-out paragraphs' openings.

SmolLM2: the committed greedy answers of TABLE_SETS (experiments/answers; never smollm2-chat,
which was written from EAGLE's question files), answer tokens counted with their prompts as
context; the drafter also searches each row's own text (--lookup), whose draft probabilities
are measured on the same answers. The profile is calibrated on specjax.calibration's held-in
chat prompts (user turns the target writes itself).

The dev text and every evaluation file stay unseen. The acceptance profile (greedy and
temperature 1) is written beside the tables with a CARD.md.

    python experiments/train_ngram_drafter.py                     # checkpoints/stories260K-ngram
    python experiments/train_ngram_drafter.py --target smollm2    # checkpoints/smollm2-ngram
    python experiments/train_ngram_drafter.py --context 3 --out runs/ngram3

About a minute on 2 CPU cores for stories260K (the continuations ~40 s, counting ~10 s, the
calibration the rest); SmolLM2 a few minutes (counting ~1 min, the calibration the rest).
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np

import specjax
from specjax.benchmark import cpu_model
from specjax.calibration import calibrate_drafter, calibration_prompts, write_checkpoint_profiles
from specjax.drafters.ngram import save_ngram_drafter
from specjax.paths import (
    SMOLLM2,
    SMOLLM2_NGRAM,
    STORIES260K,
    STORIES260K_NGRAM,
    repo_dir,
    shared_dir,
    shared_path,
)
from specjax.train.checkpoint import target_fingerprint
from specjax.train.ngram import build_tables

CALIBRATION_HOLDOUT = 64  # the last paragraphs: held_in_prompts("story") takes its 8 from them
# The held-in answer sets a chat target's tables count (every committed shard of each).
TABLE_SETS = ("smollm2-synthetic", "smollm2-broad", "smollm2-tasks", "smollm2-self")
# name -> (target, default output, default --context, --topk, --min-count, --lookup). SmolLM2's:
# a chain mostly, so two continuations a context; contexts seen fewer than 3 times left out
# (12 MB instead of ~130 MB of tables, MT-bench chain-of-4 tau 1.80 against 1.83 offline,
# runs of the row's own text up to 8 tokens searched).
TARGETS = {
    "stories260K": (STORIES260K, STORIES260K_NGRAM, 4, 4, 1, 0),
    "smollm2": (SMOLLM2, SMOLLM2_NGRAM, 4, 2, 3, 8),
}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def training_prefixes(tokenizer) -> tuple[list[list[int]], str]:
    """(token-id prefixes, a description): paragraph and sentence openings of the training
    head, without the calibration paragraphs."""
    text = (shared_dir() / "data" / "tinystories_train_head.txt").read_text()
    paras = [p.strip() for p in text.split("\n\n") if p.strip()][:-CALIBRATION_HOLDOUT]
    sentences = [
        s
        for p in paras
        for s in re.split(r"(?<=[.!?])\s+", p)
        if len(s.split()) >= 8 and not p.startswith(s)  # a paragraph's first is already there
    ]
    prefixes = [" ".join(p.split()[:8]) for p in paras]
    prefixes += [" ".join(s.split()[:6]) for s in sentences]
    ids = [tokenizer.encode(p, bos=True) for p in prefixes]
    return ids, (
        f"the first 8 words of {len(paras)} paragraphs and the first 6 of {len(sentences)} "
        f"further sentences of tinystories_train_head.txt (its last {CALIBRATION_HOLDOUT} "
        "paragraphs, the calibration prompts' source, left out)"
    )


def continuations(model, prompts, *, new_tokens: int, batch: int) -> list[np.ndarray]:
    """prompt + greedy continuation of each prompt, as token-id arrays."""
    out = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        tokens = np.asarray(specjax.generate(model, chunk, max_new_tokens=new_tokens).tokens)
        out += [np.asarray(list(p) + list(t), np.int32) for p, t in zip(chunk, tokens, strict=True)]
        say(f"continuations: {len(out)} / {len(prompts)}")
    return out


def committed_answers(sets) -> tuple[list[np.ndarray], list[int], str]:
    """(prompt + answer token arrays, each one's prompt length, a description) of every
    committed shard of the answer sets."""
    from distill_answers import answer_shards, shard_answers

    answers = [a for name in sets for shard in answer_shards(name) for a in shard_answers(shard)]
    seqs, starts = [row for row, _ in answers], [p for _, p in answers]
    if not seqs:
        raise SystemExit(f"no committed answers under experiments/answers/ for {sets}")
    return (
        seqs,
        starts,
        (
            f"the target's greedy answers of {', '.join(sets)} (experiments/answers, every "
            f"committed shard: {len(seqs)} answers), prompts as context only"
        ),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=sorted(TARGETS), default="stories260K")
    ap.add_argument("--context", type=int, help="longest table context, in tokens")
    ap.add_argument("--topk", type=int, help="continuations kept per context")
    ap.add_argument("--min-count", type=int, help="contexts seen fewer times are not stored")
    ap.add_argument("--lookup", type=int, help="longest match searched in a row's text (0: off)")
    ap.add_argument("--new-tokens", type=int, default=256, help="story continuation length")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out")
    args = ap.parse_args()
    target_path, default_out, *defaults = TARGETS[args.target]
    for field, default in zip(("context", "topk", "min_count", "lookup"), defaults, strict=True):
        if getattr(args, field) is None:
            setattr(args, field, default)
    out_dir = args.out or str(repo_dir() / default_out)
    started = time.time()
    loaded = specjax.load(shared_path(target_path))
    model, tokenizer = loaded.model, loaded.tokenizer
    if args.target == "stories260K":
        prompts, described = training_prefixes(tokenizer)
        say(f"{len(prompts)} training prefixes; writing {args.new_tokens}-token continuations")
        seqs = continuations(model, prompts, new_tokens=args.new_tokens, batch=args.batch)
        starts, kind, n_calibration = None, "story", CALIBRATION_HOLDOUT
        data = f"{len(seqs)} prefixes + {args.new_tokens}-token greedy continuations; {described}"
    else:
        seqs, starts, data = committed_answers(TABLE_SETS)
        kind, n_calibration = "chat", None
    say(f"counting {len(seqs)} sequences")
    drafter, report = build_tables(
        seqs, vocab_size=model.config.vocab_size, context=args.context, topk=args.topk,
        min_count=args.min_count, lookup=args.lookup, starts=starts,
    )  # fmt: skip
    say(f"tables: {report}")
    name = Path(target_path).name
    command = f"python experiments/train_ngram_drafter.py --target {args.target}" + (
        f" --context {args.context} --topk {args.topk} --min-count {args.min_count}"
        f" --lookup {args.lookup}"
    )
    if args.target == "stories260K":
        command += f" --new-tokens {args.new_tokens}"
    out = save_ngram_drafter(drafter, out_dir, {
        "target_name": name,
        "target_fingerprint": target_fingerprint(model),
        "data": data,
        "tokens_counted": report["tokens"],
        "contexts_stored": report["contexts"],
        "contexts_dropped": report["dropped"],
        "command": command,
    })  # fmt: skip
    drafter.checkpoint_dir = str(out)
    # Stories: all the held-out paragraphs, not the 8 a network drafter's calibration uses: the
    # tables cost nothing to run, and 8 prompts put the chain-of-3 tau ~4% above 64's.
    cal_prompts, cal_described = calibration_prompts(kind, model, tokenizer, n_calibration)
    say("calibrating the acceptance profile on held-in prompts")
    eos = tokenizer.eos_id if kind == "chat" else None
    profiles = calibrate_drafter(model, drafter, cal_prompts, description=cal_described,
                                 eos_id=eos, progress=say)  # fmt: skip
    lay = drafter.layout
    lines = [
        f"# n-gram drafter for {name}",
        "",
        "Tables of the target's most frequent continuations of its last 1..C tokens "
        "(specjax.drafters.ngram), counted over text the target wrote itself"
        + (", and a search of each row's own text." if drafter.lookup_len else "."),
        "",
        f"- target: {name} (fingerprint {target_fingerprint(model)})",
        f"- data: {data}",
        f"- counted: {report['tokens']} tokens",
        f"- context: 1..{lay.context} tokens, top-{lay.topk} continuations a context, stored "
        f"when seen {args.min_count}+ times, 16-bit fingerprints, {lay.slots} slots "
        f"({', '.join(map(str, lay.sizes))} by length)",
        f"- contexts stored by length: {report['contexts']}; dropped where a more frequent "
        f"context held the slot: {report['dropped']}",
        *(
            [
                f"- text lookup: matches of up to {drafter.lookup_len} tokens in the row's own "
                "text (prompt and answer so far); by match length 1..: tried "
                f"{report['lookup_tries']}, right {report['lookup_hits']} times on the counted "
                "answers (the draft probabilities it reports)"
            ]
            if drafter.lookup_len
            else []
        ),
        f"- built by: `{command}` on {cpu_model()}, {(time.time() - started) / 60:.1f} min with "
        "the calibration below (the same command measures it, with experiments/"
        "calibrate_drafters.py's settings)",
        "",
    ]
    (out / "CARD.md").write_text("\n".join(lines))
    write_checkpoint_profiles(out, profiles)
    say(f"wrote {out} ({(time.time() - started) / 60:.1f} min)")


if __name__ == "__main__":
    main()
