"""Training HiSpec's exit heads (specjax.models.exit_head) by distillation, and their checkpoints.

Axis letters: R rows (sequences), T tokens, P positions (flattened), M model dim, U exit vocab,
V target vocab.

Data: teacher-forced passes of the frozen target over held-in sequences record, at every counted
position, the residual stream entering each candidate exit layer, the last layer's output (before
the final norm: the teacher) and the target's next token (argmax over the full vocabulary). An
exit head is then trained with optax AdamW on the cross-entropy between the target's
distribution over the exit vocabulary and the head's; the exits read no other positions, so
training works on a flat bag of positions.

Layout of an exit-heads directory (checkpoints/<target>-hispec):
    hispec.json    {"format": "specjax-exit-heads", "version", "exits": {"draft": {"layer",
                    "kind"}, "verify": {...}}, "vocab_size", "dtype", "target_name",
                    "target_fingerprint"}
    params/        orbax StandardCheckpointer tree {"draft": params, "verify": params,
                   "vocab": [U] int32}
    CARD.md        per-exit agreement with the last layer, data, training time
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from specjax.cache import init_cache
from specjax.models.drafter import TargetParts, target_parts
from specjax.models.exit_head import ExitHead
from specjax.models.layers import rms_norm
from specjax.tree import causal_mask

FORMAT = "specjax-exit-heads"
VERSION = 1
ROLES = ("draft", "verify")


@dataclasses.dataclass(frozen=True)
class ExitData:
    """Counted positions of teacher-forced sequences, flattened.

    hidden {layer: [P, M] float16}: the residual stream entering that layer; teacher [P, M]
    float16: the last layer's output before the final norm; target_next [P] int32: the target's
    argmax over the full vocabulary (what an exit must agree with)."""

    hidden: dict
    teacher: np.ndarray
    target_next: np.ndarray

    @property
    def size(self) -> int:
        return len(self.target_next)


@jax.jit
def _full_argmax(final_norm, head, teacher, eps):
    h = rms_norm(teacher.astype(jnp.float32), final_norm, eps)
    return jnp.argmax(h @ head, axis=-1).astype(jnp.int32)


def teacher_forced(target, wanted: Sequence[int], dtype=jnp.float16):
    """(forward, params): forward(params, ids [B, T]) -> {i: [B, T, M] `dtype`} the residual
    stream entering each layer i in `wanted` (L: the last layer's output before the final norm)
    of a causal pass over the block, jitted (one program per shape)."""
    cfg = target.config
    graphdef, params = nnx.split(target)

    @jax.jit
    def forward(params, ids):
        b, t = ids.shape
        out = nnx.merge(graphdef, params)(
            ids,
            positions=jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
            cache=init_cache(cfg, b, t),
            tree_mask=causal_mask(b, t),
            return_hidden=tuple(wanted),
            compute_logits=False,
        )
        return {i: out.hidden[i].astype(dtype) for i in wanted}

    return forward, params


def collect(
    target,
    rows: Sequence[Sequence[int]],
    starts: Sequence[int],
    layers: Sequence[int],
    *,
    batch: int = 8,
    width_multiple: int = 64,
    progress: Callable[[str], None] | None = None,
) -> ExitData:
    """Teacher-forced passes over `rows` (token id lists); positions [starts[i], len(rows[i]))
    of row i are counted (for answers: from the last prompt token, whose prediction is the first
    answer token). layers: the candidate exit layers (0 < E < L)."""
    cfg = target.config
    layers = tuple(sorted(set(int(x) for x in layers)))
    if not layers or layers[0] < 1 or layers[-1] >= cfg.n_layers:
        raise ValueError(f"exit layers must lie in [1, {cfg.n_layers - 1}], got {layers}")
    wanted = (*layers, cfg.n_layers)
    forward, params = teacher_forced(target, wanted)

    head = (target.embed[...].T if cfg.tie_embeddings else target.lm_head[...]).astype(jnp.float32)
    hidden: dict = {i: [] for i in wanted}
    order = np.argsort([len(r) for r in rows], kind="stable")  # similar widths per batch
    t0 = time.perf_counter()
    for n_done, i in enumerate(range(0, len(order), batch)):
        chunk = order[i : i + batch]
        width = -(-max(len(rows[j]) for j in chunk) // width_multiple) * width_multiple
        ids = np.zeros((batch, width), np.int32)  # a fixed batch: one program per width
        for r, j in enumerate(chunk):
            ids[r, : len(rows[j])] = rows[j]
        out = {k: np.asarray(v) for k, v in forward(params, jnp.asarray(ids)).items()}
        for r, j in enumerate(chunk):
            for k in wanted:
                hidden[k].append(out[k][r, starts[j] : len(rows[j])])
        if progress is not None and (n_done % 10 == 0 or i + batch >= len(order)):
            progress(f"teacher-forced {min(i + batch, len(order))}/{len(order)} sequences "
                     f"({time.perf_counter() - t0:.0f}s)")  # fmt: skip
    flat = {k: np.concatenate(v) for k, v in hidden.items()}
    teacher = flat.pop(cfg.n_layers)
    nexts = [
        np.asarray(
            _full_argmax(
                target.final_norm[...], head, jnp.asarray(teacher[i : i + 4096]), cfg.norm_eps
            )
        )  # fmt: skip
        for i in range(0, len(teacher), 4096)
    ]
    return ExitData(flat, teacher, np.concatenate(nexts))


def _teacher_logits(parts: TargetParts, teacher: jax.Array, eps: float) -> jax.Array:
    h = rms_norm(teacher.astype(jnp.float32), parts.final_norm, eps)
    return h @ parts.head_u.astype(jnp.float32)


def distill_loss(head: ExitHead, parts: TargetParts, x, teacher) -> jax.Array:
    """Mean cross-entropy between the target's distribution over the exit vocabulary and the
    head's, x / teacher [P, M]."""
    p = jax.nn.softmax(_teacher_logits(parts, teacher, head.eps), axis=-1)
    logq = jax.nn.log_softmax(head(x.astype(jnp.float32), parts), axis=-1)
    return -jnp.mean(jnp.sum(p * logq, axis=-1))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExitTrainConfig:
    """steps of `batch` positions; lr peaks after `warmup` steps (at most a quarter of the run,
    so that a short run still decays), then follows a cosine."""

    steps: int = 1000
    batch: int = 512  # positions per step
    lr: float = 1e-3
    warmup: int = 50
    seed: int = 0

    def __post_init__(self):
        if self.steps < 1 or self.batch < 1 or self.warmup < 0:
            raise ValueError(
                f"steps and batch must be >= 1 and warmup >= 0, got steps {self.steps}, "
                f"batch {self.batch}, warmup {self.warmup}"
            )

    @property
    def warmup_steps(self) -> int:
        return min(self.warmup, self.steps // 4)


def train_exit_head(
    head: ExitHead,
    parts: TargetParts,
    data: ExitData,
    cfg: ExitTrainConfig,
    *,
    log: Callable[[str], None] | None = print,
) -> list[float]:
    """Train `head` in place on data.hidden[head.layer]; returns the loss every 50 steps."""
    if head.kind == "identity":
        return []
    x_all, t_all = data.hidden[head.layer], data.teacher
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, cfg.warmup_steps, cfg.steps)
    opt = nnx.Optimizer(head, optax.adamw(schedule, weight_decay=0.0), wrt=nnx.Param)

    @nnx.jit
    def step(head, opt, parts, x, t):
        loss, grads = nnx.value_and_grad(lambda h: distill_loss(h, parts, x, t))(head)
        opt.update(head, grads)
        return loss

    rng = np.random.default_rng(cfg.seed)
    losses, t0 = [], time.perf_counter()
    for s in range(cfg.steps):
        idx = rng.integers(0, data.size, cfg.batch)
        loss = step(head, opt, parts, jnp.asarray(x_all[idx]), jnp.asarray(t_all[idx]))
        if s % 50 == 0 or s == cfg.steps - 1:
            losses.append(float(loss))
            if log is not None and s % 250 == 0:
                log(f"  layer {head.layer} {head.kind}: step {s}/{cfg.steps} loss "
                    f"{losses[-1]:.3f} ({time.perf_counter() - t0:.0f}s)")  # fmt: skip
    return losses


def agreement(head: ExitHead, parts: TargetParts, data: ExitData, batch: int = 4096) -> float:
    """Top-1 agreement with the target: the share of positions where the exit's argmax over its
    vocabulary is the target's argmax over the full vocabulary."""
    vocab = head.vocab[...]

    @nnx.jit
    def pick(head, parts, x):
        return vocab[jnp.argmax(head(x.astype(jnp.float32), parts), axis=-1)]

    x, hits = data.hidden[head.layer], 0
    for i in range(0, data.size, batch):
        chosen = np.asarray(pick(head, parts, jnp.asarray(x[i : i + batch])))
        hits += int(np.sum(chosen == data.target_next[i : i + batch]))
    return hits / max(data.size, 1)


def exit_parts(target, vocab: np.ndarray) -> TargetParts:
    """The target's final norm and LM head restricted to the exit vocabulary."""
    return target_parts(target, jnp.asarray(vocab, jnp.int32))


# -- checkpoints ---------------------------------------------------------------------------------


def save_exit_heads(
    heads: dict,
    out_dir: str | Path,
    *,
    target,
    target_name: str,
    dtype: str = "bfloat16",
) -> Path:
    """Write {"draft": ExitHead, "verify": ExitHead} (same exit vocabulary) to out_dir. The
    three-level settings an existing hispec.json names ("settings": draft_len, buffer, written
    after measuring them with experiments/hispec.py) are kept until measured again."""
    from specjax.train.checkpoint import target_fingerprint

    if set(heads) != set(ROLES):
        raise ValueError(f"expected heads for {ROLES}, got {sorted(heads)}")
    vocab = np.asarray(heads["draft"].vocab[...])
    if not np.array_equal(vocab, np.asarray(heads["verify"].vocab[...])):
        raise ValueError("the draft and verify exits must share one exit vocabulary")
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    tree = {"vocab": vocab}
    for role, head in heads.items():
        params = nnx.to_pure_dict(nnx.state(head, nnx.Param))
        tree[role] = jax.tree.map(lambda x: np.asarray(jnp.asarray(x, dtype)), params)
    import orbax.checkpoint as ocp  # imported on use: it is slow to import

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(out_dir / "params", tree, force=True)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "exits": {r: {"layer": h.layer, "kind": h.kind} for r, h in heads.items()},
        "vocab_size": len(vocab),
        "dtype": dtype,
        "target_name": target_name,
        "target_fingerprint": target_fingerprint(target),
    }
    old = out_dir / "hispec.json"
    if old.exists():
        try:
            settings = json.loads(old.read_text()).get("settings")
        except ValueError:
            settings = None
        if settings:
            header["settings"] = settings
    (out_dir / "hispec.json").write_text(json.dumps(header, indent=2) + "\n")
    return out_dir


