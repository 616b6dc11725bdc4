"""Is the dynamic tree's final node choice what limits tau? Replays other choices of a feature
drafter's 31 draft nodes from the same candidate pool and writes
experiments/results/tree_selection.md.

    python experiments/tree_selection.py     # records once (~15 min on 2 cores), then replays
    python experiments/tree_selection.py --drafter checkpoints/smollm2-mdc

A dynamic(N, depth, top-k) tree keeps the top-k frontier of every level, whatever N, and then
the N best candidates of the pool by the drafter's cumulative log q (specjax.tree.expand_topk).
So greedy steps recorded with dynamic(127, 6, 8) hold every candidate that a different final
choice of 31 nodes from the same pool would keep among its 126 best, and a greedy step accepts
exactly the longest prefix of its recorded accepted path that a choice keeps: each step's replay
is exact for the shipped rule and for any choice that stays within those 126 nodes.

Choices replayed: cumulative log q (what the drafter does), cumulative log q plus a bonus per
level (favouring depth over width), the drafter's pre-verifier's predicted path acceptance
(trained on other held-in prompts), and the accepted path itself (the bound). Prompts: held-in,
chat template, seed --seed: half from the project's broad prompt generator to choose a setting
on, half from its task prompt generator (another family) to check it; no evaluation prompt is
used.
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"
CACHE = REPO / "experiments" / "cache" / "tree_selection"
NODES, DEPTH, TOPK, COLLECTION_NODES = 31, 6, 8, 127
BONUSES = (0.05, 0.1, 0.2, 0.3, 0.4)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def record(drafter_dir: str, n_prompts: int, seed: int, max_new: int) -> dict[str, list]:
    """{"tune": records, "check": records}: greedy steps of the collection tree on n_prompts / 2
    broad prompts (to choose a setting on) and as many task prompts (to check it on)."""
    import specjax
    from specjax.config import TreeConfig
    from specjax.paths import SMOLLM2, shared_path
    from specjax.train import pre_verifier as pvt
    from specjax.train.broad_prompts import broad_prompts
    from specjax.train.task_prompts import task_prompts

    target = specjax.load(shared_path(SMOLLM2))
    drafter = specjax.load_drafter(drafter_dir, target.model, pre_verifier=False)
    tok = target.tokenizer
    half = n_prompts // 2

    def chat(texts):
        return [
            tok.encode(
                tok.apply_chat([{"role": "user", "content": t}], add_generation_prompt=True),
                bos=False,
            )
            for t in texts
        ]

    config = specjax.SpecConfig(tree=TreeConfig.dynamic(COLLECTION_NODES, DEPTH, TOPK))
    run = dict(config=config, max_new_tokens=max_new, eos_id=tok.eos_id, progress=say)
    return {
        "tune": pvt.record_steps(
            target.model, drafter, chat(broad_prompts(half, seed=seed)), **run
        ),
        "check": pvt.record_steps(
            target.model, drafter, chat(task_prompts(half, seed=seed)), **run
        ),
    }


def weights_digest(drafter_dir: Path) -> str:
    """A short digest of the files of a drafter's params/ checkpoint."""
    files = sorted(p for p in (drafter_dir / "params").rglob("*") if p.is_file())
    if not files:
        raise SystemExit(f"{drafter_dir}: no params/ checkpoint (not a drafter directory?)")
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(drafter_dir)).encode() + f.read_bytes())
    return h.hexdigest()[:12]


def accepted_tokens(record, keep: np.ndarray) -> int:
    """Tokens a step emits when only the nodes in `keep` [N] are verified (greedy, exact)."""
    n = 0
    for node in record.path:
        if not keep[node]:
            break
        n += 1
    return 1 + n


def best_first(record, node_score: np.ndarray) -> np.ndarray:
    """[N] keep-mask of NODES nodes: repeatedly the best-scoring valid child of a kept node (a
    set closed under parents whatever the score; for a score that never rises along a path it is
    simply the top NODES)."""
    keep = np.zeros(len(record.parents), bool)
    keep[0] = True
    for _ in range(NODES):
        frontier = keep[record.parents] & ~keep & record.valid
        frontier[0] = False
        if not frontier.any():
            break
        keep[np.argmax(np.where(frontier, node_score, -np.inf))] = True
    return keep


