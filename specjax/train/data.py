"""Self-distillation data: the target writes the answers, and we record what a drafter learns from.

Axis letters: R records (sequences), T tokens, M model dim.

For every training prompt the target generates answers (greedy and sampled, stopping at EOS),
then one teacher-forced pass over prompt + answer records the target's last hidden state at every
position. A shard holds, for a batch of sequences padded to a common width:

    tokens   [R, T] int32     prompt + answer ids (0 past the end)
    feats    [R, T, M] float16  the target's last hidden state after each token (pre final norm)
    fusion_feats [R, T, F, M] float16  (only when built with fusion_layers) the hidden states
                              after those F lower layers, for drafters that fuse them
    lengths  [R] int32        prompt + answer length
    prompt_lens [R] int32     where the answer starts (the loss is taken on answer positions)

Shards are written one by one (shard_00000.npz, ...) next to a manifest.json that records the
settings; an interrupted run resumes at the first missing shard, and a directory made with other
settings is refused rather than mixed.

Generation is the expensive part (on 2 CPU cores SmolLM2 writes ~40 answer tokens/s; a
teacher-forced pass reads ~370 tokens/s), and the features are large (~1.2 KB per token), so an
answers directory can be kept apart from the features: it holds the same shards without `feats`
(a few bytes per token, small enough to commit). build_dataset(..., answers_dir=...) writes each
new shard's answers there too, and fills a missing feature shard from an existing answer shard by
one teacher-forced pass instead of generating again. That is how distillation data outlives the
feature cache and grows across runs.

Prompt sets (evaluation sets are never used by default: MT-bench and every EAGLE question file
for chat targets, TinyStories dev paragraphs for story targets):
    chat:  `synthetic_prompts` generated user turns (specjax.train.prompts, broad_prompts,
           task_prompts, or turns the target writes itself: self_prompts), chat template; `sets`
           adds first turns of EAGLE's alpaca, gsm8k, humaneval and sum question files, which
           are evaluation data: only the old smollm2-chat answer set was written from them;
    story: the first 8 words of the TinyStories train-split paragraphs in the shared data folder.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from specjax.cache import init_cache
from specjax.config import SamplingConfig
from specjax.decode import generate
from specjax.paths import shared_dir
from specjax.train.evaluation_like import resembles_evaluation
from specjax.tree import causal_mask

# EAGLE question files a DistillConfig may name in `sets`: evaluation data, named only to
# rebuild the smollm2-chat answer set (experiments/distill_answers.py) that was written from
# them; no training run uses it. MT-bench and qa were never allowed.
EAGLE_QUESTION_SETS = ("alpaca", "gsm8k", "humaneval", "sum")
STORY_TRAIN_FILE = "tinystories_train_head.txt"
PROMPT_STYLES = ("basic", "broad", "tasks", "self")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """What the target writes: `temperatures` lists one answer per entry for every prompt
    (0 = greedy); answers stop at EOS or after max_new_tokens; batch rows per generate call.
    Prompts longer than max_prompt_tokens are skipped (their cost is quadratic, and the held-out
    evaluation sets have short prompts)."""

    kind: str  # "chat" | "story"
    n_prompts: int | None = None  # None: every prompt of the sets
    temperatures: tuple[float, ...] = (0.0, 0.8)
    max_new_tokens: int = 256
    max_prompt_tokens: int = 512  # longer prompts (long articles to summarise) are skipped
    batch: int = 32
    seed: int = 0
    sets: tuple[str, ...] = ()  # chat: EAGLE question files added (evaluation data: see above)
    synthetic_prompts: int = 0  # chat: generated user turns added (see prompt_style)
    # "basic": specjax.train.prompts (short everyday requests); "broad":
    # specjax.train.broad_prompts (multi-part requests in eight task families); "tasks":
    # specjax.train.task_prompts (translate, summarize, questions on a passage, word problems,
    # answers from given context); "self": user turns the target writes itself
    # (specjax.train.self_prompts; kept in the answers directory, which is required)
    prompt_style: str = "basic"
    # Answer order: None sorts all prompts longest first (least padding); k sorts within windows
    # of k shards only, so that the first shards of a partly answered set already cover every
    # prompt family.
    sort_window: int | None = None
    # Generated or written user turns that resemble evaluation questions
    # (specjax.train.evaluation_like) are skipped, and more drawn in their place: on for new
    # answer sets, off in the committed ones, written before the resemblance was found (their
    # drafters leave those answers out at training time instead).
    skip_evaluation_like: bool = False

    def __post_init__(self):
        if self.kind not in ("chat", "story"):
            raise ValueError(f"kind must be 'chat' or 'story', got {self.kind!r}")
        if self.kind == "story" and self.synthetic_prompts:
            raise ValueError("synthetic_prompts are chat prompts; the story kind has none")
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(
                f"unknown prompt_style {self.prompt_style!r}; choose from {PROMPT_STYLES}"
            )
        unknown = set(self.sets) - set(EAGLE_QUESTION_SETS)
        if unknown:
            raise ValueError(
                f"unknown question sets {sorted(unknown)}; choose from {EAGLE_QUESTION_SETS} "
                "(the evaluation sets mt_bench and qa are never answered)"
            )
        if self.kind == "chat" and not self.sets and not self.synthetic_prompts:
            raise ValueError(
                "a chat DistillConfig with no prompts: set synthetic_prompts (generated user "
                "turns of prompt_style)"
            )


def generated_user_turns(cfg: DistillConfig, user_turns: list[str] | None = None) -> list[str]:
    """The cfg.synthetic_prompts user turns of cfg.prompt_style (plain text): generated with
    cfg.seed, or the first of the written user_turns for "self" (all of them where fewer were
    written: _user_turns writes as many as the shards asked for need). With
    skip_evaluation_like, turns that resemble evaluation questions are left out and later ones
    take their place: the first synthetic_prompts clean turns of a longer draw, or of the
    written turns."""
    from specjax.train.broad_prompts import broad_prompts
    from specjax.train.prompts import synthetic_prompts
    from specjax.train.task_prompts import task_prompts

    def clean(texts: list[str]) -> list[str]:
        if not cfg.skip_evaluation_like:
            return texts
        return [t for t in texts if not resembles_evaluation(t)]

    n = cfg.synthetic_prompts
    if cfg.prompt_style == "self":
        if user_turns is None:
            raise ValueError('prompt_style "self" needs the written user_turns')
        return clean(user_turns)[:n]
    make = {"broad": broad_prompts, "tasks": task_prompts}.get(cfg.prompt_style, synthetic_prompts)
    draw = n
    while True:
        texts = clean(make(draw, seed=cfg.seed))
        if len(texts) >= n:
            return texts[:n]
        if draw >= 8 * n:  # a generator that yields almost nothing clean is a broken generator
            raise ValueError(
                f"prompt_style {cfg.prompt_style!r}: only {len(texts)} of {draw} generated "
                f"turns do not resemble evaluation questions, {n} asked for"
            )
        draw *= 2


def training_prompts(
    tokenizer, cfg: DistillConfig, user_turns: list[str] | None = None
) -> list[list[int]]:
    """Prompt ids for distillation (see the module docstring for the sets). user_turns: the
    written turns of prompt_style "self" (specjax.train.self_prompts), in their order."""
    from specjax.datasets import SPEC_BENCH_FILES, encode_question, read_spec_bench

    if cfg.kind == "chat":
        texts = [q.turns[0] for name in cfg.sets for q in read_spec_bench(SPEC_BENCH_FILES[name])]
        texts += generated_user_turns(cfg, user_turns)
        prompts = [encode_question(tokenizer, t) for t in texts]
    else:
        text = (shared_dir() / "data" / STORY_TRAIN_FILE).read_text(encoding="utf-8")
        paras = [p.strip() for p in text.split("\n\n") if len(p.split()) >= 12]
        prompts = [tokenizer.encode(" ".join(p.split()[:8]), bos=True) for p in paras]
    prompts = [p for p in prompts if len(p) <= cfg.max_prompt_tokens]
    return prompts[: cfg.n_prompts] if cfg.n_prompts else prompts


@functools.partial(jax.jit, static_argnames=("graphdef", "layers"))
def teacher_forced_hidden(graphdef, params, ids, layers: tuple[int, ...] = ()):
    """The target's last hidden state [B, T, M] for teacher-forced ids [B, T]; with layers,
    a tuple (last [B, T, M], lower [B, T, F, M]) whose lower holds hidden[i] for i in layers."""
    model = nnx.merge(graphdef, params)
    b, t = ids.shape
    n = model.config.n_layers
    out = model(
        ids,
        positions=jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
        cache=init_cache(model.config, b, t),
        tree_mask=causal_mask(b, t),
        return_hidden=(*layers, n),
        compute_logits=False,
    )
    if not layers:
        return out.hidden[n]
    return out.hidden[n], jnp.stack([out.hidden[i] for i in layers], axis=2)


def pad_width(n: int, multiple: int = 64) -> int:
    """n rounded up to a multiple (64 by default): the widths of answer shards and training
    batches, so few distinct shapes compile."""
    return -(-n // multiple) * multiple


def make_answers(model, prompts, *, temperature, max_new_tokens, eos_id, key) -> dict:
    """The target's answers to one batch of prompts, as an answer shard (no features):
    tokens [R, T] (prompt + answer, T a multiple of 64), lengths [R], prompt_lens [R]."""
    out = generate(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        sampling=SamplingConfig(temperature=temperature),
        key=key,
        eos_id=eos_id,
    )
    answers, n_gen = np.asarray(out.tokens), np.asarray(out.lengths)
    seqs = [list(p) + answers[i, : n_gen[i]].tolist() for i, p in enumerate(prompts)]
    lengths = np.array([len(s) for s in seqs], np.int32)
    ids = np.zeros((len(seqs), pad_width(int(lengths.max()))), np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    return {
        "tokens": ids,
        "lengths": lengths,
        "prompt_lens": np.array([len(p) for p in prompts], np.int32),
    }


def add_features(model, answers: dict, batch: int = 8, fusion_layers: tuple[int, ...] = ()):
    """An answer shard plus feats [R, T, M] float16: the target's last hidden state after every
    token, from teacher-forced passes of `batch` rows (and fusion_feats [R, T, F, M], the hidden
    states after each of fusion_layers, when given). Positions past a row's length hold 0."""
    graphdef, params = nnx.split(model)
    tokens, lengths = answers["tokens"], answers["lengths"]
    m, f = model.config.d_model, len(fusion_layers)
    feats = np.zeros(tokens.shape + (m,), np.float32)
    lower = np.zeros(tokens.shape + (f, m), np.float32) if f else None
    for i in range(0, len(tokens), batch):
        rows = tokens[i : i + batch]
        width = pad_width(int(lengths[i : i + batch].max()))
        pad = np.zeros((batch, width), np.int32)  # a fixed batch: one compiled program a width
        pad[: len(rows)] = rows[:, :width]
        out = teacher_forced_hidden(graphdef, params, jnp.asarray(pad), tuple(fusion_layers))
        last = np.asarray(out[0] if f else out)
        feats[i : i + len(rows), :width] = last[: len(rows)]
        if f:
            lower[i : i + len(rows), :width] = np.asarray(out[1])[: len(rows)]
    mask = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    shard = {**answers}
    for name, x in (("feats", feats), ("fusion_feats", lower)):
        if x is None:
            continue
        x *= mask.reshape(mask.shape + (1,) * (x.ndim - 2))
        if not np.isfinite(x).all() or np.abs(x).max() > 6e4:
            raise ValueError("target hidden states overflow float16; store them in float32")
        shard[name] = x.astype(np.float16)
    return shard