def load_exit_heads(path: str | Path, target) -> dict:
    """{"draft": ExitHead, "verify": ExitHead} from an exit-heads directory, checked against
    `target` (ValueError naming the path for a bad header, another target, or damaged params)."""
    from specjax.train.checkpoint import target_fingerprint

    path = Path(path).resolve()
    try:
        header = json.loads((path / "hispec.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: no readable hispec.json ({e})") from e
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: not an exit-heads directory (format {header.get('format')!r})")
    if header.get("target_fingerprint") != target_fingerprint(target):
        raise ValueError(
            f"{path}: these exit heads were trained for another target "
            f"({header.get('target_name') or 'unnamed'}); train them for this one with "
            "experiments/train_exit_heads.py"
        )
    missing = [k for k in ("exits", "vocab_size", "dtype") if k not in header]
    missing += [f"exits.{r}" for r in ROLES if r not in header.get("exits", {})]
    if missing:
        raise ValueError(
            f"{path / 'hispec.json'}: missing {missing}: copy the directory again or train the "
            "exit heads with experiments/train_exit_heads.py"
        )
    cfg = target.config
    vocab = np.zeros((int(header["vocab_size"]),), np.int32)

    def build(spec):
        return ExitHead(cfg.d_model, layer=spec["layer"], kind=spec["kind"], vocab=vocab,
                        eps=cfg.norm_eps, rngs=nnx.Rngs(0))  # fmt: skip

    heads = {r: build(header["exits"][r]) for r in ROLES}
    dtype = jnp.dtype(header["dtype"])
    abstract = {"vocab": jax.ShapeDtypeStruct(vocab.shape, jnp.int32)}
    for r, h in heads.items():
        abstract[r] = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype),
                                   nnx.to_pure_dict(nnx.state(h, nnx.Param)))  # fmt: skip
    import orbax.checkpoint as ocp

    try:
        with ocp.StandardCheckpointer() as ckptr:
            tree = ckptr.restore(path / "params", abstract)
    except Exception as e:  # orbax / tensorstore raise many types for damaged files
        raise ValueError(
            f"{path / 'params'}: could not be restored ({type(e).__name__}: {e}); copy the "
            "directory again or train the exit heads with experiments/train_exit_heads.py"
        ) from e
    for r, h in heads.items():
        state = nnx.state(h, nnx.Param)
        nnx.replace_by_pure_dict(state, jax.tree.map(lambda x: jnp.asarray(x, jnp.float32),
                                                     tree[r]))  # fmt: skip
        nnx.update(h, state)
        h.vocab.set_value(jnp.asarray(tree["vocab"], jnp.int32))
    return heads
