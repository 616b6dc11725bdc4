"""PACER-style pre-verifier: a small trained network that predicts, for every drafted node, the
probability that the target accepts it given that it accepts the node's parent.

Axis letters: B batch, N tree nodes, S = len(NODE_STATS) drafting statistics, F features,
H hidden width.

It reads only what the drafter knew when it drafted the node (DraftTree.node_stats: the node's
draft log-probability and cumulative log-probability, the parent distribution's top-1
log-probability and entropy, the node's rank among its siblings, its depth), so one network
shape serves every drafter kind (draft model, self-draft, HiSpec's draft exit, eagle, mdc); each
drafter gets its own trained weights. The product of these probabilities along a path predicts
that the whole path is accepted; the engine keeps the nodes whose predicted path probability
reaches the threshold for the tree's size (`keep_logp`) and verifies the smallest static node
bucket that holds them (specjax.pre_verify). It decides only how much is drafted and
verified, never what is accepted: the output distribution is the target's whatever it predicts.

Network: SpecDec++'s acceptance head shape (residual blocks x + SiLU(Wx) between an input and an
output projection) over the features below.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.tree import NODE_STATS

RANKS = 4  # rank one-hot: 0, 1, 2, 3 or more
FORMAT = "specjax-pre-verifier"
VERSION = 1
FOLDER = "pre_verifier"  # inside a drafter's checkpoint directory
REPLAY = "replay.npz"  # recorded steps in FOLDER (specjax.pre_verifier_replay)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreVerifierConfig:
    """hidden: width H; blocks: residual blocks; max_depth: depth one-hot size (deeper nodes
    share the last slot); threshold: keep a node when its predicted path probability is at
    least this (0: keep everything); block: drafting checks whether to go on after every
    `block` levels (PACER's block size b); buckets: the static node counts verification may
    run on (() -> default_buckets of the tree's node count); costs: ((n, seconds), ...) the
    target's measured cost of verifying n nodes (specjax.autotune's t(N)): when given, each step
    verifies the bucket with the most expected tokens per second over the batch, keeping the
    nodes most likely to be accepted (above the threshold); () -> the smallest bucket that holds
    every node above the threshold. budget_thresholds: ((n, threshold), ...) the threshold that
    replayed best when pruning a dynamic tree of n draft nodes (train_pre_verifier.py); a tree of
    N draft nodes uses the entry with the largest n <= N (the smallest n's entry when none is),
    because one threshold cannot suit every budget: a large tree keeps many unlikely nodes at a
    threshold that suits a small one. () -> `threshold` for every tree."""

    hidden: int = 32
    blocks: int = 2
    max_depth: int = 8
    threshold: float = 0.3
    block: int = 1
    buckets: tuple[int, ...] = ()
    costs: tuple[tuple[int, float], ...] = ()
    budget_thresholds: tuple[tuple[int, float], ...] = ()

    def __post_init__(self):
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"pre-verifier threshold must be in [0, 1), got {self.threshold}")
        for n, t in self.budget_thresholds:
            if n < 1 or not 0.0 <= t < 1.0:
                raise ValueError(
                    "pre-verifier budget_thresholds need n >= 1 and a threshold in [0, 1), "
                    f"got ({n}, {t})"
                )
        budgets = [n for n, _ in self.budget_thresholds]
        if len(set(budgets)) != len(budgets):
            raise ValueError(f"pre-verifier budget_thresholds repeat a budget: {budgets}")
        if self.block < 1 or self.hidden < 1 or self.max_depth < 1:
            raise ValueError("pre-verifier hidden, max_depth and block must be >= 1")
        if any(b < 1 for b in self.buckets):
            raise ValueError(f"pre-verifier buckets must be >= 1, got {self.buckets}")

    @property
    def feature_dim(self) -> int:
        return 6 + RANKS + self.max_depth


def features(stats: jax.Array, max_depth: int) -> jax.Array:
    """[..., S] NODE_STATS -> [..., F] network input (scaled to order one; depth and rank as
    one-hots, the probabilities themselves next to their logs)."""
    col = {name: stats[..., i] for i, name in enumerate(NODE_STATS)}
    logq, cum, top1 = col["logq"], col["cum_logq"], col["parent_top1_logq"]
    rank = jnp.clip(col["rank"].astype(jnp.int32), 0, RANKS - 1)
    depth = jnp.clip(col["depth"].astype(jnp.int32) - 1, 0, max_depth - 1)
    dense = jnp.stack(
        [logq / 4, jnp.exp(logq), cum / 8, top1 / 4, jnp.exp(top1), col["parent_entropy"] / 4],
        axis=-1,
    )
    one_hots = [jax.nn.one_hot(rank, RANKS), jax.nn.one_hot(depth, max_depth)]
    return jnp.concatenate([dense] + one_hots, axis=-1)


class Threshold(nnx.Variable):
    """The keep threshold, as log probability: a traced value (not trained), so that trying
    another threshold does not recompile the speculative loop."""


class PreVerifier(nnx.Module):
    """P(node accepted | parent accepted) from the node's drafting statistics.

    The network shape, max_depth, block, buckets and the per-budget thresholds are static (part
    of the compiled program); the single threshold is a Threshold variable (set_threshold).

    thresholds_source says where the thresholds come from: "trained" (chosen under the costs of
    the machine it was trained on), "this machine" (chosen again from replay_file under this
    machine's costs: specjax.pre_verifier_local) or "set" (by the caller, never replaced).
    replay_file: the recorded steps kept beside a loaded checkpoint, or None."""

    replay_file: str | None = None
    thresholds_source: str = "trained"

    def __init__(self, config: PreVerifierConfig = PreVerifierConfig(), *, rngs: nnx.Rngs):
        self.shape = dataclasses.replace(config, threshold=0.0)  # static part of the config
        h = config.hidden
        self.proj_in = nnx.Linear(config.feature_dim, h, rngs=rngs)
        self.blocks = nnx.List([nnx.Linear(h, h, rngs=rngs) for _ in range(config.blocks)])
        self.proj_out = nnx.Linear(h, 1, rngs=rngs)
        self.threshold_logp = Threshold(jnp.float32(0.0))
        self._store_threshold(config.threshold)

    @property
    def config(self) -> PreVerifierConfig:
        """The full config, with the current threshold."""
        t = float(np.exp(np.asarray(self.threshold_logp[...])))
        return dataclasses.replace(self.shape, threshold=round(t, 6))

    def set_threshold(self, threshold: float) -> None:
        """Keep nodes whose predicted path probability is at least `threshold` (in [0, 1)), at
        every tree size: it replaces the trained per-budget thresholds, if any."""
        self._store_threshold(threshold)
        if self.shape.budget_thresholds:
            self.shape = dataclasses.replace(self.shape, budget_thresholds=())
        self.thresholds_source = "set"

    def use_thresholds(self, threshold: float, budget_thresholds: dict, source: str) -> None:
        """Replace the single threshold and the per-budget table ({draft nodes: threshold})."""
        table = tuple(sorted((int(n), float(t)) for n, t in budget_thresholds.items()))
        PreVerifierConfig(threshold=threshold, budget_thresholds=table)  # validates
        self.shape = dataclasses.replace(self.shape, budget_thresholds=table)
        self._store_threshold(threshold)
        self.thresholds_source = source

    def _store_threshold(self, threshold: float) -> None:
        PreVerifierConfig(threshold=threshold)  # validates
        value = np.log(threshold) if threshold > 0 else -np.inf
        self.threshold_logp.set_value(jnp.float32(value))

    def threshold_for(self, draft_nodes: int) -> float:
        """The keep threshold for a tree of `draft_nodes` nodes (root excluded)."""
        table = sorted(self.shape.budget_thresholds)
        if not table:
            return self.config.threshold
        fitting = [t for n, t in table if n <= draft_nodes]
        return fitting[-1] if fitting else table[0][1]

    def prunes(self, num_nodes: int) -> bool:
        """Whether a tree of num_nodes nodes (root included) may be pruned at all: False where
        the trained table keeps every node (threshold 0, a budget whose replay found no pruning
        faster than the whole tree), so that the tree is drafted and verified whole, without the
        pre-verifier's work. Static; a traced threshold (no table) always may prune."""
        return not self.shape.budget_thresholds or self.threshold_for(num_nodes - 1) > 0

    def keep_logp(self, num_nodes: int) -> jax.Array:
        """The log keep threshold on predicted path probabilities for a tree of num_nodes nodes
        (root included; static): the traced threshold_logp, or the trained one for that budget."""
        if not self.shape.budget_thresholds:
            return self.threshold_logp[...]
        t = self.threshold_for(num_nodes - 1)
        return jnp.float32(np.log(t) if t > 0 else -np.inf)

    def logits(self, stats: jax.Array) -> jax.Array:
        """stats [..., S] -> [...] logit of P(accepted | parent accepted)."""
        x = self.proj_in(features(stats.astype(jnp.float32), self.shape.max_depth))
        for layer in self.blocks:
            x = x + jax.nn.silu(layer(x))
        return self.proj_out(x)[..., 0]

    def node_logp(self, stats: jax.Array) -> jax.Array:
        """stats [..., S] -> [...] log P(accepted | parent accepted) (<= 0)."""
        return jax.nn.log_sigmoid(self.logits(stats))

    def with_settings(self, **changes) -> PreVerifier:
        """A copy with the same weights and other settings (threshold, block, buckets). A new
        threshold applies to every tree: it drops the trained budget_thresholds unless they are
        given too."""
        fields = {"threshold", "block", "buckets", "costs", "budget_thresholds"}
        if not set(changes) <= fields:
            raise ValueError(f"only {sorted(fields)} can change on a trained pre-verifier")
        if "threshold" in changes:
            changes.setdefault("budget_thresholds", ())
        config = dataclasses.replace(self.config, **changes)  # validates
        copy = nnx.clone(self)  # its own variables: the original keeps its threshold
        copy.shape = dataclasses.replace(config, threshold=0.0)
        copy._store_threshold(config.threshold)
        if {"threshold", "budget_thresholds"} & set(changes):
            copy.thresholds_source = "set"
        return copy


def save_pre_verifier(pv: PreVerifier, folder: str | Path, *, card: dict | None = None) -> Path:
    """Write pv to folder (pre_verifier.json + orbax params/); card: measured figures kept in
    the header (calibration, AUC)."""
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    params = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(pv, nnx.Param)))
    import orbax.checkpoint as ocp  # imported on use: it is slow to import

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(folder / "params", params, force=True)
    cfg = dataclasses.asdict(pv.config)
    header = {"format": FORMAT, "version": VERSION, "config": cfg, "card": card or {}}
    (folder / "pre_verifier.json").write_text(json.dumps(header, indent=2) + "\n")
    return folder


def read_pre_verifier_header(folder: str | Path) -> dict:
    folder = Path(folder)
    try:
        header = json.loads((folder / "pre_verifier.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{folder}: no readable pre_verifier.json ({e})") from e
    if header.get("format") != FORMAT:
        raise ValueError(
            f"{folder}: not a pre-verifier directory (format {header.get('format')!r})"
        )
    if header.get("version") != VERSION or "config" not in header:
        raise ValueError(
            f"{folder}: a pre-verifier of version {header.get('version')!r} (this specjax reads "
            f"{VERSION}): train it again with experiments/train_pre_verifier.py"
        )
    return header


def load_pre_verifier(folder: str | Path) -> PreVerifier:
    """A PreVerifier from a folder written by save_pre_verifier (ValueError naming the folder for
    a bad header or damaged params)."""
    folder = Path(folder).resolve()
    header = read_pre_verifier_header(folder)
    cfg = dict(header["config"])
    cfg["buckets"] = tuple(cfg.get("buckets", ()))
    cfg["costs"] = tuple((int(n), float(t)) for n, t in cfg.get("costs", ()))
    cfg["budget_thresholds"] = tuple(
        (int(n), float(t)) for n, t in cfg.get("budget_thresholds", ())
    )
    try:
        config = PreVerifierConfig(**cfg)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{folder}: bad pre-verifier config ({e})") from e
    # Built abstractly: initialising the weights that the checkpoint replaces compiled a dozen
    # small programs (~2.4 s of loading a drafter on a 2-core CPU).
    pv = nnx.eval_shape(lambda: PreVerifier(config, rngs=nnx.Rngs(0)))
    pv._store_threshold(config.threshold)  # a concrete value in place of the abstract one
    abstract = nnx.to_pure_dict(nnx.state(pv, nnx.Param))
    import orbax.checkpoint as ocp

    try:
        with ocp.StandardCheckpointer() as ckptr:
            params = ckptr.restore(folder / "params", abstract)
    except Exception as e:  # orbax / tensorstore raise many types for damaged files
        raise ValueError(f"{folder / 'params'}: could not be restored ({type(e).__name__})") from e
    state = nnx.state(pv, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    nnx.update(pv, state)
    if (folder / REPLAY).exists():
        pv.replay_file = str(folder / REPLAY)
    return pv
