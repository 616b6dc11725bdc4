"""What predicts whether the target accepts a drafted node? The drafting statistics against the
drafter's hidden state and the node's token.

The shipped pre-verifiers read only drafting statistics (NODE_STATS: the node's draft
probability, its cumulative probability, the parent distribution's top-1 probability and
entropy, its rank and depth). PACER and SpecDec++ read the drafter's hidden state as well. This
records greedy steps with each node's parent drafter state (the state its distribution was read
from: DraftTree.node_hidden) and its token, and fits the same small network on four inputs:

- stats: the pre-verifier's features of NODE_STATS,
- stats + hidden: and the parent's drafter state (reduced to its leading principal components,
  fitted on the training nodes: the full 576 dimensions overfit these few thousand steps),
- stats + token: and the node token's target embedding (reduced the same way),
- stats + hidden + token.

Training nodes come from held-in prompts (specjax.calibration.held_in_prompts; the last fifth
held out, for early stopping and the held-out column); MT-bench and EAGLE's qa first turns are
evaluated only. Labels: a node whose parent the target accepted is a positive when it accepted
the node too (greedy: exact). Writes experiments/results/pre_verifier_inputs.md.

    python experiments/pre_verifier_inputs.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import specjax
from specjax.bench.prompts import Dataset
from specjax.benchmark import cpu_model
from specjax.calibration import held_in_prompts
from specjax.config import TreeConfig
from specjax.models.pre_verifier import features
from specjax.paths import SMOLLM2, repo_dir, shared_path
from specjax.pre_verifier_replay import predict
from specjax.train import pre_verifier as pvt

RESULTS = Path(__file__).resolve().parent / "results"
DRAFTERS = ("checkpoints/smollm2-eagle", "checkpoints/smollm2-mdc")
INPUTS = ("stats", "stats + hidden", "stats + token", "stats + hidden + token")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def labelled(records, embed: np.ndarray) -> dict:
    """Every valid node whose parent was accepted: stats [X, S], hidden [X, H], token embedding
    [X, M], label [X]."""
    out = {"stats": [], "hidden": [], "token": [], "label": []}
    for r in records:
        nodes, accepted = pvt.labelled_nodes(r)
        out["stats"].append(r.node_stats[nodes])
        out["hidden"].append(r.hidden[nodes].astype(np.float32))
        out["token"].append(embed[r.tokens[nodes]])
        out["label"].append(accepted)
    return {k: np.concatenate(v) for k, v in out.items()}


def rms_normed(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6)


class Principal:
    """The leading k principal directions of rms-normed training vectors."""

    def __init__(self, x: np.ndarray, k: int):
        x = rms_normed(x)
        self.mean = x.mean(0)
        _, s, vt = np.linalg.svd(x - self.mean, full_matrices=False)
        self.basis = vt[:k].T / (s[:k] / np.sqrt(len(x)))  # unit variance per component

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (rms_normed(x) - self.mean) @ self.basis


def network_inputs(data: dict, kind: str, hidden_pc: Principal, token_pc: Principal, depth: int):
    """[X, F] the network's input for one of INPUTS: the pre-verifier's features of the
    statistics, then the hidden state's and the token embedding's principal components."""
    parts = [np.asarray(features(jnp.asarray(data["stats"]), depth))]
    if "hidden" in kind:
        parts.append(hidden_pc(data["hidden"]))
    if "token" in kind:
        parts.append(token_pc(data["token"]))
    return np.concatenate(parts, axis=-1).astype(np.float32)


def fit(x, y, x_held, y_held, *, steps: int, seed: int = 0, width: int = 32):
    """A one-hidden-layer SiLU network with AdamW on binary cross-entropy, minibatches of 512;
    the parameters of the best held-out AUC (checked every 250 steps) are returned as a
    function of inputs -> logits."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    d = x.shape[1]
    params = {
        "w1": jax.random.normal(k1, (d, width)) / np.sqrt(d),
        "b1": jnp.zeros(width),
        "w2": jax.random.normal(k2, (width, 1)) / np.sqrt(width),
        "b2": jnp.zeros(1),
    }

    def logits(p, x):
        return (jax.nn.silu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])[:, 0]

    def loss(p, x, y):
        return optax.sigmoid_binary_cross_entropy(logits(p, x), y).mean()

    opt = optax.adamw(1e-3, weight_decay=1e-2)
    state = opt.init(params)

    @jax.jit
    def update(p, state, x, y):
        grads = jax.grad(loss)(p, x, y)
        updates, state = opt.update(grads, state, p)
        return optax.apply_updates(p, updates), state

    rng = np.random.default_rng(seed)
    x, y, x_held = jnp.asarray(x), jnp.asarray(y, jnp.float32), jnp.asarray(x_held)
    best_auc, best = -1.0, params
    for i in range(steps):
        idx = rng.integers(0, x.shape[0], 512)
        params, state = update(params, state, x[idx], y[idx])
        if i % 250 == 249:
            a = pvt.auc(np.asarray(logits(params, x_held)), y_held)
            if a > best_auc:
                best_auc, best = a, params
    return lambda inputs: np.asarray(logits(best, jnp.asarray(inputs)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", action="append", help="feature drafter folder(s)")
    ap.add_argument("--prompts", type=int, default=120, help="held-in prompts (1/5 held out)")
    ap.add_argument("--eval-prompts", type=int, default=16, help="first turns per eval set")
    ap.add_argument("--sets", default="mt_bench,qa")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--tree", default="31,6,8", help="recording tree N,DEPTH,TOPK")
    ap.add_argument("--components", type=int, default=16, help="principal components kept")
    ap.add_argument("--steps", type=int, default=4000, help="training steps per network")
    ap.add_argument("--out", default=str(RESULTS / "pre_verifier_inputs.md"))
    args = ap.parse_args()
    started = time.time()
    target = specjax.load(shared_path(SMOLLM2))
    embed = np.asarray(target.model.embed[...], np.float32)
    tree = TreeConfig.dynamic(*(int(x) for x in args.tree.split(",")))
    config = specjax.SpecConfig(tree=tree)
    held, held_words = held_in_prompts("chat", target.tokenizer, n=args.prompts)
    n_train = len(held) * 4 // 5
    eval_sets = {}
    for name in args.sets.split(","):
        loaded = Dataset.named(name, args.eval_prompts, args.max_new).load(target.tokenizer)
        eval_sets[name] = ([list(p.ids) for p in loaded.prompts], loaded.description)
    tables = {}
    for drafter_name in args.drafter or DRAFTERS:
        folder = Path(drafter_name) if Path(drafter_name).exists() else repo_dir() / drafter_name
        drafter = specjax.load_drafter(folder, target.model, pre_verifier=True)
        shipped = drafter.pre_verifier
        record = dict(config=config, max_new_tokens=args.max_new,
                      eos_id=target.tokenizer.eos_id, with_hidden=True)  # fmt: skip
        sets = {}
        for label, prompts in (
            ("train", held[:n_train]),
            ("held-out", held[n_train:]),
            *((name, p) for name, (p, _) in eval_sets.items()),
        ):
            say(f"{folder.name}: recording {label} ({len(prompts)} prompts)")
            sets[label] = labelled(pvt.record_steps(target.model, drafter, prompts, **record),
                                   embed)  # fmt: skip
        train = sets["train"]
        hidden_pc = Principal(train["hidden"], args.components)
        token_pc = Principal(train["token"], args.components)
        depth = shipped.shape.max_depth if shipped is not None else tree.max_depth
        rows = {"draft probability alone": {k: pvt.auc(v["stats"][:, 0], v["label"])
                                            for k, v in sets.items()}}  # fmt: skip
        if shipped is not None:
            rows["shipped pre-verifier (stats)"] = {
                k: pvt.auc(predict(shipped, v["stats"]), v["label"]) for k, v in sets.items()
            }
        for kind in INPUTS:
            say(f"{folder.name}: fitting on {kind}")
            x = {k: network_inputs(v, kind, hidden_pc, token_pc, depth) for k, v in sets.items()}
            net = fit(x["train"], train["label"], x["held-out"], sets["held-out"]["label"],
                      steps=args.steps)  # fmt: skip
            rows[kind] = {k: pvt.auc(net(x[k]), v["label"]) for k, v in sets.items()}
        counts = {k: (len(v["label"]), float(v["label"].mean())) for k, v in sets.items()}
        tables[folder.name] = (rows, counts)
    write(tables, args, held_words, n_train, eval_sets, time.time() - started)


def write(tables, args, held_words, n_train, eval_sets, seconds) -> None:
    drafters = "".join(f" --drafter {d}" for d in args.drafter or [])
    lines = [
        "# What predicts acceptance: drafting statistics, the drafter's hidden state, the token",
        "",
        f"- host: {cpu_model()}, jax {jax.__version__}",
        f"- command: `python experiments/pre_verifier_inputs.py --prompts {args.prompts} "
        f"--eval-prompts {args.eval_prompts} --sets {args.sets} --max-new {args.max_new} "
        f"--tree {args.tree} --components {args.components} --steps {args.steps}{drafters}`",
        f"- wall time: {seconds / 60:.1f} min",
        f"- steps: greedy decoding with dynamic({args.tree}), {args.max_new} new tokens; train: "
        f"the first {n_train} of {args.prompts} held-in prompts ({held_words}), held-out: the "
        "rest (early stopping and its column); "
        + "; ".join(f"{k}: {d} (evaluation only)" for k, (_, d) in eval_sets.items()),
        "- networks: one hidden layer of 32 SiLU units, AdamW (1e-3, weight decay 1e-2), "
        f"{args.steps} steps of 512 nodes, the best held-out AUC kept; hidden and token inputs "
        f"reduced to {args.components} principal components of the training nodes",
        "",
        "AUC of P(node accepted | parent accepted) over the nodes whose parent the target "
        "accepted (nodes, accepted share in the header). What AUC a pre-verifier would need "
        "for a given gain on a machine: pacer_ceiling.md's sharper-discriminator tables.",
        "",
    ]
    for drafter, (rows, counts) in tables.items():
        names = list(counts)
        head = [f"{k} ({n} nodes, {share:.2f})" for k, (n, share) in counts.items()]
        lines += [f"## {drafter}", "", "| input | " + " | ".join(head) + " |"]
        lines.append("|---" * (len(names) + 1) + "|")
        for kind, aucs in rows.items():
            lines.append(f"| {kind} | " + " | ".join(f"{aucs[k]:.3f}" for k in names) + " |")
        lines.append("")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
