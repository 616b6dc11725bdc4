"""How often a text chain's node is accepted, by the length of the match it was drafted from:
the table a cost-aware pre-verifier weighs text chain nodes with
(specjax.drafters.text_chain.CHAIN_NODE_LOGP).

Replays the feature drafters' text chain (host_text_chain, the engine's prompt lookup) at every
answer position of the target's own greedy answers to held-in prompts (experiments/answers:
broad, task and self-written prompts; never the smollm2-chat set, whose prompts come from
EAGLE's question files), and counts, for each chain node whose earlier chain nodes were all
right, whether its token is the answer's next one. Greedy acceptance of a chain node is exactly
that. Writes experiments/results/chain_acceptance.md.

    python experiments/chain_acceptance.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from specjax.drafters.text_chain import LONGEST, host_text_chain

ROOT = Path(__file__).resolve().parent
SOURCES = ("smollm2-broad", "smollm2-tasks", "smollm2-self", "smollm2-synthetic")


def replay(tokens, lengths, prompt_lens, rows, k: int):
    """(tried [LONGEST + 1], right [LONGEST + 1]): chain nodes drafted from a match of m tokens
    whose earlier chain nodes were right, and how many of them were right too."""
    tried = np.zeros(LONGEST + 1, np.int64)
    right = np.zeros(LONGEST + 1, np.int64)
    for row in rows:
        n, p0 = int(lengths[row]), int(prompt_lens[row])
        text = tokens[row, :n].astype(np.int64)
        for p in range(p0, n - 1):  # the root is text[p]; the answer goes on with text[p + 1:]
            chain, matches = host_text_chain(text[: p + 1], k, LONGEST, with_matches=True)
            for i, (token, m) in enumerate(zip(chain, matches, strict=True)):
                if p + 1 + i >= n:
                    break
                tried[m] += 1
                if token != text[p + 1 + i]:
                    break
                right[m] += 1
    return tried, right


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=2, help="answer shards per source")
    parser.add_argument("--rows", type=int, default=32, help="answers per shard")
    parser.add_argument("--chain", type=int, default=12, help="chain nodes per position")
    parser.add_argument("--out", default=str(ROOT / "results" / "chain_acceptance.md"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    per_source = {}
    for source in SOURCES:
        shards = sorted((ROOT / "answers" / source).glob("shard_*.npz"))[: args.shards]
        if not shards:
            raise SystemExit(f"no answer shards in experiments/answers/{source}")
        tried = np.zeros(LONGEST + 1, np.int64)
        right = np.zeros(LONGEST + 1, np.int64)
        for shard in shards:
            d = np.load(shard)
            rows = range(0, len(d["lengths"]), max(1, len(d["lengths"]) // args.rows))
            t, r = replay(d["tokens"], d["lengths"], d["prompt_lens"], rows, args.chain)
            tried, right = tried + t, right + r
        per_source[source] = (tried, right)
        print(f"[chain] {source}: {tried.sum()} nodes", file=sys.stderr, flush=True)
    tried = sum(t for t, _ in per_source.values())
    right = sum(r for _, r in per_source.values())
    header = "| match (tokens) | " + " | ".join(per_source) + " | all | log p (all) |"
    lines = [
        "# Text chain nodes accepted, by the match they were drafted from",
        "",
        f"- command: `python experiments/chain_acceptance.py --shards {args.shards} --rows "
        f"{args.rows} --chain {args.chain}`",
        f"- data: the target's greedy answers in experiments/answers/ ({', '.join(SOURCES)}; "
        f"the first {args.shards} shards, {args.rows} answers each); every answer position a "
        f"step, chains of {args.chain} nodes (matches up to {LONGEST} tokens)",
        f"- time: {time.perf_counter() - start:.0f} s",
        "",
        "P(chain node right | the chain nodes before it right), nodes counted in parentheses:",
        "",
        header,
        "|" + "---|" * (len(per_source) + 3),
    ]
    for m in range(1, LONGEST + 1):
        cells = [f"{r[m] / t[m]:.3f} ({t[m]})" if t[m] else "-" for t, r in per_source.values()]
        p = right[m] / max(tried[m], 1)
        lines.append(
            f"| {m}{'+' if m == LONGEST else ''} | " + " | ".join(cells)
            + f" | {p:.3f} ({tried[m]}) | {np.log(max(p, 1e-6)):.3f} |"
        )  # fmt: skip
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
