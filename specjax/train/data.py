"""Self-distillation data: the target writes the answers, and we record what a drafter learns from.

Axis letters: R records (sequences), T tokens, M model dim.

For every training prompt the target generates answers (greedy and sampled, stopping at EOS),
then one teacher-forced pass over prompt + answer records the target's last hidden state at every
position. A shard holds, for a batch of sequences padded to a common width:

    tokens   [R, T] int32     prompt + answer ids (0 past the end)
    feats    [R, T, M] float16  the target's last hidden state after each token (pre final norm)
    lengths  [R] int32        prompt + answer length
    prompt_lens [R] int32     where the answer starts (the loss is taken on answer positions)

Shards are written one by one (shard_00000.npz, ...) next to a manifest.json that records the
settings; an interrupted run resumes at the first missing shard, and a directory made with other
settings is refused rather than mixed.

Prompt sets (held-out sets are never used here: MT-bench and EAGLE's qa set for chat targets,
TinyStories dev paragraphs for story targets):
    chat:  first turns of EAGLE's alpaca, gsm8k, humaneval and sum question files, chat template;
    story: the first 8 words of the TinyStories train-split paragraphs in the shared data folder.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
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
from specjax.tree import causal_mask

CHAT_TRAIN_SETS = ("alpaca", "gsm8k", "humaneval", "sum")
STORY_TRAIN_FILE = "tinystories_train_head.txt"


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

    def __post_init__(self):
        if self.kind not in ("chat", "story"):
            raise ValueError(f"kind must be 'chat' or 'story', got {self.kind!r}")


def training_prompts(tokenizer, cfg: DistillConfig) -> list[list[int]]:
    """Prompt ids for distillation (see the module docstring for the sets)."""
    from specjax.bench import SPEC_BENCH_FILES, encode_question, read_spec_bench

    if cfg.kind == "chat":
        texts = [
            q.turns[0] for name in CHAT_TRAIN_SETS for q in read_spec_bench(SPEC_BENCH_FILES[name])
        ]
        prompts = [encode_question(tokenizer, t) for t in texts]
    else:
        text = (shared_dir() / "data" / STORY_TRAIN_FILE).read_text(encoding="utf-8")
        paras = [p.strip() for p in text.split("\n\n") if len(p.split()) >= 12]
        prompts = [tokenizer.encode(" ".join(p.split()[:8]), bos=True) for p in paras]
    prompts = [p for p in prompts if len(p) <= cfg.max_prompt_tokens]
    return prompts[: cfg.n_prompts] if cfg.n_prompts else prompts


@functools.partial(jax.jit, static_argnames=("graphdef",))
def teacher_forced_hidden(graphdef, params, ids):
    """The target's last hidden state [B, T, M] for teacher-forced ids [B, T]."""
    model = nnx.merge(graphdef, params)
    b, t = ids.shape
    out = model(
        ids,
        positions=jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
        cache=init_cache(model.config, b, t),
        tree_mask=causal_mask(b, t),
        return_hidden=(model.config.n_layers,),
        compute_logits=False,
    )
    return out.hidden[model.config.n_layers]


