"""Training a pre-verifier (specjax.models.pre_verifier) for one drafter.

Axis letters: X labelled nodes, S = len(NODE_STATS), N tree nodes.

Labels come from the engine itself: greedy speculative decoding with a fixed, generous tree on
held-in prompts (specjax.calibration.held_in_prompts: never MT-bench or the EAGLE question
files), recording every live step's draft tree (with its node_stats) and accepted path. A node
whose parent was accepted is a positive when it was accepted too, a negative otherwise; nodes
under a rejected parent say nothing about P(accepted | parent accepted) and are left out.
Greedy labels are exact: a deterministic child is accepted iff it is the target's argmax.

The threshold is chosen on the recorded steps by simulating the engine's pruning: for greedy
decoding the pruned tree accepts exactly the longest prefix of the recorded accepted path that
it keeps, so each threshold's tokens per step, verified bucket and drafted depth follow from the
records, and with the measured costs of this machine (specjax.autotune) its tokens per second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from specjax.config import SpecConfig
from specjax.models.pre_verifier import PreVerifier, PreVerifierConfig
from specjax.pre_verify import default_buckets
from specjax.tree import NODE_STATS


@dataclasses.dataclass
class StepRecord:
    """One live row's step: parents, valid [N], node_stats [N, S], accepted path nodes."""

    parents: np.ndarray
    valid: np.ndarray
    node_stats: np.ndarray
    path: np.ndarray


