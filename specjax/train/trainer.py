"""Training a feature drafter by self-distillation: losses, a jitted optax step, the loop.

Axis letters: B batch, T tokens, M model dim, U draft vocab.

Loss (per unrolled level k = 0..levels-1, weighted level_decay ** k, averaged over answer
positions that have a root at j - k):

    cross-entropy(target distribution over the draft vocabulary, drafter logits)
    + feature_weight * SmoothL1((predicted hidden - target hidden) / feature_scale)

The target distribution is the target's own softmax restricted to the draft vocabulary (its
logits on those tokens, renormalised), computed on the fly from the recorded hidden states. The
unrolled levels feed the drafter its own predictions exactly as drafting does
(specjax.models.drafter.unrolled_outputs), so training and test conditions match.

feature_noise > 0 adds uniform noise of that size (in units of the hidden states' RMS) to the
target hidden states the drafter reads, not to the ones it is scored against (as EAGLE does:
at test time the deeper levels read the drafter's own, imperfect predictions).
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
import optax
from flax import nnx
from tqdm.auto import tqdm

from specjax.models import precision
from specjax.models.drafter import (
    DrafterNet,
    TargetParts,
    path_ancestors,
    readout,
    unrolled_outputs,
)
from specjax.sharding import check_batch, check_mesh, place_rows, replicate
from specjax.train.data import Dataset, pad_width
from specjax.train.resume import load_progress, save_progress


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """steps x batch sequences; lr peaks after warmup then follows a cosine to lr / 10."""

    steps: int
    batch: int = 8
    levels: int = 3
    level_decay: float = 0.8
    feature_weight: float = 0.1
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.0
    clip: float = 1.0
    feature_noise: float = 0.0
    seed: int = 0
    # The drafter's products: "float32", or "bfloat16" operands with float32 accumulation
    # (specjax.models.precision), forward and backward; the target's teacher readout stays
    # float32. Pays where the CPU multiplies bfloat16 fast (AMX): see
    # experiments/train_step_time.py.
    products: str = "float32"

    def __post_init__(self):
        if self.steps < 1 or self.batch < 1 or self.levels < 1:
            raise ValueError("steps, batch and levels must be >= 1")
        if self.products not in ("float32", "bfloat16"):
            raise ValueError(f"products must be 'float32' or 'bfloat16', got {self.products!r}")


def smooth_l1(x: jax.Array) -> jax.Array:
    ax = jnp.abs(x)
    return jnp.where(ax < 1.0, 0.5 * x * x, ax - 0.5)


def drafter_loss(
    net: DrafterNet, parts: TargetParts, batch: dict, cfg: TrainConfig, scale, key=None
):
    """(loss, metrics) for a batch {tokens [B, T], feats [B, T, M], lengths [B],
    prompt_lens [B]} (plus fusion_feats [B, T, F, M], the hidden states of the drafter's
    config.fusion_layers, for a drafter that fuses lower layers; optionally scored [A] /
    scored_mask [A] from scored_positions, which compute the readouts at the answer positions
    only, and window [B, W] from answer_window(..., cfg.levels), which runs every unrolled
    level's queries on each row's answer, the cfg.levels positions before it and up to 63 more
    of rounding only: each the same loss, less work); metrics: per-level top-1
    agreement with the target ("acc{k}"). key: the feature noise's randomness (needed when
    cfg.feature_noise > 0)."""
    tokens, feats = batch["tokens"], batch["feats"].astype(jnp.float32)
    inputs = net.read_features(hidden_states(net, batch))
    if cfg.feature_noise > 0:
        if key is None:
            raise ValueError("feature_noise > 0 needs a key")
        noise = jax.random.uniform(key, feats.shape, minval=-1.0, maxval=1.0)
        inputs = inputs + cfg.feature_noise * scale * noise
    b, t = tokens.shape
    eps = net.config.target.norm_eps
    if "scored" in batch:
        # Readouts only where the loss is taken: the LM-head products over the draft vocabulary
        # dominate a step, and prompts and padding are ~40% of a batch's positions.
        idx = batch["scored"]

        def pick(x):  # [B, T, ...] -> [A, ...] at the scored positions
            return x.reshape((b * t,) + x.shape[2:])[idx]

        answer, pos = batch["scored_mask"], idx % t
    else:

        def pick(x):
            return x

        pos = jnp.arange(t)[None, :]
        answer = answer_positions(batch["prompt_lens"], batch["lengths"], t)
    with precision.products_in(None):  # the teacher's distribution in float32 whatever cfg
        target_logits = readout(pick(feats), parts, eps)  # [..., U]
    target_p = jax.nn.softmax(target_logits, axis=-1)
    target_top = jnp.argmax(target_logits, axis=-1)
    emb = jnp.take(parts.embed, tokens, axis=0)
    # A node's ancestors are the tokens before its parent, at every level.
    ancestors = path_ancestors(emb, net.config.path_tokens - 1)  # [B, T, A, M] or None
    outs = unrolled_outputs(net, parts, tokens, inputs, cfg.levels, window=batch.get("window"))
    total, metrics = 0.0, {}
    for k, out in enumerate(outs):
        valid = (answer & (pos >= k)).astype(jnp.float32)
        denom = jnp.maximum(valid.sum(), 1.0)
        out = pick(out)
        logits = net.logits(parts, out, pick(emb), None if ancestors is None else pick(ancestors))
        ce = -jnp.sum(target_p * jax.nn.log_softmax(logits, axis=-1), axis=-1)
        reg = jnp.mean(smooth_l1((out - pick(feats)) / scale), axis=-1)
        level_loss = jnp.sum((ce + cfg.feature_weight * reg) * valid) / denom
        total = total + cfg.level_decay**k * level_loss
        agree = (jnp.argmax(logits, axis=-1) == target_top).astype(jnp.float32)
        metrics[f"acc{k}"] = jnp.sum(agree * valid) / denom
        metrics[f"ce{k}"] = jnp.sum(ce * valid) / denom
    metrics["loss"] = total
    return total, metrics


def answer_positions(prompt_lens, lengths, width: int):
    """[B, width] bool: the positions whose next token the target wrote (position j predicts
    token j + 1, so answer predictions start at the last prompt token). numpy or jax inputs."""
    pos = (jnp if isinstance(lengths, jax.Array) else np).arange(width)[None, :]
    return (pos >= prompt_lens[:, None] - 1) & (pos < lengths[:, None] - 1)


def scored_positions(prompt_lens: np.ndarray, lengths: np.ndarray, width: int):
    """The flat indices (into B * width) of a batch's answer positions, padded to a static size:
    (scored [A] int32, scored_mask [A] bool). A is the smallest multiple of a quarter of
    B * width that holds them, so each batch width compiles at most four programs."""
    flat = np.flatnonzero(answer_positions(prompt_lens, lengths, width))
    quarter = max(len(lengths) * width // 4, 1)
    size = max(-(-len(flat) // quarter) * quarter, quarter)
    scored = np.zeros((size,), np.int32)
    scored[: len(flat)] = flat
    return scored, np.arange(size) < len(flat)


def answer_window(prompt_lens: np.ndarray, lengths: np.ndarray, width: int, levels: int):
    """[B, W] int32: for each row, the W consecutive positions from `levels` before its answer
    (or from position 0) on, where the unrolled levels' queries are needed (unrolled_outputs'
    window). W is the widest row's need rounded up to 64 (at most width), so few widths
    compile; a row whose window would pass the batch's end starts earlier instead."""
    start = np.maximum(np.asarray(prompt_lens) - levels, 0)
    need = int(np.max(np.asarray(lengths) - start))
    w = min(pad_width(need), width)
    start = np.minimum(start, width - w)
    return (start[:, None] + np.arange(w)[None, :]).astype(np.int32)


