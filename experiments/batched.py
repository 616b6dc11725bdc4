"""Batched decoding on SmolLM2-135M-Instruct (or stories260K): specjax `generate` and
`speculative_generate` (the default call, SpecConfig.auto(), with the eagle drafter) against
transformers `generate` on the same weights, at batch 8, 32 and 64, greedy, side by side in one
process. Writes experiments/results/batched.md.

    python experiments/batched.py                       # batches 8, 32, 64; 64 new tokens
    python experiments/batched.py --batches 8 --max-new-tokens 32 --reps 1   # a quick look
    python experiments/batched.py --target stories260K --batches 16 --max-new-tokens 256 \
        --spec-tree 7,3,4 --no-hf --baselines "no compaction" --out DIR/batched_stories.md
            # rows that end at EOS at different times: what finished-row compaction saves
    python experiments/batched.py --batches 2 4 8 --max-new-tokens 128 --no-hf --baselines \
        --cost-aware --out experiments/results/batched_cost_aware.md
            # the default call's cost-aware candidate (run at batch 1 only) at batches

Prompts: the first B MT-bench first turns (80 exist; B > 80 repeats them) in the chat template,
ragged (left-padded for transformers), every row stopping at EOS. Throughput = generated tokens
(EOS included) / wall seconds of the whole batch, median over interleaved repetitions after one
warm-up call each (compilation excluded). Greedy outputs are compared row by row with specjax
autoregressive decoding. specjax generate runs large batches with two paths of its own: the
packed prefill (specjax.prefill: prompts in length-sorted chunks, not one padded block) and
finished-row compaction (specjax.decode: decoding in phases of B, B/2, ... rows); the
"one-block prefill" and "no compaction" rows are the same call with one path switched off.
"tokens per row-step": generated tokens / (B x steps of the batch), the share of row-steps that
produced a token had every row been decoded to the end of the batch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from pathlib import Path

import jax
import numpy as np
from flax import nnx

RESULTS = Path(__file__).resolve().parent / "results"
# specjax generate with one large-batch path switched off: (module, knob) in specjax.
BASELINES = {
    "one-block prefill": ("prefill", "PACKED_MIN_BATCH"),
    "no compaction": ("decode", "COMPACT_MIN_BATCH"),
}


def uncached_jit(fn, static_argnames):
    """jax.jit of a copy of `fn`. JAX keeps traces per function object, so a second jit of the
    library's own function would reuse the trace the library made before a knob was raised (and
    time the library's program under the baseline's name)."""
    clone = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    clone.__kwdefaults__ = fn.__kwdefaults__
    return jax.jit(clone, static_argnames=static_argnames)


def main(argv=None) -> int:
    import specjax
    from specjax.bench.hf_peer import prepare_torch_env
    from specjax.benchmark import device_header
    from specjax.datasets import (
        encode_question,
        read_spec_bench,
        select_questions,
        tinystories_prompts,
    )
    from specjax.drafters import load_drafter
    from specjax.paths import (
        SMOLLM2,
        SMOLLM2_EAGLE,
        STORIES260K,
        STORIES260K_EAGLE,
        STORIES_TOKENIZER,
        repo_dir,
        shared_path,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target",
        choices=("smollm2", "stories260K"),
        default="smollm2",
        help="stories260K: TinyStories dev prefixes (stories end at EOS early)",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument(
        "--no-spec",
        action="store_true",
        help="skip the speculative call "
        "(its first call at a new batch size measures costs for minutes)",
    )
    parser.add_argument("--baselines", nargs="*", default=list(BASELINES), choices=BASELINES,
                        help="specjax generate with a large-batch path off")  # fmt: skip
    parser.add_argument(
        "--spec-tree",
        default=None,
        help="also time speculative_generate with this dynamic tree (budget,depth,topk, e.g. "
        "7,3,4), with and without finished-row compaction",
    )
    parser.add_argument(
        "--cost-aware",
        action="store_true",
        help="also time the default call with its cost-aware candidate (api._cost_aware_candidate: "
        "the chosen tree widened, pruned each step by t(N) at the batch), which the library runs "
        "at batch 1 only",
    )
    parser.add_argument("--out", default=str(RESULTS / "batched.md"))
    args = parser.parse_args(argv)

    if args.target == "smollm2":
        loaded = specjax.load(shared_path(SMOLLM2))
        tok, eos = loaded.tokenizer, loaded.tokenizer.eos_id
        questions = select_questions(read_spec_bench("mt_bench_question.jsonl"), 80)
        base = [encode_question(tok, q.turns[0]) for q in questions]
        drafter = load_drafter(repo_dir() / SMOLLM2_EAGLE, loaded.model)
        model_name = "SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to float32)"
        prompt_name = "first B MT-bench first turns, chat template"
        stop = "EOS stop"
    else:
        loaded = specjax.load(shared_path(STORIES260K), tokenizer=shared_path(STORIES_TOKENIZER))
        # The llama2.c models delimit stories with BOS (llama2.c's run.c stops there).
        tok, eos = loaded.tokenizer, loaded.tokenizer.bos_id
        base = tinystories_prompts(tok, 80)
        drafter = load_drafter(repo_dir() / STORIES260K_EAGLE, loaded.model)
        model_name = "stories260K (llama2.c, float32)"
        prompt_name = "first 8 words of B TinyStories dev paragraphs"
        stop = "stop at BOS (the story delimiter)"
    hf = None
    if not args.no_hf:
        prepare_torch_env()
        import torch

        from specjax.io.export import to_transformers

        torch.set_num_threads(os.cpu_count() or 1)  # every core, as JAX uses
        hf = to_transformers(loaded.model)
        import transformers

        hf.generation_config = transformers.GenerationConfig(
            bos_token_id=None, eos_token_id=eos, pad_token_id=eos
        )

    def run_ar(prompts):
        out = specjax.generate(loaded.model, prompts, max_new_tokens=args.max_new_tokens,
                               eos_id=eos)  # fmt: skip
        return jax.block_until_ready(out)

    def generate_without(module, knob):
        """specjax generate with one of its large-batch paths switched off (`knob` of
        specjax.`module` raised out of reach): the same jitted program traced while the knob is
        raised, as a fresh jit, so its compiled program keeps the old path while the library's
        default stays on. prefill.PACKED_MIN_BATCH: the one-block prefill;
        decode.COMPACT_MIN_BATCH: finished rows decoded to the end of the batch."""
        import importlib

        from specjax.decode import _generate, check_eos, prepare_keys, prepare_prompts

        mod = importlib.import_module(f"specjax.{module}")
        static = ("graphdef", "max_new_tokens", "sampling", "attn_impl", "record_hidden", "mesh")
        fresh = uncached_jit(_generate.__wrapped__, static)
        graphdef, params = nnx.split(loaded.model)
        eos_id = np.int32(check_eos(eos, loaded.model.config))

        def run(prompts):
            ids, lens = prepare_prompts(prompts, loaded.model.config, args.max_new_tokens)
            keys = prepare_keys(None, ids.shape[0])
            saved = getattr(mod, knob)
            setattr(mod, knob, 1 << 30)  # read when the program is traced (the first call)
            try:
                out = fresh(graphdef, params, ids, lens, keys, eos_id,
                            max_new_tokens=args.max_new_tokens, sampling=specjax.SamplingConfig(),
                            attn_impl="auto")  # fmt: skip
            finally:
                setattr(mod, knob, saved)
            return jax.block_until_ready(out)

        return run

    def run_spec(prompts):
        # adapt=False: every repetition makes the first call's choice (a shift learned from the
        # repetitions before would time another tree, and compile it inside a timed run).
        out = specjax.speculative_generate(
            loaded.model, drafter, prompts, max_new_tokens=args.max_new_tokens, eos_id=eos,
            config=specjax.SpecConfig.auto(adapt=False),
        )  # fmt: skip
        return jax.block_until_ready(out)

    def run_spec_cost_aware(prompts):
        """The default call with api.COST_AWARE_MAX_BATCH raised to this batch: the eagle's
        chosen tree widened and pruned each step by its pre-verifier under t(N) measured at B
        rows (read in Python before tracing, so no fresh jit is needed)."""
        from specjax import api

        saved, api.COST_AWARE_MAX_BATCH = api.COST_AWARE_MAX_BATCH, len(prompts)
        try:
            return run_spec(prompts)
        finally:
            api.COST_AWARE_MAX_BATCH = saved

    def spec_fixed(tree, compact: bool):
        """speculative_generate with an explicit tree; compact=False: the same program traced
        with decode.COMPACT_MIN_BATCH out of reach (a fresh jit, as generate_without), so
        finished rows run to the end of the batch."""
        from specjax import decode, speculative

        config = specjax.SpecConfig(tree=tree)
        fresh = uncached_jit(speculative._speculative.__wrapped__, (
            "target_def", "drafter_def", "verifier_def", "max_new_tokens", "config", "sampling",
            "mesh",
        ))  # fmt: skip

        def run(prompts):
            if compact:
                return jax.block_until_ready(specjax.speculative_generate(
                    loaded.model, drafter, prompts, max_new_tokens=args.max_new_tokens,
                    eos_id=eos, config=config,
                ))  # fmt: skip
            saved, decode.COMPACT_MIN_BATCH = decode.COMPACT_MIN_BATCH, 1 << 30
            original, speculative._speculative = speculative._speculative, fresh
            try:
                out = speculative.speculative_decode(
                    loaded.model, drafter, prompts, max_new_tokens=args.max_new_tokens,
                    config=config, eos_id=eos,
                )  # fmt: skip
            finally:
                decode.COMPACT_MIN_BATCH, speculative._speculative = saved, original
            return jax.block_until_ready(out)

        return run

    def run_hf(prompts):
        import torch

        width = max(map(len, prompts))
        ids = torch.tensor([[eos] * (width - len(p)) + list(p) for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                              do_sample=False)  # fmt: skip
        return out[:, width:].numpy()

    def hf_tokens(out):
        rows = []
        for r in out:
            r = list(r)
            n = r.index(eos) + 1 if eos in r else len(r)
            rows.append(np.asarray(r[:n]))
        return rows

    def sj_tokens(out):
        return [np.asarray(out.tokens[i, : int(out.lengths[i])]) for i in range(len(out.lengths))]

    def write(lines, done):
        """The results file with the rows so far (a long run keeps what it measured)."""
        header = device_header(
            model=model_name,
            prompts=f"{prompt_name}, {args.max_new_tokens} new tokens, {stop}, greedy",
            repetitions=f"{args.reps} interleaved after one warm-up call each",
            command="python experiments/batched.py " + " ".join(argv or sys.argv[1:]),
        )
        table = [
            f"# Batched decoding: specjax vs transformers generate ({args.target})",
            "",
            header,
            "",
            "| B | method | tokens | seconds (median) | tokens/s | = specjax AR | tokens per "
            "row-step, choice |",
            "|---|---|---|---|---|---|---|",
            *lines,
            "",
            "tokens per row-step: generated tokens / (B x target steps of the batch); for plain "
            "decoding the share of row-steps that would produce a token if every row ran to the "
            "end of the batch (with compaction, finished rows leave in phases of B/2, B/4, ...). "
            "= specjax AR: rows whose greedy output equals specjax generate's. On CPU, compare "
            "within a batch size (same process), not across machines.",
            f"Batch sizes measured: up to B={done} of {args.batches}.",
        ]
        Path(args.out).write_text("\n".join(table) + "\n")

    lines = []
    for b in args.batches:
        prompts = [base[i % len(base)] for i in range(b)]
        methods = {"specjax generate": run_ar}
        for name in args.baselines:
            methods[f"specjax generate, {name}"] = generate_without(*BASELINES[name])
        if not args.no_spec:
            methods["specjax speculative (auto, eagle)"] = run_spec
        if args.cost_aware:
            methods["specjax speculative (auto, eagle, cost-aware candidate)"] = run_spec_cost_aware
        if args.spec_tree:
            tree = specjax.TreeConfig.dynamic(*map(int, args.spec_tree.split(",")))
            label = f"specjax speculative (eagle, dynamic({args.spec_tree}))"
            methods[label] = spec_fixed(tree, compact=True)
            methods[label + ", no compaction"] = spec_fixed(tree, compact=False)
        if hf is not None:
            methods["transformers generate"] = run_hf
        outs, times = {}, {name: [] for name in methods}
        for name, fn in methods.items():  # warm-up: compile, measure costs, choose
            t0 = time.perf_counter()
            outs[name] = fn(prompts)
            print(f"[batched] B={b} {name}: warm-up {time.perf_counter() - t0:.1f}s",
                  file=sys.stderr, flush=True)  # fmt: skip
        # A second warm-up pass: what a later method's first call made an earlier one compile
        # again (methods share the drafter) compiles here, not in a timed repetition.
        for fn in methods.values():
            fn(prompts)
        names = list(methods)
        for r in range(args.reps):  # each repetition starts one method later
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t0 = time.perf_counter()
                methods[name](prompts)
                times[name].append(time.perf_counter() - t0)
        ref = sj_tokens(outs["specjax generate"])
        for name in methods:
            out = outs[name]
            toks = hf_tokens(out) if name.startswith("transformers") else sj_tokens(out)
            n = sum(len(t) for t in toks)
            med = statistics.median(times[name])
            same = np.mean([np.array_equal(a, c) for a, c in zip(ref, toks, strict=True)])
            extra = ""
            if not name.startswith("transformers"):
                steps = int(np.max(np.asarray(out.stats["target_calls"]))) if out.stats else max(
                    len(t) for t in toks)  # fmt: skip
                extra = f"{n / (b * max(steps, 1)):.2f}"
                if out.stats and "tree" in out.stats:
                    extra += f", tree {out.stats['tree']}"
            lines.append(
                f"| {b} | {name} | {n} | {med:.2f} | {n / med:.1f} | {same:.0%} | {extra} |"
            )
            print(lines[-1], flush=True)
        jax.clear_caches()
        write(lines, done=b)

    print(f"[batched] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
