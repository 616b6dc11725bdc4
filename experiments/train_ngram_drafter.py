"""Build an n-gram drafter (specjax.drafters.ngram) for a story target by distillation: the
target writes greedy continuations of training prefixes, and the tables count what it wrote.

Training prefixes: the first 8 words of every paragraph of tinystories_train_head.txt and the
first 6 words of its sentences (of 8+ words), except the last CALIBRATION_HOLDOUT paragraphs
(and their sentences), the source of specjax.calibration's held-in story prompts. The
TinyStories dev text and every evaluation file stay unseen. Then the acceptance profile is
calibrated on all 64 held-out paragraphs' openings (greedy and temperature 1) and written
beside the tables with a CARD.md.

    python experiments/train_ngram_drafter.py                     # checkpoints/stories260K-ngram
    python experiments/train_ngram_drafter.py --context 3 --out runs/ngram3

About a minute on 2 CPU cores for stories260K (the continuations ~40 s, counting ~10 s, the
calibration the rest).
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
from specjax.paths import STORIES260K, STORIES260K_NGRAM, repo_dir, shared_dir, shared_path
from specjax.train.checkpoint import target_fingerprint
from specjax.train.ngram import build_tables

CALIBRATION_HOLDOUT = 64  # the last paragraphs: held_in_prompts("story") takes its 8 from them


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=STORIES260K, help="a story target under the shared models")
    ap.add_argument("--context", type=int, default=4, help="longest context, in tokens")
    ap.add_argument("--topk", type=int, default=4, help="continuations kept per context")
    ap.add_argument("--new-tokens", type=int, default=256, help="continuation length")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", default=str(repo_dir() / STORIES260K_NGRAM))
    args = ap.parse_args()
    started = time.time()
    loaded = specjax.load(shared_path(args.target))
    model, tokenizer = loaded.model, loaded.tokenizer
    prompts, described = training_prefixes(tokenizer)
    say(f"{len(prompts)} training prefixes; writing {args.new_tokens}-token continuations")
    seqs = continuations(model, prompts, new_tokens=args.new_tokens, batch=args.batch)
    drafter, report = build_tables(seqs, vocab_size=model.config.vocab_size,
                                   context=args.context, topk=args.topk)  # fmt: skip
    say(f"tables: {report}")
    name = Path(args.target).name
    command = "python experiments/train_ngram_drafter.py" + (
        f" --context {args.context} --topk {args.topk} --new-tokens {args.new_tokens}"
    )
    out = save_ngram_drafter(drafter, args.out, {
        "target_name": name,
        "target_fingerprint": target_fingerprint(model),
        "data": described,
        "tokens_counted": report["tokens"],
        "contexts_stored": report["contexts"],
        "contexts_dropped": report["dropped"],
        "command": command,
    })  # fmt: skip
    drafter.checkpoint_dir = str(out)
    # All the held-out paragraphs, not the 8 a network drafter's calibration uses: the tables
    # cost nothing to run, and 8 prompts put the chain-of-3 tau ~4% above 64's.
    cal_prompts, cal_described = calibration_prompts("story", model, tokenizer,
                                                     CALIBRATION_HOLDOUT)  # fmt: skip
    say("calibrating the acceptance profile on held-in prompts")
    profiles = calibrate_drafter(model, drafter, cal_prompts, description=cal_described,
                                 progress=say)  # fmt: skip
    lay = drafter.layout
    lines = [
        f"# n-gram drafter for {name}",
        "",
        "Tables of the target's most frequent continuations of its last 1..C tokens "
        "(specjax.drafters.ngram), counted over greedy continuations the target wrote itself.",
        "",
        f"- target: {name} (fingerprint {target_fingerprint(model)})",
        f"- data: {len(seqs)} prefixes + {args.new_tokens}-token greedy continuations; {described}",
        f"- counted: {report['tokens']} tokens",
        f"- context: 1..{lay.context} tokens, top-{lay.topk} continuations a context, "
        f"16-bit fingerprints, {lay.slots} slots ({', '.join(map(str, lay.sizes))} by length)",
        f"- contexts stored by length: {report['contexts']}; dropped where a more frequent "
        f"context held the slot: {report['dropped']}",
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