def record_steps(
    target,
    drafter,
    prompts,
    *,
    config: SpecConfig,
    max_new_tokens: int,
    batch: int = 8,
    eos_id: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[StepRecord]:
    """Greedy speculative decoding of `prompts` (token-id lists) with `config` and no
    pre-verifier, batch rows at a time; every live row's step as a StepRecord."""
    from specjax.speculative import SteppedRun

    saved, drafter.pre_verifier = getattr(drafter, "pre_verifier", None), None
    records = []
    try:
        for start in range(0, len(prompts), batch):
            run = SteppedRun(
                target, drafter, prompts[start : start + batch],
                max_new_tokens=max_new_tokens, config=config, eos_id=eos_id,
            )  # fmt: skip
            while not run.done:
                tree, acc, live = jax.device_get(run.step())
                for b in np.flatnonzero(live):
                    n = int(acc.n_accepted[b])
                    records.append(
                        StepRecord(
                            parents=np.asarray(tree.parents[b]),
                            valid=np.asarray(tree.valid[b]),
                            node_stats=np.asarray(tree.node_stats[b], np.float32),
                            path=np.asarray(acc.path[b][1 : n + 1]),
                        )
                    )
            if progress is not None:
                progress(f"recorded {len(records)} row-steps ({start + batch} prompts)")
    finally:
        drafter.pre_verifier = saved
    return records


def node_labels(records: list[StepRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(stats [X, S], accepted [X]) for every valid draft node whose parent was accepted."""
    stats, labels = [], []
    for r in records:
        on_path = np.zeros(len(r.parents), bool)
        on_path[0] = True
        on_path[r.path] = True
        nodes = np.flatnonzero(r.valid & (np.arange(len(r.parents)) > 0))
        nodes = nodes[on_path[r.parents[nodes]]]
        stats.append(r.node_stats[nodes])
        labels.append(on_path[nodes])
    return np.concatenate(stats), np.concatenate(labels)


def train_pre_verifier(
    stats: np.ndarray,
    labels: np.ndarray,
    *,
    config: PreVerifierConfig | None = None,
    steps: int = 2000,
    batch: int = 512,
    learning_rate: float = 3e-3,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> PreVerifier:
    """Binary cross-entropy on (stats [X, S], labels [X]) with adam; minibatches drawn with
    replacement."""
    pv = PreVerifier(config or PreVerifierConfig(), rngs=nnx.Rngs(seed))
    optimizer = nnx.Optimizer(pv, optax.adam(learning_rate), wrt=nnx.Param)
    x_all = jnp.asarray(stats, jnp.float32)
    y_all = jnp.asarray(labels, jnp.float32)

    @nnx.jit
    def update(pv, optimizer, idx):
        def loss_fn(pv):
            logits = pv.logits(x_all[idx])
            return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, y_all[idx]))

        loss, grads = nnx.value_and_grad(loss_fn)(pv)
        optimizer.update(pv, grads)
        return loss

    rng = np.random.default_rng(seed)
    for step in range(steps):
        loss = update(pv, optimizer, jnp.asarray(rng.integers(0, len(labels), batch)))
        if progress is not None and (step + 1) % 500 == 0:
            progress(f"pre-verifier step {step + 1}/{steps}: loss {float(loss):.4f}")
    return pv


def predict(pv: PreVerifier, stats: np.ndarray) -> np.ndarray:
    """[X] predicted P(accepted | parent accepted)."""
    return np.asarray(jax.nn.sigmoid(pv.logits(jnp.asarray(stats, jnp.float32))))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (the probability a random positive outranks a random
    negative; ties count half)."""
    labels = np.asarray(labels, bool)
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="stable")
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    allv = np.concatenate([pos, neg])
    for v in np.unique(allv):  # average ranks over ties
        tie = allv == v
        ranks[tie] = ranks[tie].mean()
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def calibration_bins(p: np.ndarray, labels: np.ndarray, bins: int = 5) -> list[tuple]:
    """[(low, high, count, mean predicted, observed rate)] over equal-width bins of p."""
    edges = np.linspace(0, 1, bins + 1)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = (p >= lo) & ((p < hi) if hi < 1 else (p <= hi))
        if sel.any():
            out.append((lo, hi, int(sel.sum()), float(p[sel].mean()), float(labels[sel].mean())))
    return out


@dataclasses.dataclass(frozen=True)
class Simulated:
    """What pruning at one threshold would have given on recorded steps: tokens per step, mean
    draft nodes verified, mean bucket, mean drafted depth, predicted seconds per step."""

    threshold: float
    tau: float
    draft_len: float
    bucket: float
    depth: float
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tau / self.seconds


def path_probability(p_node: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """[N] predicted probability that each node's whole path is accepted (host-side twin of
    specjax.pre_verify.path_logp for one recorded tree): p_node [N], parents [N] topological."""
    pi = np.ones(len(parents))
    for i in range(1, len(parents)):  # topological order
        pi[i] = pi[parents[i]] * p_node[i]
    return pi


def simulate(
    pv: PreVerifier | None,
    records: list[StepRecord],
    threshold: float,
    *,
    t_verify: Callable[[int], float],
    t_draft: Callable[[int], float],
    buckets: tuple[int, ...] | None = None,
    base: tuple[int, int, int] | None = None,
) -> Simulated:
    """Pruning at `threshold` replayed on greedy records (pv None: no pruning). t_verify(n):
    seconds for the target over n nodes; t_draft(d): seconds to draft d levels (with a
    pre-verifier a feature drafter stops one level below its deepest kept node). base: prune a
    smaller fixed dynamic(nodes, depth, topk) tree instead of the recorded one (its nodes from
    fixed_subtree, its default buckets)."""
    n_nodes = len(records[0].parents) if base is None else base[0] + 1
    buckets = buckets or default_buckets(n_nodes)
    tokens = kept_total = bucket_total = depth_total = seconds = 0.0
    probs = None
    if pv is not None:
        probs = predict(pv, np.concatenate([r.node_stats for r in records]))
    full_depth = max(int(r.node_stats[r.valid, 5].max(initial=1)) for r in records)
    if base is not None:
        full_depth = min(full_depth, base[1])
    offset = 0
    for r in records:
        n = len(r.parents)
        depth = r.node_stats[:, 5].astype(int)
        keep = r.valid.copy() if base is None else fixed_subtree(r, *base)
        if pv is not None:
            pi = path_probability(probs[offset : offset + n], r.parents)
            keep &= pi >= threshold
        offset += n
        keep[0] = True
        accepted = 0
        for node in r.path:
            if not keep[node]:
                break
            accepted += 1
        n_kept = int(keep.sum())
        bucket = min(b for b in buckets if b >= n_kept)
        levels = full_depth if pv is None else min(int(depth[keep].max()) + 1, full_depth)
        tokens += accepted + 1
        kept_total += n_kept - 1
        bucket_total += bucket
        depth_total += levels
        seconds += t_verify(bucket) + t_draft(levels)
    k = len(records)
    return Simulated(
        threshold=threshold,
        tau=tokens / k,
        draft_len=kept_total / k,
        bucket=bucket_total / k,
        depth=depth_total / k,
        seconds=seconds / k,
    )


def fixed_subtree(record: StepRecord, nodes: int, depth: int, topk: int) -> np.ndarray:
    """[N] the nodes of a recorded (larger) tree that a fixed dynamic(nodes, depth, topk) tree
    would draft: nodes no deeper than `depth` whose sibling rank is below `topk` and whose parent
    is kept, the `nodes` most probable by the drafter's cumulative log q (and the root).
    An approximation of drafting that tree directly: EAGLE-2's frontier keeps the top-k of each
    level, which a larger top-k changes only in which deep nodes compete."""
    cum = record.node_stats[:, NODE_STATS.index("cum_logq")]
    rank = record.node_stats[:, NODE_STATS.index("rank")]
    level = record.node_stats[:, NODE_STATS.index("depth")]
    eligible = record.valid & (level <= depth) & (rank < topk)
    eligible[0] = True
    for i in range(1, len(record.parents)):  # topological: a node needs its parent
        eligible[i] &= eligible[record.parents[i]]
    order = [i for i in np.argsort(-cum, kind="stable") if eligible[i] and i > 0][:nodes]
    keep = np.zeros(len(record.parents), bool)
    keep[0] = True
    keep[order] = True  # closed under parents: a child's cum log q never exceeds its parent's
    return keep


def simulate_fixed(
    records: list[StepRecord],
    tree: tuple[int, int, int],
    *,
    t_verify: Callable[[int], float],
    t_draft: Callable[[int], float],
) -> Simulated:
    """A fixed dynamic(nodes, depth, topk) tree replayed on greedy records of a larger tree
    (fixed_subtree): simulate without a pre-verifier on that tree, verifying all its nodes (one
    bucket of nodes + 1)."""
    return simulate(
        None, records, 0.0, t_verify=t_verify, t_draft=t_draft, buckets=(tree[0] + 1,), base=tree
    )
