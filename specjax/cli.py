"""`specjax` command line: speculative (or plain) generation with a real checkpoint.

specjax demo
specjax generate --model PATH --prompt TEXT [--drafter PATH|DIR|self:K|lookup[:K]]
                 [--tree N,DEPTH,TOPK[,TEXT]]
                 [--max-new-tokens N] [--temperature T] [--chat]
                 [--mesh DxM [--coordinator HOST:PORT --num-processes N --process-id I]]
specjax train-drafter --target PATH --kind mdc|eagle --out DIR
specjax bench [--targets ...] [--datasets ...] [--prompts FILE ...] [--methods SPEC ...] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time


def _drafter_spec():
    # Imported on use: loading specjax (and jax) makes `specjax --help` slow.
    from specjax.drafters import spec

    return spec


def _encode_prompt(loaded, text: str, chat: bool) -> list[int]:
    tok = loaded.tokenizer
    if tok is None:
        raise SystemExit(
            "error: this checkpoint has no tokenizer next to it; pass --tokenizer PATH"
        )
    if chat:
        text = tok.apply_chat([{"role": "user", "content": text}], add_generation_prompt=True)
        return tok.encode(text, bos=False)
    return tok.encode(text, bos=True)


def _timed(fn, *args, **kwargs):
    """Run fn once, wait for its result: returns (result, wall seconds)."""
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    return out, time.perf_counter() - t0


def _generation_call(
    loaded, ids, *, max_new_tokens, sampling, seed, drafter=None, tree=None, verifier=None, rows=1
):
    """(fn, args, kwargs) of one generation call: plain decoding without a drafter, else
    speculative decoding. rows: the prompt is repeated that many times (to fill a mesh's
    'data' axis)."""
    import jax

    import specjax

    eos = loaded.tokenizer.eos_id if loaded.tokenizer is not None else None
    kwargs = dict(
        max_new_tokens=max_new_tokens, sampling=sampling, key=jax.random.key(seed), eos_id=eos
    )
    if drafter is None:
        return specjax.generate, (loaded.model, [ids] * rows), kwargs
    # No --tree: the hardware-aware default chooses it (printed with its prediction).
    kwargs["config"] = specjax.SpecConfig.auto() if tree is None else specjax.SpecConfig(tree=tree)
    if verifier is not None:
        kwargs["verifier"] = verifier
    return specjax.speculative_generate, (loaded.model, drafter, [ids] * rows), kwargs


def _replaying(call, out):
    """`call` pinned to the choice its first run `out` made: a default call's later runs would
    otherwise choose with the acceptance shift that first run measured (AutoSpecConfig.adapt),
    and could compile another tree inside a timed run."""
    import dataclasses

    from specjax.config import AutoSpecConfig

    fn, args, kwargs = call
    config = kwargs.get("config")
    if isinstance(config, AutoSpecConfig) and config.adapt is True:
        shift = float(out.stats["acceptance_shift"])
        kwargs = {**kwargs, "config": dataclasses.replace(config, adapt=shift)}
    return fn, args, kwargs


def run_generation(loaded, ids, **call):
    """Compile, then time one run; returns (output, run seconds, compile seconds). `call`: the
    keywords of _generation_call."""
    fn, args, kwargs = _generation_call(loaded, ids, **call)
    # The first call compiles; the second (same output, same choice) is the timed one.
    first_out, first = _timed(fn, *args, **kwargs)
    fn, args, kwargs = _replaying((fn, args, kwargs), first_out)
    out, run = _timed(fn, *args, **kwargs)
    return out, run, first - run


def _median_times(calls, rounds: int) -> list[float]:
    """Median wall seconds of each (fn, args, kwargs) in `calls` over `rounds` rounds that run
    them in turn, so that a slow spell of the machine falls on every call alike."""
    import statistics

    times = [[] for _ in calls]
    for _ in range(rounds):
        for fn_times, (fn, args, kwargs) in zip(times, calls, strict=True):
            fn_times.append(_timed(fn, *args, **kwargs)[1])
    return [statistics.median(t) for t in times]


def report(loaded, out, run, compile_s, label):
    import jax

    n = int(out.lengths[0])
    print(loaded.tokenizer.decode([int(t) for t in out.tokens[0, :n]]))
    extra = ""
    if out.stats is not None:
        extra = (
            f", tau {float(out.stats['tau'][0]):.2f} tokens/target call, "
            f"{int(out.stats['target_calls'][0])} target calls"
        )
        if int(out.stats.get("pre_verifier_stops", [0])[0]) > 0:
            extra += (
                f", pre-verifier: {float(out.stats['draft_len'][0]):.1f} draft nodes verified "
                f"per step, {int(out.stats['pre_verifier_stops'][0])} drafts cut"
            )
        if "predicted_speedup" in out.stats:
            extra += (
                f", tree {out.stats['tree']} (chosen for this hardware: predicted tau "
                f"{out.stats['predicted_tau']:.2f}, speedup {out.stats['predicted_speedup']:.2f}x)"
            )
        plain = int(out.stats.get("plain_steps", [0])[0])
        if plain > 0:
            extra += (
                f"; tokens per call stayed below the tree's break-even "
                f"({out.stats['break_even_tau']:.2f}), so the last {plain} of those target calls "
                "decoded plainly"
            )
    print(
        f"[{label}: {n} tokens, {n / run:.1f} tokens/s{extra}, compile {compile_s:.1f}s, "
        f"backend {jax.default_backend()}]",
        file=sys.stderr,
    )


def _mesh_from_args(args):
    """The device mesh of --mesh (None without it), after joining the other processes when
    coordinator settings are given (jax.distributed must start before any other JAX call)."""
    from specjax import distributed

    multi = args.coordinator is not None or args.num_processes is not None
    if multi or args.process_id is not None:
        if args.mesh is None:
            raise ValueError("--coordinator / --num-processes / --process-id need --mesh")
        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    if args.mesh is None:
        return None
    import specjax

    data, model = distributed.parse_mesh(args.mesh)
    return specjax.make_mesh(data=data, model=model)


def _gathered(out):
    """Every array of a GenerateOutput on this host (rows may live on other hosts' chips)."""
    import jax

    from specjax.distributed import gather_to_host

    return jax.tree.map(lambda x: gather_to_host(x) if isinstance(x, jax.Array) else x, out)


def cmd_generate(args) -> int:
    if args.mesh is not None:
        from specjax.distributed import parse_mesh

        parse_mesh(args.mesh)  # a malformed --mesh fails before JAX starts
    mesh = _mesh_from_args(args)
    import jax

    import specjax

    sampling = specjax.SamplingConfig(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p
    )
    # Flags that would do nothing without another are refused before the model loads.
    if args.tree and not args.drafter:
        raise SystemExit("error: --tree needs --drafter (the tree is the drafter's)")
    if args.exit_heads and not (args.drafter and args.tree):
        raise SystemExit("error: --exit-heads needs --drafter and --tree (an explicit draft tree)")
    loaded = specjax.load(args.model, tokenizer=args.tokenizer, mesh=mesh)
    ids = _encode_prompt(loaded, args.prompt, args.chat)
    drafter = _drafter_spec().make_drafter(args.drafter, loaded) if args.drafter else None
    tree = _drafter_spec().tree_for(args.drafter, args.tree) if args.tree else None
    verifier = None
    if args.exit_heads:
        verifier = specjax.EarlyExitVerifier.from_checkpoint(args.exit_heads, loaded.model)
    out, run, comp = run_generation(
        loaded,
        ids,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        seed=args.seed,
        drafter=drafter,
        tree=tree,
        verifier=verifier,
        rows=1 if mesh is None else mesh.shape["data"],
    )
    if mesh is not None:
        out = _gathered(out)
    if jax.process_index() == 0:
        report(loaded, out, run, comp, "speculative" if drafter else "autoregressive")
    return 0


def cmd_demo(args) -> int:
    """Speculative vs autoregressive decoding, side by side, on a shared reference target:
    SmolLM2-135M-Instruct with a shipped drafter (default: the EAGLE-style one, the faster
    feature drafter in experiments/results/bench.md; or the mdc, or the n-gram tables with the
    text lookup), or stories260K drafted by llama2xs-279K
    (--pair stories). Each side is compiled, then timed --rounds times in turn; the medians are
    compared."""
    import specjax
    from specjax.paths import (
        LLAMA2XS,
        SMOLLM2,
        SMOLLM2_EAGLE,
        SMOLLM2_MDC,
        SMOLLM2_NGRAM,
        STORIES260K,
        repo_dir,
        shared_path,
    )

    if args.rounds < 1:
        raise SystemExit(f"error: --rounds must be at least 1, got {args.rounds}")
    sampling = specjax.SamplingConfig(temperature=args.temperature)
    if args.pair == "stories" and args.drafter is not None:
        raise SystemExit("error: --drafter picks SmolLM2's drafter; --pair stories drafts with "
                         "llama2xs-279K")  # fmt: skip
    if args.pair == "stories":
        loaded = specjax.load(shared_path(STORIES260K))
        drafter = specjax.LMDrafter(specjax.load(shared_path(LLAMA2XS)).model)
        prompt = args.prompt or "Once upon a time"
        ids = loaded.tokenizer.encode(prompt, bos=True)
        tree = _drafter_spec().parse_tree(args.tree) if args.tree else None
        label = "speculative, llama2xs-279K drafting for stories260K"
    else:
        loaded = specjax.load(shared_path(SMOLLM2))
        drafter_name = {"eagle": SMOLLM2_EAGLE, "mdc": SMOLLM2_MDC, "ngram": SMOLLM2_NGRAM}[
            args.drafter or "eagle"
        ]
        drafter_dir = repo_dir() / drafter_name
        drafter = specjax.load_drafter(drafter_dir, loaded.model)
        prompt = args.prompt or "Explain in a few sentences why the sky is blue."
        ids = _encode_prompt(loaded, prompt, chat=True)
        tree = _drafter_spec().tree_for(str(drafter_dir), args.tree) if args.tree else None
        label = f"speculative, {drafter_name} drafting for SmolLM2-135M-Instruct"
    common = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, seed=0)
    calls = [
        _generation_call(loaded, ids, **common),
        _generation_call(loaded, ids, drafter=drafter, tree=tree, **common),
    ]
    # First calls: compile (and, for the default tree, measure this machine's costs once).
    (ar, _), (sd, sd_first) = [_timed(fn, *a, **kw) for fn, a, kw in calls]
    calls[1] = _replaying(calls[1], sd)  # the timed runs make the first call's choice
    ar_run, sd_run = _median_times(calls, args.rounds)
    report(loaded, sd, sd_run, max(sd_first - sd_run, 0.0), label)
    if sampling.greedy:
        outputs = f"identical to autoregressive output: {bool((ar.tokens == sd.tokens).all())}"
    else:  # draws differ call by call; what is kept is the distribution
        outputs = "sampled: the same distribution as autoregressive decoding, other draws"
    print(
        f"[median of {args.rounds} runs each: autoregressive {ar_run:.3f}s, speculative "
        f"{sd_run:.3f}s, speedup {ar_run / sd_run:.2f}x; {outputs}]",
        file=sys.stderr,
    )
    return 0


