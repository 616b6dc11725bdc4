"""A trained feature drafter with a wider draft vocabulary, for measuring whether the tokens its
vocabulary leaves out cost tau. The readout is the target's own LM head restricted to the draft
vocabulary (specjax.models.drafter.readout) and nothing the drafter trained is sized by it, so
the same weights read out over more tokens: the shipped vocabulary plus the next most frequent
answer tokens of the drafter's training recipe (experiments/train_drafters.py), as training picks
them.

    python experiments/widen_draft_vocab.py --drafter smollm2-eagle --size 16384 \
        --out runs/eagle-v16k
    python experiments/drafter_tau.py --drafter runs/eagle-v16k \
        --baseline experiments/results/drafter_tau.json --baseline-name smollm2-eagle \
        --sets mt_bench --temperatures 0 --out experiments/results/drafter_tau_eagle_vocab16k.md
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
from distill_answers import answers_dir
from train_drafters import ANSWER_SET, RECIPES, ROOT


def answer_counts(name: str, vocab_size: int) -> np.ndarray:
    """Token counts [V] over the answers (prompts excluded) of the recipe's shards."""
    _, recipe = RECIPES[name]
    target = name.split("-")[0]
    sets = [(ANSWER_SET[target], recipe.max_shards), *recipe.extra_sets]
    counts = np.zeros(vocab_size, np.float64)
    for set_name, n in sets:
        shards = sorted(answers_dir(set_name).glob("shard_*.npz"))[:n]
        if n is not None and len(shards) < n:
            raise ValueError(f"answer set {set_name}: {len(shards)} shards, the recipe uses {n}")
        for shard in shards:
            z = np.load(shard)
            pos = np.arange(z["tokens"].shape[1])[None, :]
            answer = (pos >= z["prompt_lens"][:, None]) & (pos < z["lengths"][:, None])
            counts += np.bincount(z["tokens"][answer].astype(np.int64), minlength=vocab_size)
    return counts


def main(argv=None) -> int:
    from flax import nnx

    from specjax.models.drafter import DrafterNet
    from specjax.train.checkpoint import load_drafter_net, read_header, save_drafter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", required=True, choices=sorted(RECIPES))
    parser.add_argument("--size", type=int, required=True, help="the wider vocabulary's size")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    src = ROOT / "checkpoints" / args.drafter
    net = load_drafter_net(src)
    vocab = np.asarray(net.draft_vocab[...])
    v = net.config.target.vocab_size
    if not len(vocab) < args.size <= v:
        raise SystemExit(f"error: --size must be in ({len(vocab)}, {v}], got {args.size}")
    counts = answer_counts(args.drafter, v)
    # Most frequent first (ties toward lower ids), as specjax.train.data.draft_vocabulary.
    extra = [int(i) for i in np.argsort(-counts, kind="stable") if i not in set(vocab.tolist())]
    wide = np.sort(np.concatenate([vocab, extra[: args.size - len(vocab)]])).astype(np.int32)
    share = lambda ids: counts[ids].sum() / counts.sum()  # noqa: E731
    print(f"answer tokens covered: {share(vocab):.2%} -> {share(wide):.2%}")

    config = dataclasses.replace(net.config, draft_vocab_size=len(wide))
    widened = DrafterNet(config, wide, rngs=nnx.Rngs(0))
    nnx.update(widened, nnx.state(net, nnx.Param))
    header = read_header(src)
    save_drafter(widened, args.out, target_name=header.get("target_name", ""),
                 dtype=header["dtype"], fingerprint=header.get("target_fingerprint"))  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