def choices(drafter_dir: Path) -> dict[str, Callable]:
    """{name: record -> keep mask}."""
    from specjax.tree import NODE_STATS

    column = {name: i for i, name in enumerate(NODE_STATS)}
    out = {"cumulative log q (the drafter's choice)": lambda r: best_first(
        r, r.node_stats[:, column["cum_logq"]])}  # fmt: skip
    for bonus in BONUSES:
        out[f"cumulative log q + {bonus} per level"] = lambda r, b=bonus: best_first(
            r, r.node_stats[:, column["cum_logq"]] + b * r.node_stats[:, column["depth"]]
        )
    pv_dir = drafter_dir / "pre_verifier"
    if pv_dir.exists():
        import jax.numpy as jnp

        from specjax.models.pre_verifier import load_pre_verifier
        from specjax.pre_verifier_replay import predict
        from specjax.pre_verify import path_logp

        pv = load_pre_verifier(pv_dir)

        def predicted_path_logp(r):
            node_logp = np.log(np.clip(predict(pv, r.node_stats), 1e-6, 1.0))
            return np.asarray(
                path_logp(jnp.asarray(node_logp)[None], jnp.asarray(r.parents)[None], DEPTH)
            )[0]

        out["pre-verifier's predicted path acceptance"] = lambda r: best_first(
            r, predicted_path_logp(r)
        )
    out["the accepted path (bound)"] = lambda r: (
        np.isin(np.arange(len(r.parents)), r.path) | (np.arange(len(r.parents)) == 0)
    )
    return out


def main(argv=None) -> int:
    from specjax.benchmark import cpu_model
    from specjax.pre_verifier_replay import load_records, save_records

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="checkpoints/smollm2-eagle")
    ap.add_argument("--prompts", type=int, default=48, help="held-in prompts (even)")
    ap.add_argument("--seed", type=int, default=4242, help="prompt generators' seed")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--out", default=str(RESULTS / "tree_selection.md"))
    args = ap.parse_args(argv)
    if args.prompts < 2 or args.prompts % 2:
        ap.error(f"--prompts must be an even number >= 2, got {args.prompts}")
    command = shlex.join(["python", "experiments/tree_selection.py", *(argv or sys.argv[1:])])
    drafter_dir = Path(args.drafter)
    drafter_dir = drafter_dir if drafter_dir.is_absolute() else REPO / drafter_dir
    # Keyed by the drafter's weights too: records of other weights would replay silently wrong.
    key = f"{drafter_dir.name}_{weights_digest(drafter_dir)}_{args.prompts}_{args.seed}"
    cache = CACHE / f"{key}_{args.max_new}"
    files = {part: cache / f"{part}.npz" for part in ("tune", "check")}
    if all(f.exists() for f in files.values()):
        say(f"records from {cache}")
        records = {part: load_records(f) for part, f in files.items()}
    else:
        t0 = time.time()
        records = record(str(drafter_dir), args.prompts, args.seed, args.max_new)
        cache.mkdir(parents=True, exist_ok=True)
        for part, f in files.items():
            save_records(records[part], f)
        say(f"recorded in {time.time() - t0:.0f} s into {cache}")

    rules = choices(drafter_dir)
    tokens = {
        name: {part: np.array([accepted_tokens(r, rule(r)) for r in recs])
               for part, recs in records.items()}
        for name, rule in rules.items()
    }  # fmt: skip
    base = tokens["cumulative log q (the drafter's choice)"]
    half = args.prompts // 2
    full = {part: np.mean([1 + len(r.path) for r in recs]) for part, recs in records.items()}
    lines = [
        f"# The dynamic tree's final node choice ({drafter_dir.name}, {NODES} draft nodes, "
        f"depth {DEPTH}, top-{TOPK})",
        "",
        f"- command: `{command}`",
        f"- host: {cpu_model()}",
        f"- records: greedy steps of dynamic({COLLECTION_NODES}, {DEPTH}, {TOPK}) with "
        f"SmolLM2-135M-Instruct, {args.prompts} held-in prompts, chat template, "
        f"{args.max_new} new tokens: {half} of specjax.train.broad_prompts (seed {args.seed}; "
        f"{len(records['tune'])} row-steps) and {half} of specjax.train.task_prompts "
        f"({len(records['check'])} row-steps)",
        f"- tokens per step with all {COLLECTION_NODES} nodes: broad {full['tune']:.3f}, "
        f"task {full['check']:.3f}",
        "",
        "Tokens per step (accepted + 1) when only the chosen nodes are verified; paired "
        "difference against the drafter's choice, mean over row-steps with a 95% interval "
        "(row-steps of one prompt are not independent: read it as a lower bound on the "
        "spread).",
        "",
        "| choice of 31 nodes | broad prompts | paired difference | task prompts "
        "| paired difference |",
        "|---|---|---|---|---|",
    ]
    for name, by_part in tokens.items():
        cells = []
        for part in ("tune", "check"):
            diff = by_part[part] - base[part]
            ci = 1.96 * diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else 0.0
            cells += [f"{by_part[part].mean():.3f}", f"{diff.mean():+.3f} ± {ci:.3f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    say(f"wrote {args.out}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
