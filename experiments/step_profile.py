"""Milliseconds per stage of one speculative step, before and after a change, in one run.

Stages, each jitted alone on the same realistic inputs (a prompt prefilled, then real steps run up
to the measured context length): draft (drafter.propose), verify forward (the target over the
tree), rule (the acceptance rule), commit (target cache + drafter state). The whole call
(speculative_generate, tokens per second) is timed too.

"Before" is another revision of the library (default: the last commit before Engine v2), checked
out into a temporary git worktree; each round runs one worker process per revision, alternating,
so both see the same machine. Ratios are before / after (> 1: the change made it faster).

    python experiments/step_profile.py                 # ~10 minutes on 2 CPU cores
    python experiments/step_profile.py --rounds 1 --reps 3   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
BASELINE = "84388a5"  # main before Engine v2

# (name, target, drafter, tree, max_new_tokens): the drafter is a checkpoint directory, a draft
# model path under the shared folder, or None.
CASES = (
    ("SmolLM2 + eagle, 31-node tree", "smollm2", "checkpoints/smollm2-eagle", ("dyn", 31, 6, 8)),
    ("SmolLM2 + eagle, 4-chain", "smollm2", "checkpoints/smollm2-eagle", ("chain", 4)),
    ("stories260K + eagle, 31-node tree", "stories", "checkpoints/stories260K-eagle",
     ("dyn", 31, 6, 8)),
    ("stories260K + llama2xs-279K, tree (4,2,1)", "stories", "llama2xs", ("static", 4, 2, 1)),
    # The tree the default call picks most often for SmolLM2 on a CPU (results/bench.md).
    ("SmolLM2 + eagle, tree (7,3,4)", "smollm2", "checkpoints/smollm2-eagle", ("dyn", 7, 3, 4)),
)  # fmt: skip
MAX_NEW = 256
STAGES = ("draft", "verify forward", "rule", "commit")


# ---------------------------------------------------------------------------------------------
# Worker: runs inside one revision of the library (PYTHONPATH picks it) and prints JSON.
# ---------------------------------------------------------------------------------------------


def _worker(case_index: int, reps: int, contexts: tuple[int, ...]) -> dict:
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    import specjax
    from specjax.config import SamplingConfig, SpecConfig, TreeConfig
    from specjax.paths import LLAMA2XS, SMOLLM2, STORIES260K, shared_path
    from specjax.verify import RULES

    new = hasattr(specjax, "FullVerifier")
    if new:
        from specjax.datasets import encode_question, read_spec_bench, tinystories_prompts
        from specjax.drafters.base import RootContext
    else:
        from specjax.drafting import RootContext

        from specjax.bench import encode_question, read_spec_bench
        from specjax.benchmark import tinystories_prompts
    from specjax.cache import commit_path, init_cache
    from specjax.prefill import prefill
    from specjax.tree import ancestor_mask

    name, target_name, drafter_spec, tree_spec = CASES[case_index]
    if target_name == "smollm2":
        loaded = specjax.load(shared_path(SMOLLM2))
        q = read_spec_bench("mt_bench_question.jsonl")[0]
        prompt = encode_question(loaded.tokenizer, q.turns[0])
    else:
        loaded = specjax.load(shared_path(STORIES260K))
        prompt = tinystories_prompts(loaded.tokenizer, 1)[0]
    target = loaded.model
    if drafter_spec == "llama2xs":
        drafter = specjax.LMDrafter(specjax.load(shared_path(LLAMA2XS)).model)
    else:
        drafter = specjax.load_drafter(REPO / drafter_spec, target)
    if tree_spec[0] == "dyn":
        tree_cfg = TreeConfig.dynamic(*tree_spec[1:])
    elif tree_spec[0] == "chain":
        tree_cfg = TreeConfig.chain(tree_spec[1])
    else:
        tree_cfg = TreeConfig(branching=tuple(tree_spec[1:]))
    config = SpecConfig(tree=tree_cfg)
    sampling = SamplingConfig()
    n_layers = target.config.n_layers
    if new:
        layers = drafter.feature_layers
    else:
        layers = (n_layers,) if drafter.uses_target_features else ()
    max_depth = tree_cfg.max_depth

    def hidden_arg(hidden):
        if new:
            return hidden
        return hidden[layers[0]] if layers else None

    b = 1
    ids = np.zeros((1, -(-len(prompt) // 16) * 16), np.int32)
    ids[0, : len(prompt)] = prompt
    ids, lens = jnp.asarray(ids), jnp.asarray([len(prompt)], jnp.int32)
    cache_len = ids.shape[1] + MAX_NEW + tree_cfg.num_nodes + max_depth + 2
    keys = jax.random.split(jax.random.key(0), b)
    tdef, tparams = nnx.split(target)
    ddef, dparams = nnx.split(drafter)

    @jax.jit
    def init(tparams, dparams):
        t, d = nnx.merge(tdef, tparams), nnx.merge(ddef, dparams)
        cache = init_cache(t.config, b, cache_len)
        logits, cache, hidden = prefill(t, ids, lens, cache, "auto", return_hidden=layers)
        dstate = d.init_state(
            t, ids, lens, cache_len, config=config, target_hidden=hidden_arg(hidden)
        )
        return jnp.argmax(logits, -1).astype(jnp.int32), cache, dstate

    @jax.jit
    def draft(tparams, dparams, dstate, ctx):
        t, d = nnx.merge(tdef, tparams), nnx.merge(ddef, dparams)
        return d.propose(dstate, t, ctx, keys, config=config, sampling=sampling)

    @jax.jit
    def forward(tparams, tree, cache):
        t = nnx.merge(tdef, tparams)
        out = t(
            tree.tokens,
            positions=cache.lengths[:, None] + tree.depth,
            cache=cache,
            tree_mask=ancestor_mask(tree.parents),
            return_hidden=layers,
        )
        return out.logits, out.cache, out.hidden

    @jax.jit
    def rule(tree, logits):
        if new:
            return RULES["greedy"](tree, logits, keys, max_depth)
        return RULES["greedy"](tree, logits, max_depth)

    @jax.jit
    def commit(tparams, dparams, cache, dstate, acc, hidden):
        t, d = nnx.merge(tdef, tparams), nnx.merge(ddef, dparams)
        advance = acc.n_accepted + 1
        if new:
            cache = specjax.FullVerifier().commit(cache, acc, advance, config=config)
            dstate = d.commit(
                dstate,
                acc,
                advance,
                live=advance > 0,
                config=config,
                target=t,
                target_hidden=hidden,
            )
        else:
            cache = commit_path(cache, acc.path, advance)
            dstate = d.commit(dstate, acc, advance, target=t, target_hidden=hidden_arg(hidden))
        return cache, dstate

    def timed(fn, *args):
        jax.block_until_ready(fn(*args))  # compile
        runs = []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            runs.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(runs)

    root, cache, dstate = init(tparams, dparams)
    prev = ids[:, len(prompt) - 1]
    generated, results = 1, {}
    for context in sorted(contexts):
        # Real greedy steps until `context` tokens follow the prompt.
        while generated < context:
            ctx = RootContext(root=root, prev=prev, lengths=cache.lengths)
            tree, dstate = draft(tparams, dparams, dstate, ctx)
            logits, cache_t, hidden = forward(tparams, tree, cache)
            acc = rule(tree, logits)
            cache, dstate = commit(tparams, dparams, cache_t, dstate, acc, hidden)
            last = jnp.take_along_axis(acc.path, acc.n_accepted[:, None], axis=1)
            prev = jnp.take_along_axis(tree.tokens, last, axis=1)[:, 0]
            root = acc.next_token
            generated += int(acc.n_accepted[0]) + 1
        ctx = RootContext(root=root, prev=prev, lengths=cache.lengths)
        tree, dstate2 = draft(tparams, dparams, dstate, ctx)
        logits, cache_t, hidden = forward(tparams, tree, cache)
        acc = rule(tree, logits)
        results[str(context)] = {
            "draft": timed(draft, tparams, dparams, dstate, ctx),
            "verify forward": timed(forward, tparams, tree, cache),
            "rule": timed(rule, tree, logits),
            "commit": timed(commit, tparams, dparams, cache_t, dstate2, acc, hidden),
            "cache positions": int(cache.lengths[0]),
        }
    gen = functools.partial(
        specjax.speculative_generate, target, drafter, [list(prompt)], max_new_tokens=MAX_NEW,
        config=config,
    )  # fmt: skip
    out = jax.block_until_ready(gen())
    runs = []
    for _ in range(max(2, reps // 3)):
        t0 = time.perf_counter()
        jax.block_until_ready(gen())
        runs.append(time.perf_counter() - t0)
    results["tokens_per_s"] = int(out.lengths[0]) / statistics.median(runs)
    results["cache_len"] = cache_len
    return {"case": name, "new": new, "results": results}


COMMIT_BATCHES = (1, 8, 32)


def _commit_worker(reps: int) -> dict:
    """The target-cache commit alone at SmolLM2's cache shapes ([30, B, 360, 3, 64], a 32-node
    tree, paths of 4 accepted nodes out of order), for several batch sizes."""
    import jax
    import jax.numpy as jnp

    import specjax
    from specjax.cache import KVCache, commit_path

    new = hasattr(specjax, "FullVerifier")
    n_nodes, depth, s = 32, 6, 360
    results = {}
    for b in COMMIT_BATCHES:
        shape = (30, b, s, 3, 64)
        cache = KVCache(
            k=jax.random.normal(jax.random.key(0), shape),
            v=jax.random.normal(jax.random.key(1), shape),
            lengths=jnp.full((b,), 200, jnp.int32),
        )
        path = jnp.broadcast_to(jnp.asarray([0, 3, 9, 17, 25, 0, 0], jnp.int32), (b, depth + 1))
        advance = jnp.full((b,), 5, jnp.int32)
        # The cache is donated, as it is a loop carry in the engine: without donation both
        # versions would also pay a copy of the whole input cache.
        if new:
            fn = jax.jit(lambda c, p, a: commit_path(c, p, a, num_nodes=n_nodes), donate_argnums=0)
        else:
            fn = jax.jit(commit_path, donate_argnums=0)

        def fresh(cache=cache):
            return jax.block_until_ready(jax.tree.map(jnp.copy, cache))

        jax.block_until_ready(fn(fresh(), path, advance))
        runs = []
        for _ in range(reps):
            c = fresh()
            t0 = time.perf_counter()
            jax.block_until_ready(fn(c, path, advance))
            runs.append(time.perf_counter() - t0)
        results[str(b)] = 1e3 * statistics.median(runs)
    return {"case": "commit", "new": new, "results": results}


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def _run_worker(src: Path, case: int, reps: int, contexts) -> dict:
    from specjax.paths import shared_dir

    env = dict(os.environ, PYTHONPATH=str(src), SPECJAX_SHARED=str(shared_dir()))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(case)]
    cmd += ["--reps", str(reps), "--contexts", ",".join(map(str, contexts))]
    out = subprocess.run(cmd, env=env, cwd=src, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"worker failed in {src}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=BASELINE, help="git revision measured as 'before'")
    ap.add_argument("--rounds", type=int, default=2, help="alternating before/after rounds")
    ap.add_argument("--reps", type=int, default=9, help="timed calls per stage (median)")
    ap.add_argument("--contexts", default="16,224", help="generated tokens at which to measure")
    ap.add_argument("--cases", default=None, help="comma-separated case indices (default all)")
    ap.add_argument("--out", default=str(RESULTS / "step_profile.md"))
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    contexts = tuple(int(c) for c in args.contexts.split(","))
    if args.worker is not None:
        if args.worker < 0:
            print(json.dumps(_commit_worker(args.reps)))
        else:
            print(json.dumps(_worker(args.worker, args.reps, contexts)))
        return

    from specjax.benchmark import device_header

    cases = range(len(CASES)) if args.cases is None else [int(c) for c in args.cases.split(",")]
    cases = [*cases, -1]  # -1: the commit alone at several batch sizes
    data: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(old), args.baseline],
            cwd=REPO, check=True, capture_output=True,
        )  # fmt: skip
        try:
            for r in range(args.rounds):
                for case in cases:
                    for label, src in (("before", old), ("after", REPO)):
                        t0 = time.perf_counter()
                        res = _run_worker(src, case, args.reps, contexts)
                        data.setdefault(case, {}).setdefault(label, []).append(res["results"])
                        print(
                            f"round {r + 1} case {case} {label}: {time.perf_counter() - t0:.0f}s",
                            file=sys.stderr,
                        )
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(old)], cwd=REPO, check=False
            )
    write_report(Path(args.out), data, cases, contexts, args, device_header)


def _median(runs: list[dict], *path):
    vals = []
    for run in runs:
        x = run
        for p in path:
            x = x[p]
        vals.append(x)
    return statistics.median(vals)


def write_report(path: Path, data, cases, contexts, args, device_header) -> None:
    lines = [
        "# Step profile: milliseconds per stage, before and after Engine v2",
        "",
        device_header(
            command="python experiments/step_profile.py " + " ".join(sys.argv[1:]),
            baseline=args.baseline,
            rounds=args.rounds,
            reps=args.reps,
        ).rstrip(),
        "",
        f"Batch 1, greedy, max_new_tokens {MAX_NEW}. Each stage is jitted alone and timed on the "
        "same inputs (median of the repetitions, then the median over rounds); 'context' is the "
        "number of generated tokens before the measured step (the cache holds prompt + context "
        "positions of a static cache of cache_len). Ratio = before / after: above 1 the step got "
        "cheaper. The last column times the whole call (tokens per second, same settings).",
        "",
    ]
    for case in cases:
        if case < 0:
            lines += [
                "## Target-cache commit alone, by batch size",
                "",
                "SmolLM2's cache shapes [30, B, 360, 3, 64], a 32-node tree, a path of 4 "
                "accepted nodes out of tree order (jitted commit_path alone with the cache "
                "donated, as a loop carry is; milliseconds).",
                "",
                "| batch | before ms | after ms | ratio |",
                "|---|---|---|---|",
            ]
            for b in COMMIT_BATCHES:
                mb = _median(data[case]["before"], str(b))
                ma = _median(data[case]["after"], str(b))
                lines.append(f"| {b} | {mb:.2f} | {ma:.2f} | {mb / ma:.2f}x |")
            lines.append("")
            continue
        name = CASES[case][0]
        before, after = data[case]["before"], data[case]["after"]
        lines += [f"## {name}", ""]
        lines.append("| context | stage | before ms | after ms | ratio |")
        lines.append("|---|---|---|---|---|")
        for c in contexts:
            total_b = total_a = 0.0
            for stage in STAGES:
                mb, ma = _median(before, str(c), stage), _median(after, str(c), stage)
                total_b, total_a = total_b + mb, total_a + ma
                lines.append(f"| {c} | {stage} | {mb:.2f} | {ma:.2f} | {mb / ma:.2f}x |")
            lines.append(
                f"| {c} | **sum of stages** | {total_b:.2f} | {total_a:.2f} | "
                f"**{total_b / total_a:.2f}x** |"
            )
        tb, ta = _median(before, "tokens_per_s"), _median(after, "tokens_per_s")
        lines += [
            "",
            f"Whole call: {tb:.1f} tokens/s before, {ta:.1f} after ({ta / tb:.2f}x); cache_len "
            f"{after[0]['cache_len']}.",
            "",
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    print(path.read_text())


if __name__ == "__main__":
    main()