def _pad_width(n: int, multiple: int = 64) -> int:
    return -(-n // multiple) * multiple


def make_shard(model, prompts, *, temperature, max_new_tokens, eos_id, key) -> dict:
    """Answers for one batch of prompts and the target's features over prompt + answer."""
    sampling = SamplingConfig(temperature=temperature)
    out = generate(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        key=key,
        eos_id=eos_id,
        record_hidden=True,
    )
    answers, n_gen = np.asarray(out.tokens), np.asarray(out.lengths)
    prompt_hidden, answer_hidden = (
        np.asarray(out.stats["prompt_hidden"]),
        np.asarray(out.stats["hidden"]),
    )
    seqs = [list(p) + answers[i, : n_gen[i]].tolist() for i, p in enumerate(prompts)]
    lengths = np.array([len(s) for s in seqs], np.int32)
    width = _pad_width(int(lengths.max()))
    ids = np.zeros((len(seqs), width), np.int32)
    feats = np.zeros((len(seqs), width, prompt_hidden.shape[-1]), np.float32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        n_prompt = len(prompts[i])
        # Hidden states recorded while decoding (the same numbers a speculative run sees); the
        # last answer token was never read and keeps 0 (no loss is taken there).
        feats[i, :n_prompt] = prompt_hidden[i, :n_prompt]
        feats[i, n_prompt : len(s)] = answer_hidden[i, : n_gen[i]]
    if not np.isfinite(feats).all() or np.abs(feats).max() > 6e4:
        raise ValueError("target hidden states overflow float16; store them in float32")
    return {
        "tokens": ids,
        "feats": feats.astype(np.float16),
        "lengths": lengths,
        "prompt_lens": np.array([len(p) for p in prompts], np.int32),
    }


def build_dataset(loaded, out_dir: str | Path, cfg: DistillConfig, *, source: str = "") -> Path:
    """Write (or finish writing) the distillation shards of `loaded` (a specjax.Loaded) in
    out_dir. Returns out_dir. Shows a progress bar with answer tokens per second."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Through JSON, so that tuples compare equal to the lists a stored manifest holds.
    manifest = json.loads(json.dumps({"source": source, "config": dataclasses.asdict(cfg)}))
    manifest_path = out_dir / "manifest.json"
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        if old["config"] != manifest["config"]:
            raise ValueError(
                f"{out_dir} holds data made with other settings ({old['config']}); "
                "use another directory or delete it"
            )
    manifest_path.write_text(json.dumps(manifest, indent=2))
    tok = loaded.tokenizer
    prompts = training_prompts(tok, cfg)
    # Longest prompts first within each temperature, so shards pad little.
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    jobs = [
        (t, order[i : i + cfg.batch])
        for t in cfg.temperatures
        for i in range(0, len(order), cfg.batch)
    ]
    bar = tqdm(total=len(jobs), desc="distill", unit="shard")
    tokens_done = 0
    t0 = time.perf_counter()
    for shard, (temperature, idx) in enumerate(jobs):
        path = out_dir / f"shard_{shard:05d}.npz"
        if not path.exists():
            data = make_shard(
                loaded.model,
                [prompts[i] for i in idx],
                temperature=temperature,
                max_new_tokens=cfg.max_new_tokens,
                eos_id=tok.eos_id,
                key=jax.random.fold_in(jax.random.key(cfg.seed), shard),
            )
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, **data)
            tmp.rename(path)
            tokens_done += int((data["lengths"] - data["prompt_lens"]).sum())
            bar.set_postfix(answer_tok_s=f"{tokens_done / (time.perf_counter() - t0):.0f}")
        bar.update(1)
    bar.close()
    return out_dir


@dataclasses.dataclass
class Dataset:
    """All shards of a directory, padded to one width T (a multiple of 64).

    tokens [R, T], feats [R, T, M] float16, lengths [R], prompt_lens [R]."""

    tokens: np.ndarray
    feats: np.ndarray
    lengths: np.ndarray
    prompt_lens: np.ndarray

    @property
    def answer_tokens(self) -> int:
        return int((self.lengths - self.prompt_lens).sum())

    def answer_ids(self) -> np.ndarray:
        """The ids of every answer token (the target's writing, prompts excluded), flat."""
        pos = np.arange(self.tokens.shape[1])[None, :]
        answer = (pos >= self.prompt_lens[:, None]) & (pos < self.lengths[:, None])
        return self.tokens[answer]


def load_dataset(data_dir: str | Path) -> Dataset:
    shards = sorted(Path(data_dir).glob("shard_*.npz"))
    shards = [s for s in shards if not s.name.endswith(".tmp.npz")]
    if not shards:
        raise ValueError(f"{data_dir}: no distillation shards (run build_dataset first)")
    parts = [dict(np.load(s)) for s in shards]
    width = max(p["tokens"].shape[1] for p in parts)
    m = parts[0]["feats"].shape[2]
    rows = sum(p["tokens"].shape[0] for p in parts)
    tokens = np.zeros((rows, width), np.int32)
    feats = np.zeros((rows, width, m), np.float16)
    r = 0
    for p in parts:
        n, w = p["tokens"].shape
        tokens[r : r + n, :w] = p["tokens"]
        feats[r : r + n, :w] = p["feats"]
        r += n
    return Dataset(
        tokens=tokens,
        feats=feats,
        lengths=np.concatenate([p["lengths"] for p in parts]),
        prompt_lens=np.concatenate([p["prompt_lens"] for p in parts]),
    )


def draft_vocabulary(data: Dataset, size: int, vocab_size: int, must_have=()) -> np.ndarray:
    """The `size` most frequent answer tokens (ties toward lower ids), plus `must_have` ids (e.g.
    EOS), sorted. Returns int32 [U] with U = min(size, vocab_size)."""
    size = min(size, vocab_size)
    counts = np.bincount(data.answer_ids(), minlength=vocab_size).astype(np.float64)
    counts[list(must_have)] = np.inf
    chosen = np.argsort(-counts, kind="stable")[:size]
    return np.sort(chosen).astype(np.int32)