def hidden_states(net: DrafterNet, batch: dict) -> dict:
    """{i: [B, T, M]} for every layer i the drafter reads, from a batch's feats (the last layer)
    and fusion_feats (its fusion layers, in order); ValueError if the batch lacks them."""
    cfg = net.config
    hidden = {cfg.target.n_layers: batch["feats"]}
    if cfg.fusion_layers:
        fused = batch.get("fusion_feats")
        if fused is None or fused.shape[2] != len(cfg.fusion_layers):
            have = 0 if fused is None else fused.shape[2]
            raise ValueError(
                f"this drafter fuses the target layers {cfg.fusion_layers}, but the training "
                f"data holds {have} fusion layers: build the distillation features with "
                f"fusion_layers={cfg.fusion_layers}"
            )
        hidden |= {i: fused[:, :, j] for j, i in enumerate(cfg.fusion_layers)}
    return hidden


def make_optimizer(
    cfg: TrainConfig, scaled_updates: dict[str, float] | None = None
) -> optax.GradientTransformation:
    """Clipping, then AdamW on a warmup-cosine schedule.

    scaled_updates: {param name: factor}: the updates of Params with that name are multiplied by
    the factor. An mdc readout's far-ancestor norm weight (far_norm) starts at zero beside norm
    weights that start at the input scale (the RMS of the target's hidden states; ~40 after
    training on SmolLM2), and Adam moves every weight by about lr a step whatever its scale, so
    unscaled it could not reach its siblings' size in any run we can afford (0.025 after 500
    steps at lr 5e-4): `train` scales its updates by the input scale, so it learns in those
    units."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr, cfg.warmup, max(cfg.steps, cfg.warmup + 1), end_value=cfg.lr / 10
    )
    parts = [
        optax.clip_by_global_norm(cfg.clip),
        optax.adamw(schedule, weight_decay=cfg.weight_decay),
    ]
    for name, factor in (scaled_updates or {}).items():
        parts.append(optax.masked(optax.scale(factor), functools.partial(_named, name)))
    return optax.chain(*parts)


def _named(name: str, params):
    """A bool pytree like params: True at the leaves whose path holds `name`."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: name in {getattr(k, "key", getattr(k, "name", None)) for k in path}, params
    )


