"""Where a drafter training batch's positions go, and what two ways of cutting them save:
sequence packing (not built) and running the unrolled levels on answer windows (the trainer
does: specjax.train.trainer.answer_window).

The drafter's layer runs over every position of a batch at every unrolled level, padding and
prompt included, unless its queries run on answer windows (its readouts run at the answer
positions only: specjax.train.trainer.scored_positions). This counts, over the
batches the trainer draws (specjax.train.trainer.batch_rows) from the SmolLM2 card recipe's
answers, evaluation-like prompts left out as the clean recipe does:

- the share of positions that are padding, prompt and answer;
- packing: whole sequences packed first-fit (longest first) into rows of the data's width, from
  windows of 16 batches' sequences as the trainer sorts them, batches cut to their fullest row
  rounded up to 64 as the trainer does; the padding share left;
- answer windows: the levels' queries need only the positions from `levels` before each row's
  answer onward (the first level's keys and values still cover every position, as context: a
  projection), a window per batch as wide as its widest row's, rounded up to 64; the query
  positions left, per level count.

Nothing is timed here: the figures are position counts (layer work scales with them; the
attention over a packed row's width grows with its square). experiments/train_step_time.py
times the windows (`--variants scored scored-windows`).

    python experiments/training_positions.py

Reads the committed answer sets (experiments/answers); writes
experiments/results/training_positions.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The SmolLM2 card recipe's first stage (experiments/train_drafters.py SMOLLM2_DATA).
RECIPE = (("smollm2-synthetic", 64), ("smollm2-broad", 64), ("smollm2-tasks", 64))


def round64(n: int) -> int:
    return -(-int(n) // 64) * 64


def read_answers(sets, answers_root: Path):
    """(tokens list, lengths [R], prompt_lens [R], width) of the first n shards of each set."""
    tokens, lengths, prompt_lens, width = [], [], [], 0
    for name, n in sets:
        shards = sorted((answers_root / name).glob("shard_*.npz"))[:n]
        if len(shards) < n:
            raise SystemExit(f"error: {answers_root / name} holds {len(shards)} shards, {n} asked")
        for shard in shards:
            z = np.load(shard)
            lengths.append(z["lengths"])
            prompt_lens.append(z["prompt_lens"])
            rows = zip(z["tokens"], z["prompt_lens"], strict=True)
            tokens += [row[:p].tolist() for row, p in rows]
            width = max(width, round64(z["tokens"].shape[1]))
    return tokens, np.concatenate(lengths), np.concatenate(prompt_lens), width


def pack_rows(lengths: np.ndarray, width: int) -> list[int]:
    """First-fit packing, longest first, of sequences of these lengths into rows of `width`:
    the fill of each row."""
    fills: list[int] = []
    for n in sorted(lengths.tolist(), reverse=True):
        for r, fill in enumerate(fills):
            if fill + n <= width:
                fills[r] += n
                break
        else:
            fills.append(n)
    return fills


def main(argv=None) -> int:
    from specjax.benchmark import device_header
    from specjax.train.evaluation_like import resembles_evaluation
    from specjax.train.trainer import answer_window, batch_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=2400, help="batches drawn (2 epochs)")
    parser.add_argument("--levels", type=int, nargs="+", default=[3, 6])
    parser.add_argument("--out", default=str(ROOT / "experiments/results/training_positions.md"))
    args = parser.parse_args(argv)

    import specjax
    from specjax.paths import SMOLLM2, shared_path

    tokenizer = specjax.load(shared_path(SMOLLM2)).tokenizer
    prompts, lengths, prompt_lens, width = read_answers(RECIPE, ROOT / "experiments/answers")
    keep = np.array([not resembles_evaluation(tokenizer.decode(p)) for p in prompts])
    lengths, prompt_lens = lengths[keep], prompt_lens[keep]

    # The trainer's batches: positions and their kinds.
    total = answer = prompt = pairs = 0
    layer = {lv: [0, 0] for lv in args.levels}  # levels -> [every position, answer windows]
    stream = batch_rows(lengths, width, args.batch, seed=0)
    for _ in range(args.batches):
        idx, w = next(stream)
        total += len(idx) * w
        pairs += len(idx) * w * w
        answer += int((lengths[idx] - prompt_lens[idx]).sum())
        prompt += int(prompt_lens[idx].sum())
        for lv in args.levels:
            window = answer_window(prompt_lens[idx], lengths[idx], w, lv).shape[1]
            layer[lv][0] += lv * len(idx) * w
            layer[lv][1] += lv * len(idx) * window

    # Packing the same windows of 16 batches the trainer sorts by length.
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(lengths))
    packed_total, packed_rows, packed_pairs = 0, 0, 0
    group = 16 * args.batch
    for g in range(0, len(perm), group):
        fills = pack_rows(lengths[perm[g : g + group]], width)
        for b in range(0, len(fills), args.batch):
            rows = fills[b : b + args.batch]
            row_width = min(round64(max(rows)), width)
            packed_total += len(rows) * row_width
            packed_pairs += len(rows) * row_width**2
        packed_rows += len(fills)
    packed_padding = 1 - lengths.sum() / packed_total
    # Per sequence, so that the trainer's draw (2 epochs) and one packed epoch compare.
    now_per_seq = total / (args.batches * args.batch)
    packed_per_seq = packed_total / len(lengths)
    pairs_ratio = (packed_pairs / len(lengths)) / (pairs / (args.batches * args.batch))

    lines = [
        "# Drafter training positions: padding, packing and answer windows",
        "",
        "- command: `python experiments/training_positions.py`",
        device_header(
            data=f"{', '.join(f'{s} ({n} shards)' for s, n in RECIPE)}; {int((~keep).sum())} "
            f"answers to evaluation-like prompts left out, {len(lengths)} sequences, width {width}",
            batches=f"{args.batches} batches of {args.batch} (the trainer's batch_rows, seed 0)",
        ),
        "",
        "| padding | prompt | answer |",
        "|---|---|---|",
        f"| {1 - (answer + prompt) / total:.1%} | {prompt / total:.1%} | {answer / total:.1%} |",
        "",
        f"Packed first-fit into rows of {width} ({len(lengths)} sequences into {packed_rows} "
        f"rows): {packed_padding:.1%} padding, against {1 - (answer + prompt) / total:.1%}; "
        f"layer positions per sequence {packed_per_seq / now_per_seq:.3f}x, dense attention's "
        f"query-key pairs per sequence {pairs_ratio:.2f}x (every row attends over its whole "
        "width unless the kernel skips the blocks between sequences).",
        "",
        "Query positions of the layer (levels x rows x window) on answer windows (as the "
        "trainer runs them), relative to every level on every position:",
        "",
        "| levels | relative query positions |",
        "|---|---|",
    ]
    lines += [f"| {lv} | {win / now:.3f} |" for lv, (now, win) in layer.items()]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