def cmd_train_drafter(args) -> int:
    """Distill the target's answers, train a feature drafter, save it with its card."""
    from pathlib import Path

    import specjax
    from specjax.train.data import DistillConfig
    from specjax.train.pipeline import DrafterRecipe, train_drafter
    from specjax.train.trainer import TrainConfig

    loaded = specjax.load(args.target)
    if loaded.tokenizer is None:
        raise ValueError(f"{args.target}: the target needs a tokenizer to write training answers")
    from specjax.models.drafter import DrafterConfig
    from specjax.models.precision import training_products

    fusion = tuple(int(i) for i in args.fusion_layers.split(",")) if args.fusion_layers else ()
    # Checked now, not after the distillation: a bad layer index names itself at once.
    DrafterConfig(
        kind=args.kind, target=loaded.model.config, draft_vocab_size=1, fusion_layers=fusion
    )
    data_kind = "chat" if loaded.tokenizer.chat_template else "story"
    # Chat targets answer generated user turns: MT-bench and the EAGLE question files are
    # evaluation data, never training prompts, and turns that resemble them are skipped.
    chat = dict(
        synthetic_prompts=args.prompts, prompt_style=args.prompt_style, skip_evaluation_like=True
    )
    distill = DistillConfig(
        kind=data_kind,
        temperatures=tuple(float(t) for t in args.temperatures.split(",")),
        max_new_tokens=args.answer_tokens,
        batch=args.distill_batch,
        **(chat if data_kind == "chat" else {}),
    )
    recipe = DrafterRecipe(
        kind=args.kind,
        data_kind=data_kind,
        distill=distill,
        train=TrainConfig(
            steps=args.steps,
            batch=args.batch,
            levels=args.levels,
            lr=args.lr,
            feature_weight=args.feature_weight,
            products=training_products(args.products),
        ),
        draft_vocab=args.draft_vocab,
        fusion_layers=fusion,
    )
    data_dir = args.data or str(Path(args.out).parent / f"{Path(args.target).stem}-distill")
    train_drafter(args.target, recipe, args.out, data_dir=data_dir, eval_n=args.eval_n)
    print(Path(args.out, "CARD.md").read_text())
    return 0


