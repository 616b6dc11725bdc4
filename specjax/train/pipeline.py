"""From a target checkpoint to a shipped drafter: distill, train, save, measure, write the card.

`train_drafter` is what `specjax train-drafter` and experiments/train_drafters.py run.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from specjax.config import SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters.loading import load_drafter
from specjax.models.drafter import DrafterConfig, DrafterNet, target_parts
from specjax.train.checkpoint import load_drafter_net, read_header, save_drafter, write_card
from specjax.train.data import (
    DistillConfig,
    build_dataset,
    draft_vocabulary,
    drop_evaluation_like,
    load_dataset,
)
from specjax.train.trainer import TrainConfig, feature_scale, train

# The tree every card's tau is measured with: 31 draft nodes, depth 6, top-8 expansion.
CARD_TREE = TreeConfig.dynamic(31, 6, 8)


def eval_prompts(loaded, kind: str, n: int) -> tuple[str, list[list[int]]]:
    """Held-out prompts: MT-bench first turns (chat) or TinyStories dev prefixes (story)."""
    from specjax.datasets import (
        encode_question,
        read_spec_bench,
        select_questions,
        tinystories_prompts,
    )

    if kind == "chat":
        qs = select_questions(read_spec_bench("mt_bench_question.jsonl"), n)
        return f"{len(qs)} MT-bench first turns", [
            encode_question(loaded.tokenizer, q.turns[0]) for q in qs
        ]
    return f"{n} TinyStories dev prefixes", tinystories_prompts(loaded.tokenizer, n)


def measure_tau(
    target,
    drafter,
    prompts,
    *,
    tree: TreeConfig = CARD_TREE,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    eos_id=None,
    batch: int = 8,
) -> dict:
    """Mean tau (tokens per target call) over prompts, decoded `batch` rows at a time ("tau"; the
    per-prompt values in "taus"), plus the steps by accepted draft tokens ("accepted_hist" [P],
    P = tree depth + 1) and the reuse statistics, summed over rows, where the run reports them."""
    import specjax

    taus, extra = [], {}
    for i in range(0, len(prompts), batch):
        out = specjax.speculative_generate(
            target,
            drafter,
            prompts[i : i + batch],
            max_new_tokens=max_new_tokens,
            config=SpecConfig(tree=tree),
            sampling=SamplingConfig(temperature=temperature),
            key=jax.random.key(i),
            eos_id=eos_id,
        )
        taus += np.asarray(out.stats["tau"]).tolist()
        if "accepted_hist" in out.stats:
            hist = np.asarray(out.stats["accepted_hist"]).sum(axis=0)
            extra["accepted_hist"] = extra.get("accepted_hist", 0) + hist
        for k in ("drafted", "reused", "chain_calls", "target_calls"):
            if k in out.stats:
                extra[k] = extra.get(k, 0) + int(np.sum(out.stats[k]))
    return {"tau": float(np.mean(taus)), "taus": taus, "n": len(taus), **extra}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrafterRecipe:
    """Everything that determines a shipped drafter."""

    kind: str  # mdc | eagle
    data_kind: str  # chat | story
    distill: DistillConfig
    train: TrainConfig
    draft_vocab: int = 8192
    path_tokens: int = 1  # mdc: path tokens injected at the readout (see DrafterConfig)
    # Lower target layers fused into the drafter's input besides the last (see DrafterConfig);
    # the distillation features then hold their hidden states too.
    fusion_layers: tuple[int, ...] = ()
    # Train on the first this many distillation shards only (None: all of them). A fixed count
    # keeps a recipe reproducible while its committed answer set keeps growing.
    max_shards: int | None = None
    # Committed answer sets trained on as well: (name, first n shards), resolved to feature
    # directories by the caller (experiments/train_drafters.py).
    extra_sets: tuple[tuple[str, int], ...] = ()
    # Leave out the answers to prompts that resemble evaluation questions (specjax.train.
    # evaluation_like); off in the recipes trained before the resemblance was found.
    drop_evaluation_like: bool = False


def train_drafter(
    target_path: str | Path,
    recipe: DrafterRecipe,
    out_dir: str | Path,
    *,
    data_dir: str | Path,
    extra_data: dict[str, tuple[Path, int | None]] | None = None,
    answers_dir: str | Path | None = None,
    eval_n: int = 10,
    reproduce: str | None = None,
    calibrate: bool = True,
    data_fusion_layers: tuple[int, ...] | None = None,
    init_from: str | Path | None = None,
    log=print,
) -> Path:
    """Distill (resumable, shared between kinds through data_dir), train, save to out_dir, measure
    tau on held-out prompts and write CARD.md. Returns out_dir.

    extra_data: name -> (directory of further distillation shards, already built, e.g. from
    committed answers; how many of its first shards to use, None: all), trained on together
    with the recipe's own data; the card names them. reproduce: the card's command line
    (default: experiments/train_drafters.py --only <out_dir's name>).
    answers_dir: where the recipe's own answers are kept token-only (committable), so that a
    fresh checkout rebuilds their features teacher-forced instead of generating them again.
    calibrate: measure the acceptance profile SpecConfig.auto() reads (minutes for SmolLM2;
    comparisons of training variants can skip it). data_fusion_layers: the fusion layers the
    feature directories hold (default: the recipe's); a drafter without fusion can train on
    fused features, so that the variants of a comparison share one feature cache.
    init_from: a drafter directory whose weights the training starts from instead of a fresh
    initialisation (a continuation with its own schedule, on the recipe's data or on other
    data); it keeps that drafter's draft vocabulary, and its config must be the one this recipe
    gives, else ValueError before training."""
    stored = recipe.fusion_layers if data_fusion_layers is None else tuple(data_fusion_layers)
    if recipe.fusion_layers not in ((), stored):
        raise ValueError(
            f"the recipe fuses layers {recipe.fusion_layers}, the features hold {stored}"
        )
    if init_from is not None:
        read_header(init_from)  # a wrong folder names itself before the distillation
    import specjax

    t_start = time.perf_counter()
    loaded = specjax.load(target_path)
    target = loaded.model
    name = Path(target_path).stem
    log(f"[train-drafter] distilling {name} answers into {data_dir}")
    build_dataset(
        loaded,
        data_dir,
        recipe.distill,
        source=str(target_path),
        answers_dir=answers_dir,
        max_shards=recipe.max_shards,
        fusion_layers=stored,
    )
    extra_data = extra_data or {}
    data = load_dataset((data_dir, recipe.max_shards), *extra_data.values())
    dropped = 0
    if recipe.drop_evaluation_like:
        data, dropped = drop_evaluation_like(data, loaded.tokenizer.decode)
        log(f"[train-drafter] {dropped} answers to evaluation-like prompts left out")
    log(
        f"[train-drafter] {len(data.lengths)} sequences, {data.answer_tokens} answer tokens, "
        f"width {data.tokens.shape[1]}"
    )
    eos = loaded.tokenizer.eos_id if loaded.tokenizer else None
    vocab = choose_draft_vocab(data, recipe.draft_vocab, target.config.vocab_size, eos, init_from)
    cfg = DrafterConfig(
        kind=recipe.kind,
        target=target.config,
        draft_vocab_size=len(vocab),
        path_tokens=recipe.path_tokens,
        fusion_layers=recipe.fusion_layers,
    )
    net = DrafterNet(
        cfg,
        vocab,
        rngs=nnx.Rngs(recipe.train.seed),
        target=target,
        input_scale=feature_scale(data),
    )
    if init_from is not None:
        start_from(net, init_from)
    # Progress saved beside the output every 10 minutes: a stopped run started again with the
    # same command continues from there (specjax.train.resume).
    resume_dir = Path(out_dir).with_name(Path(out_dir).name + ".resume")
    summary = train(
        net,
        target_parts(target, net.draft_vocab[...]),
        data,
        recipe.train,
        log=log,
        resume_dir=resume_dir,
        run_id="" if init_from is None else f"init_from={Path(init_from).resolve()}",
    )
    save_drafter(net, out_dir, target_name=name, target=target)
    shutil.rmtree(resume_dir, ignore_errors=True)
    log(f"[train-drafter] saved to {out_dir}; measuring tau")
    drafter = load_drafter(out_dir, target)
    what, prompts = eval_prompts(loaded, recipe.data_kind, eval_n)
    greedy = measure_tau(target, drafter, prompts, eos_id=eos)
    coverage = _coverage(data, vocab)
    prompt_sets = _prompt_sets(recipe.distill)
    card = {
        "target": f"{name} ({_shared_relative(target_path)})",
        "kind": recipe.kind
        + (f" (readout injects {recipe.path_tokens} path tokens)" if recipe.path_tokens > 1 else "")
        + (
            f", fusing the hidden states after layers {', '.join(map(str, recipe.fusion_layers))}"
            f" into the last one's"
            if recipe.fusion_layers
            else ""
        ),
        "data": (
            f"{len(data.lengths)} target-written answers ({data.answer_tokens} tokens) to "
            f"{prompt_sets} at temperatures {recipe.distill.temperatures}, "
            f"<= {recipe.distill.max_new_tokens} new tokens each"
            + (f", plus the answer sets {_extra_sets(extra_data)}" if extra_data else "")
            + (
                f"; {dropped} answers to prompts resembling evaluation questions left out "
                "(specjax.train.evaluation_like)"
                if recipe.drop_evaluation_like
                else ""
            )
        ),
        "draft vocabulary": (
            f"{len(vocab)} most frequent answer tokens (cover {coverage:.1%} of answer tokens)"
            if init_from is None
            else f"{len(vocab)} tokens, those of the drafter it continues (cover {coverage:.1%} "
            "of these answer tokens)"
        ),
        "training": (
            f"{summary['steps']} steps x {recipe.train.batch} sequences, {recipe.train.levels} "
            f"unrolled levels, lr {recipe.train.lr}, {summary['answer_tokens_seen']} answer "
            f"tokens seen, {summary['wall_s'] / 60:.1f} min on {jax.default_backend()}"
            + (
                ", products in bfloat16 with float32 accumulation"
                if recipe.train.products == "bfloat16"
                else ""
            )
        ),
        "final train metrics": ", ".join(f"{k} {v:.3f}" for k, v in summary["final"].items()),
        "measured tau": _tau_line(greedy["tau"], what),
        "reproduce": reproduce
        or f"python experiments/train_drafters.py --only {Path(out_dir).name}",
        "total wall time": f"{(time.perf_counter() - t_start) / 60:.1f} min",
    }
    write_card(out_dir, card)
    if not calibrate:
        return Path(out_dir)
    log(f"[train-drafter] tau {greedy['tau']:.2f}; card written; calibrating acceptance")
    from specjax.calibration import (
        calibrate_drafter,
        calibration_prompts,
        write_checkpoint_profiles,
    )

    calib, description = calibration_prompts(recipe.data_kind, target, loaded.tokenizer)
    profiles = calibrate_drafter(target, drafter, calib, description=description, eos_id=eos)
    write_checkpoint_profiles(out_dir, profiles)
    return Path(out_dir)


def choose_draft_vocab(data, size: int, vocab_size: int, eos_id, init_from=None) -> np.ndarray:
    """The draft vocabulary int32 [U]: the `size` most frequent answer tokens of data (EOS
    always in), or, for a continuation (init_from), the vocabulary of the drafter it continues,
    whatever data it trains on now."""
    if init_from is not None:
        return np.asarray(load_drafter_net(init_from).draft_vocab[...])
    return draft_vocabulary(data, size, vocab_size, () if eos_id is None else (eos_id,))


def start_from(net: DrafterNet, path: str | Path) -> None:
    """Set net's weights to those of the drafter saved at path (its config and draft vocabulary
    must equal net's: a continuation trains the same drafter further, so train_drafter builds
    net with the saved vocabulary). One widening is allowed: an mdc net injecting more path
    tokens than the saved one keeps its own initialisation of the extra ancestors' weights,
    which starts at zero (DrafterNet), so it starts as the saved drafter."""
    saved = load_drafter_net(path)
    widened = saved.config.path_tokens >= 2 and net.config.path_tokens > saved.config.path_tokens
    path_tokens = saved.config.path_tokens if widened else net.config.path_tokens
    if saved.config != dataclasses.replace(net.config, path_tokens=path_tokens):
        raise ValueError(
            f"--init-from {path}: its drafter config differs from the recipe's "
            f"({saved.config} against {net.config})"
        )
    if not np.array_equal(np.asarray(saved.draft_vocab[...]), np.asarray(net.draft_vocab[...])):
        raise ValueError(
            f"--init-from {path}: its draft vocabulary is not the one net was built with; "
            "build net with the saved drafter's vocabulary"
        )
    nnx.update(net, nnx.state(saved, nnx.Param))


def _prompt_sets(cfg) -> str:
    """The card's words for the prompts a DistillConfig answers."""
    if cfg.kind == "story":
        return "TinyStories train prefixes"
    parts = [f"EAGLE {'/'.join(cfg.sets)} first turns"] if cfg.sets else []
    if cfg.synthetic_prompts:
        module = {"basic": "prompts", "broad": "broad_prompts", "tasks": "task_prompts",
                  "self": "self_prompts"}[cfg.prompt_style]  # fmt: skip
        skipped = (
            ", those resembling evaluation questions skipped" if cfg.skip_evaluation_like else ""
        )
        parts.append(
            f"{cfg.synthetic_prompts} generated chat prompts (specjax.train.{module}{skipped})"
        )
    return " and ".join(parts)


def _extra_sets(extra_data: dict) -> str:
    """The card's words for the extra answer sets: "a (first 24 shards), b"."""
    return ", ".join(
        name + ("" if n is None else f" (first {n} shards)") for name, (_, n) in extra_data.items()
    )


def _coverage(data, vocab: np.ndarray) -> float:
    return float(np.isin(data.answer_ids(), vocab).mean())


def _shared_relative(path) -> str:
    """$SPECJAX_SHARED/models/... for a path under the shared folder (cards carry no machine
    paths), else the path as given."""
    from specjax.paths import shared_dir

    try:
        return "$SPECJAX_SHARED/" + str(Path(path).resolve().relative_to(shared_dir().resolve()))
    except ValueError:
        return str(path)


def remeasure_card(
    target_path: str | Path, recipe: DrafterRecipe, out_dir: str | Path, *, eval_n=10
):
    """Measure a saved drafter's tau again with the current drafting defaults (e.g. after a
    change of the reuse settings) and rewrite the "measured tau" line of its CARD.md."""
    import specjax

    loaded = specjax.load(target_path)
    eos = loaded.tokenizer.eos_id if loaded.tokenizer else None
    drafter = load_drafter(out_dir, loaded.model, pre_verifier=False)  # the card: unpruned tree
    what, prompts = eval_prompts(loaded, recipe.data_kind, eval_n)
    greedy = measure_tau(loaded.model, drafter, prompts, eos_id=eos)
    card = Path(out_dir) / "CARD.md"
    lines = card.read_text().splitlines()
    fields = dict(line[2:].split(": ", 1) for line in lines if line.startswith("- "))
    fields["measured tau"] = _tau_line(greedy["tau"], what)
    write_card(out_dir, fields)
    return greedy["tau"]


def _tau_line(tau: float, what: str) -> str:
    """The card's "measured tau" value."""
    return (
        f"{tau:.2f} (greedy, {what}, 128 new tokens, tree of {CARD_TREE.num_nodes - 1} nodes "
        f"depth {CARD_TREE.max_depth} top-{CARD_TREE.topk})"
    )