@functools.partial(
    jax.jit, static_argnames=("graphdef", "optimizer", "cfg"), donate_argnames=("params", "opt")
)
def train_step(
    graphdef, params, rest, opt, parts, batch, scale, key, *, optimizer, cfg: TrainConfig
):
    """One optax step on the drafter's Params; returns (params, opt, metrics)."""

    def loss(p):
        net = nnx.merge(graphdef, p, rest)
        return drafter_loss(net, parts, batch, cfg, scale, key)

    with precision.products_in(jnp.dtype(cfg.products)):
        grads, metrics = jax.grad(loss, has_aux=True)(params)
    updates, opt = optimizer.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, metrics


def feature_scale(data: Dataset, sample: int = 64) -> float:
    """RMS of the recorded hidden states (the regression's unit)."""
    f = data.feats[:sample].astype(np.float32)
    mask = np.arange(f.shape[1])[None, :] < data.lengths[:sample, None]
    return float(np.sqrt(np.mean(f[mask] ** 2)))


def batch_rows(lengths: np.ndarray, max_width: int, batch: int, seed: int):
    """Endless (rows [batch] sorted, width) of shuffled batches of whole sequences of similar
    length, the width the longest in the batch rounded up to 64 (at most max_width): little
    padding, few distinct widths, so few compilations.

    Each epoch: a random permutation, sorted by length within windows of 16 batches, cut into
    batches, and the batches shuffled."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    window = 16 * batch
    while True:
        perm = rng.permutation(n)
        for w in range(0, n, window):
            chunk = perm[w : w + window]
            perm[w : w + window] = chunk[np.argsort(lengths[chunk], kind="stable")]
        starts = rng.permutation(np.arange(0, n - batch + 1, batch))
        for i in starts:
            idx = np.sort(perm[i : i + batch])
            yield idx, min(pad_width(int(lengths[idx].max())), max_width)


def batches(data: Dataset, batch: int, seed: int, levels: int | None = None):
    """Endless training batches of data (rows and widths from batch_rows), with the scored
    answer positions (scored_positions) and, given the unrolled levels, the answer windows
    (answer_window) where they are narrower than the batch."""
    for idx, width in batch_rows(data.lengths, data.tokens.shape[1], batch, seed):
        out = {
            "tokens": data.tokens[idx, :width],
            "feats": data.feats[idx, :width],
            "lengths": data.lengths[idx],
            "prompt_lens": data.prompt_lens[idx],
        }
        if data.fusion_feats is not None:
            out["fusion_feats"] = data.fusion_feats[idx, :width]
        out["scored"], out["scored_mask"] = scored_positions(
            out["prompt_lens"], out["lengths"], width
        )
        if levels is not None:
            window = answer_window(out["prompt_lens"], out["lengths"], width, levels)
            if window.shape[1] < width:  # a window as wide as the batch would only add a gather
                out["window"] = window
        yield out


def train(
    net: DrafterNet,
    parts: TargetParts,
    data: Dataset,
    cfg: TrainConfig,
    log=print,
    *,
    mesh=None,
    resume_dir: str | Path | None = None,
    save_every_s: float = 600.0,
    run_id: str = "",
):
    """Train net in place; returns a summary dict (steps, wall seconds, tokens seen, last
    metrics). Shows a progress bar with the loss, level-0 agreement and tokens/s.

    resume_dir: where the run's progress is saved every save_every_s seconds
    (specjax.train.resume); a run started again with the same folder, settings and data
    continues from the last save, with the same batches and noise as an unbroken run (the
    stream and the per-step keys depend only on the seed and the step). None: no saves.
    run_id: what else sets the run apart (e.g. the weights it started from), so that a saved
    state is resumed only by the same run.

    mesh: data-parallel training on a ('data', 'model') mesh (specjax.make_mesh): the drafter,
    its optimizer state and the target parts are replicated, every batch's rows are split over
    'data'; the loss is the mean over the whole batch, so XLA all-reduces the gradients to their
    average across devices and every replica applies the same update. cfg.batch must divide
    over 'data'."""
    if len(data.lengths) < cfg.batch:
        raise ValueError(f"{len(data.lengths)} sequences is fewer than one batch of {cfg.batch}")
    if mesh is not None:
        check_mesh(mesh)
        check_batch(cfg.batch, mesh)
    hidden_states(net, {"feats": data.feats, "fusion_feats": data.fusion_feats})  # checks
    graphdef, params, rest = nnx.split(net, nnx.Param, ...)
    input_scale = feature_scale(data)
    # far_norm (mdc, path_tokens >= 3) learns in units of the input scale (make_optimizer).
    far = {"far_norm": input_scale} if hasattr(net, "far_norm") else None
    optimizer = make_optimizer(cfg, far)
    opt = optimizer.init(params)
    start, seen, history, wall_before = 0, 0, [], 0.0
    fingerprint = json.dumps(
        [dataclasses.asdict(cfg), repr(net.config), len(data.lengths), int(data.answer_tokens)]
        + ([run_id] if run_id else [])
    )
    if resume_dir is not None:
        saved = load_progress(resume_dir, fingerprint=fingerprint, like=(params, opt))
        if saved is not None:
            info, (params, opt) = saved
            start, seen, history = info["step"], info["seen"], info["history"]
            wall_before = info["wall_s"]
            if log is not None:
                log(f"[train] resuming from step {start} of {cfg.steps} ({resume_dir})")
    if mesh is not None:
        params, rest, opt, parts = replicate((params, rest, opt, parts), mesh)
    scale = jnp.float32(input_scale)
    stream = batches(data, cfg.batch, cfg.seed, levels=cfg.levels)
    for _ in range(start):  # the batches the saved steps consumed
        next(stream)
    bar = tqdm(
        range(start, cfg.steps),
        desc=f"train {net.config.kind}",
        unit="step",
        initial=start,
        total=cfg.steps,
    )
    t0 = last_save = time.perf_counter()
    seen_before = seen
    metrics = {}
    noise_key = jax.random.key(cfg.seed)
    for step in bar:
        batch = next(stream)
        if mesh is not None:
            batch = place_rows(batch, mesh)
        params, opt, metrics = train_step(
            graphdef,
            params,
            rest,
            opt,
            parts,
            batch,
            scale,
            jax.random.fold_in(noise_key, step),
            optimizer=optimizer,
            cfg=cfg,
        )
        seen += int(np.sum(np.asarray(batch["lengths"]) - np.asarray(batch["prompt_lens"])))
        if step % 10 == 0 or step == cfg.steps - 1:
            m = {k: float(v) for k, v in metrics.items()}
            history.append({"step": step, **m})
            bar.set_postfix(
                loss=f"{m['loss']:.3f}",
                acc0=f"{m['acc0']:.3f}",
                tok_s=f"{(seen - seen_before) / (time.perf_counter() - t0):.0f}",
            )
        now = time.perf_counter()
        if resume_dir is not None and step + 1 < cfg.steps and now - last_save >= save_every_s:
            save_progress(
                resume_dir, step=step + 1, seen=seen, wall_s=wall_before + now - t0,
                history=history, fingerprint=fingerprint, state=(params, opt),
            )  # fmt: skip
            last_save = time.perf_counter()
    nnx.update(net, params)
    return {
        "steps": cfg.steps,
        "wall_s": wall_before + time.perf_counter() - t0,
        "answer_tokens_seen": seen,
        "final": {k: float(v) for k, v in metrics.items()},
        "history": history,
    }