def cmd_bench(args) -> int:
    """Spec-Bench-style benchmark (specjax.bench): tables and plots under experiments/results."""
    from specjax.bench import run_from_args

    return run_from_args(args, command="specjax " + " ".join(sys.argv[1:]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specjax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a continuation of a prompt")
    gen.add_argument("--model", required=True, help="llama2.c .bin, .gguf, or HF directory")
    gen.add_argument("--tokenizer", default=None, help="tokenizer file if not next to the model")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument(
        "--drafter",
        default=None,
        help="draft model PATH (same vocabulary), a trained drafter DIR (specjax train-drafter, "
        "e.g. checkpoints/smollm2-mdc), n-gram tables DIR (e.g. checkpoints/smollm2-ngram), "
        "self:K (target's first K layers) or lookup[:K] (the row's own text: prompt-lookup "
        "decoding, matches of up to K tokens, nothing to load)",
    )
    gen.add_argument(
        "--tree",
        default=None,
        help="draft tree N,DEPTH,TOPK (default: chosen for this hardware, SpecConfig.auto()); "
        "for a trained drafter N,DEPTH,TOPK,TEXT adds a chain of TEXT nodes drafted from the "
        "row's own text",
    )
    gen.add_argument(
        "--exit-heads",
        default=None,
        help="exit-heads DIR (e.g. checkpoints/smollm2-hispec): its verify exit screens each "
        "tree and the layers above it run on the exit's path only (HiSpec; needs --tree)",
    )
    gen.add_argument(
        "--mesh",
        default=None,
        help="DATAxMODEL device mesh, e.g. 1x8 or 2x4: weights split over MODEL chips, the "
        "prompt repeated over DATA rows (row 0 is printed)",
    )
    gen.add_argument(
        "--coordinator",
        default=None,
        help="HOST:PORT of process 0, for several hosts (with --num-processes, --process-id), "
        "or 'auto' on Cloud TPU / SLURM / Open MPI, where jax.distributed finds them",
    )
    gen.add_argument("--num-processes", type=int, default=None, help="processes (hosts) in all")
    gen.add_argument("--process-id", type=int, default=None, help="this process, 0-based")
    gen.set_defaults(func=cmd_generate)
    demo = sub.add_parser(
        "demo", help="speculative vs plain decoding with a shipped drafter (SmolLM2 or stories)"
    )
    demo.add_argument("--pair", choices=("smollm2", "stories"), default="smollm2")
    demo.add_argument(
        "--drafter",
        choices=("eagle", "mdc", "ngram"),
        default=None,
        help="SmolLM2's shipped drafter: EAGLE-style (eagle, the default), hidden-state (mdc) "
        "or n-gram tables with the search of the row's own text (ngram)",
    )
    demo.add_argument("--rounds", type=int, default=3, help="timed runs of each side")
    demo.add_argument("--prompt", default=None)
    demo.add_argument("--max-new-tokens", type=int, default=128)
    demo.add_argument("--temperature", type=float, default=0.0)
    demo.add_argument(
        "--tree",
        default=None,
        help="draft tree N,DEPTH,TOPK[,TEXT] (default: chosen for this hardware)",
    )
    demo.set_defaults(func=cmd_demo)
    trn = sub.add_parser(
        "train-drafter",
        help="train a hidden-state (mdc) or EAGLE-style drafter for a target by self-distillation",
    )
    trn.add_argument("--target", required=True, help="the target checkpoint")
    trn.add_argument("--kind", choices=("mdc", "eagle"), default="mdc")
    trn.add_argument("--out", required=True, help="directory for the drafter (orbax + card)")
    trn.add_argument("--data", default=None, help="distillation cache (default: beside --out)")
    trn.add_argument("--steps", type=int, default=1500)
    trn.add_argument("--batch", type=int, default=8, help="sequences per step")
    trn.add_argument("--levels", type=int, default=3, help="unrolled draft steps in training")
    trn.add_argument("--lr", type=float, default=1e-3)
    trn.add_argument(
        "--feature-weight",
        type=float,
        default=0.1,
        help="weight of the hidden-state regression (EAGLE-3's training-time test drops it: 0)",
    )
    trn.add_argument(
        "--fusion-layers",
        default="",
        help="lower target layers fused into the drafter's input, e.g. 2,15 (EAGLE-3)",
    )
    trn.add_argument(
        "--products",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="the drafter's products in training: bfloat16 operands with float32 accumulation "
        "(auto: where the CPU has AMX; steps ~1.9x faster, tau ~1%% lower at equal steps) or "
        "float32",
    )
    trn.add_argument("--draft-vocab", type=int, default=8192, help="compressed draft vocabulary")
    trn.add_argument(
        "--prompts", type=int, default=320, help="chat targets: generated user turns answered"
    )
    trn.add_argument(
        "--prompt-style",
        choices=("basic", "broad", "tasks"),
        default="broad",
        help="chat targets: the user turns' generator (basic: everyday requests, "
        "specjax.train.prompts; broad: multi-part requests in eight families; tasks: "
        "translation, summaries, questions on a passage, word problems)",
    )
    trn.add_argument("--temperatures", default="0,0.7,1", help="one answer per prompt for each")
    trn.add_argument("--answer-tokens", type=int, default=256, help="max new tokens per answer")
    trn.add_argument("--distill-batch", type=int, default=32)
    trn.add_argument("--eval-n", type=int, default=10, help="held-out prompts for the card's tau")
    trn.set_defaults(func=cmd_train_drafter)
    from specjax.bench import add_arguments as add_bench_arguments

    bench = sub.add_parser(
        "bench",
        help="Spec-Bench-style benchmark vs autoregressive decoding and transformers",
    )
    add_bench_arguments(bench, default_out="experiments/results/bench.md")
    bench.set_defaults(func=cmd_bench)
    return parser


# Commands whose wait is mostly compilation: a later run reads the compiled programs back.
_COMPILE_CACHED = ("generate", "demo")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in _COMPILE_CACHED:
        from specjax.compile_cache import enable_compilation_cache

        enable_compilation_cache()
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