def _data_settings(config: dict) -> dict:
    """A manifest's DistillConfig less the fields that do not change its data (story prompts
    read no question files: story manifests were written with the old chat default of `sets`)."""
    return {k: v for k, v in config.items() if not (k == "sets" and config["kind"] == "story")}


def read_answer_settings(directory: str | Path) -> DistillConfig:
    """The DistillConfig an answers (or features) directory's manifest.json records; fields
    added since it was written read as their defaults, as _check_manifest reads them."""
    config = json.loads((Path(directory) / "manifest.json").read_text())["config"]
    return DistillConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})


def _check_manifest(directory: Path, manifest: dict) -> None:
    """Write directory/manifest.json, refusing a directory made with other settings. A manifest
    written before a DistillConfig field existed reads as that field's default."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "manifest.json"
    if path.exists():
        old = json.loads(path.read_text())
        defaults = {
            f.name: f.default
            for f in dataclasses.fields(DistillConfig)
            if f.default is not dataclasses.MISSING
        }
        old_config = json.loads(json.dumps(defaults)) | old["config"]
        if _data_settings(old_config) != _data_settings(manifest["config"]):
            raise ValueError(
                f"{directory} holds data made with other settings ({old['config']}); "
                "use another directory or delete it"
            )
        old_source, new_source = (Path(m.get("source") or "").name for m in (old, manifest))
        if old_source and new_source and old_source != new_source:
            raise ValueError(
                f"{directory} holds data of another model ({old_source}), not {new_source}: "
                "use another directory or delete it"
            )
        if old.get("fusion_layers", []) != manifest.get("fusion_layers", []):
            raise ValueError(
                f"{directory} holds features of the fusion layers {old.get('fusion_layers', [])}"
                f", not {manifest.get('fusion_layers', [])}: use another directory or delete it"
            )
    path.write_text(json.dumps(manifest, indent=2) + "\n")


def _save(path: Path, data: dict, compressed: bool = False) -> None:
    """Write an npz atomically (a crash leaves no half-written shard behind)."""
    tmp = path.with_suffix(".tmp.npz")
    (np.savez_compressed if compressed else np.savez)(tmp, **data)
    tmp.rename(path)


def _user_turns(loaded, cfg: DistillConfig, answers_dir, max_shards) -> list[str] | None:
    """prompt_style "self": the turns the shards up to max_shards answer (whole windows of
    sort_window shards, whose order depends on every prompt in them), written now where the
    answers directory's user_turns.json lacks them; None for the other styles."""
    from specjax.train.self_prompts import TURNS_FILE, write_user_turns

    if cfg.prompt_style != "self":
        return None
    if answers_dir is None:
        raise ValueError('prompt_style "self" keeps its user turns beside the answers: give '
                         "answers_dir")  # fmt: skip
    n = cfg.synthetic_prompts
    if max_shards is not None:
        window = (cfg.sort_window or 1) * cfg.batch
        n = min(n, -(-max_shards * cfg.batch // window) * window)

    def write(count: int) -> list[str]:
        return write_user_turns(
            loaded.model, loaded.tokenizer, Path(answers_dir) / TURNS_FILE, count, seed=cfg.seed
        )

    turns = write(n)
    if cfg.skip_evaluation_like:
        # Turns that resemble evaluation questions are skipped (generated_user_turns): write
        # more in their place, so that the first n clean turns, and so every window, stay the
        # same however many shards a later call asks for.
        while (missing := n - sum(not resembles_evaluation(t) for t in turns)) > 0:
            turns = write(len(turns) + missing)
    return turns


def build_dataset(
    loaded,
    out_dir: str | Path,
    cfg: DistillConfig,
    *,
    source: str = "",
    answers_dir: str | Path | None = None,
    max_shards: int | None = None,
    fusion_layers: tuple[int, ...] = (),
) -> Path:
    """Write (or finish writing) the distillation shards of `loaded` (a specjax.Loaded) in
    out_dir. Returns out_dir. Shows a progress bar with answer tokens per second.

    answers_dir: where token-only answer shards are kept (see the module docstring): an existing
    one is turned into features teacher-forced, a new one is written after generating.
    max_shards: stop after the first this many shards (the rest come with a later call).
    fusion_layers: also store the hidden states after these target layers (fusion_feats), for
    drafters that fuse lower layers; recorded in the manifest, like the settings."""
    out_dir = Path(out_dir)
    # Through JSON, so that tuples compare equal to the lists a stored manifest holds.
    manifest = json.loads(json.dumps({"source": source, "config": dataclasses.asdict(cfg)}))
    _check_manifest(out_dir, {**manifest, "fusion_layers": list(fusion_layers)})
    if answers_dir is not None:
        answers_dir = Path(answers_dir)
        _check_manifest(answers_dir, {"source": Path(source).name, "config": manifest["config"]})
    tok = loaded.tokenizer
    prompts = training_prompts(tok, cfg, _user_turns(loaded, cfg, answers_dir, max_shards))
    # Longest prompts first within each temperature (or within windows), so shards pad little.
    window = len(prompts) if cfg.sort_window is None else cfg.sort_window * cfg.batch
    order = [
        i
        for w in range(0, len(prompts), window)
        for i in sorted(range(w, min(w + window, len(prompts))), key=lambda i: -len(prompts[i]))
    ]
    jobs = [
        (t, order[i : i + cfg.batch])
        for t in cfg.temperatures
        for i in range(0, len(order), cfg.batch)
    ][:max_shards]
    bar = tqdm(total=len(jobs), desc="distill", unit="shard")
    tokens_done = 0
    t0 = time.perf_counter()
    for shard, (temperature, idx) in enumerate(jobs):
        path = out_dir / f"shard_{shard:05d}.npz"
        kept = None if answers_dir is None else answers_dir / path.name
        if not path.exists():
            if kept is not None and kept.exists():
                answers = dict(np.load(kept))
                answers = {k: v.astype(np.int32) for k, v in answers.items()}
            else:
                answers = make_answers(
                    loaded.model,
                    [prompts[i] for i in idx],
                    temperature=temperature,
                    max_new_tokens=cfg.max_new_tokens,
                    eos_id=tok.eos_id,
                    key=jax.random.fold_in(jax.random.key(cfg.seed), shard),
                )
                if kept is not None:
                    small = loaded.model.config.vocab_size <= np.iinfo(np.uint16).max + 1
                    compact = {
                        k: v.astype(np.uint16) if k == "tokens" and small else v
                        for k, v in answers.items()
                    }
                    _save(kept, compact, compressed=True)
            _save(path, add_features(loaded.model, answers, fusion_layers=fusion_layers))
            tokens_done += int((answers["lengths"] - answers["prompt_lens"]).sum())
            bar.set_postfix(answer_tok_s=f"{tokens_done / (time.perf_counter() - t0):.0f}")
        bar.update(1)
    bar.close()
    return out_dir


@dataclasses.dataclass
class Dataset:
    """All shards of a directory, padded to one width T (a multiple of 64).

    tokens [R, T], feats [R, T, M] float16, lengths [R], prompt_lens [R]; fusion_feats
    [R, T, F, M] float16 or None (shards built without fusion_layers)."""

    tokens: np.ndarray
    feats: np.ndarray
    lengths: np.ndarray
    prompt_lens: np.ndarray
    fusion_feats: np.ndarray | None = None

    @property
    def answer_tokens(self) -> int:
        return int((self.lengths - self.prompt_lens).sum())

    def rows(self, index: np.ndarray) -> Dataset:
        """The dataset of rows `index` [R'] (every array taken along its first axis)."""

        def take(x):
            return None if x is None else x[index]

        return Dataset(
            tokens=take(self.tokens),
            feats=take(self.feats),
            lengths=take(self.lengths),
            prompt_lens=take(self.prompt_lens),
            fusion_feats=take(self.fusion_feats),
        )

    def answer_ids(self) -> np.ndarray:
        """The ids of every answer token (the target's writing, prompts excluded), flat."""
        pos = np.arange(self.tokens.shape[1])[None, :]
        answer = (pos >= self.prompt_lens[:, None]) & (pos < self.lengths[:, None])
        return self.tokens[answer]


def load_dataset(
    *data_dirs: str | Path | tuple[str | Path, int | None], max_shards: int | None = None
) -> Dataset:
    """The shards of one or more distillation directories (the first max_shards of each, or
    all), as one Dataset. A (directory, n) pair takes that directory's first n shards instead
    (n None: all of them); fewer than n shards is an error."""
    shards = []
    for entry in data_dirs:
        d, n = entry if isinstance(entry, tuple) else (entry, max_shards)
        done = [s for s in sorted(Path(d).glob("shard_*.npz")) if not s.name.endswith(".tmp.npz")]
        if isinstance(entry, tuple) and n is not None and len(done) < n:
            raise ValueError(f"{d}: {len(done)} distillation shards, {n} asked for")
        shards += done[:n]
    if not shards:
        raise ValueError(f"{data_dirs}: no distillation shards (run build_dataset first)")
    parts = [dict(np.load(s)) for s in shards]
    fused = {p["fusion_feats"].shape[2] if "fusion_feats" in p else 0 for p in parts}
    if len(fused) > 1:
        raise ValueError(
            f"{data_dirs}: some shards hold fusion layers and some do not (or other counts): "
            "build every directory with the same fusion_layers"
        )
    n_fused = fused.pop()
    width = max(p["tokens"].shape[1] for p in parts)
    m = parts[0]["feats"].shape[2]
    rows = sum(p["tokens"].shape[0] for p in parts)
    tokens = np.zeros((rows, width), np.int32)
    feats = np.zeros((rows, width, m), np.float16)
    lower = np.zeros((rows, width, n_fused, m), np.float16) if n_fused else None
    r = 0
    for p in parts:
        n, w = p["tokens"].shape
        tokens[r : r + n, :w] = p["tokens"]
        feats[r : r + n, :w] = p["feats"]
        if lower is not None:
            lower[r : r + n, :w] = p["fusion_feats"]
        r += n
    return Dataset(
        tokens=tokens,
        feats=feats,
        lengths=np.concatenate([p["lengths"] for p in parts]),
        prompt_lens=np.concatenate([p["prompt_lens"] for p in parts]),
        fusion_feats=lower,
    )


def draft_vocabulary(data: Dataset, size: int, vocab_size: int, must_have=()) -> np.ndarray:
    """The `size` most frequent answer tokens (ties toward lower ids), plus `must_have` ids (e.g.
    EOS), sorted. Returns int32 [U] with U = min(size, vocab_size)."""
    size = min(size, vocab_size)
    counts = np.bincount(data.answer_ids(), minlength=vocab_size).astype(np.float64)
    counts[list(must_have)] = np.inf
    chosen = np.argsort(-counts, kind="stable")[:size]
    return np.sort(chosen).astype(np.int32)


def drop_evaluation_like(data: Dataset, decode: Callable[[list[int]], str]) -> tuple[Dataset, int]:
    """(data without the rows whose prompt resembles an evaluation question
    (specjax.train.evaluation_like), rows dropped): the rows are found by the text of their
    prompts, so committed answers and their cached features serve unchanged.
    decode: the target tokenizer's ids -> text, applied to each row's prompt tokens."""
    prompts = (data.tokens[r, : data.prompt_lens[r]].tolist() for r in range(len(data.lengths)))
    keep = np.array([not resembles_evaluation(decode(p)) for p in prompts], bool)
    return data.rows(np.flatnonzero(keep)), int((~keep).sum())
