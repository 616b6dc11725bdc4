"""Replaying a pre-verifier on recorded speculative steps: what pruning at a threshold would
have given (tokens per step, nodes verified, drafted levels, seconds under a cost model), and the
thresholds that replay fastest.

Axis letters: X labelled nodes, S = len(NODE_STATS), N tree nodes, R recorded row-steps.

For greedy decoding the replay is exact: a pruned tree accepts exactly the longest prefix of the
recorded accepted path that it keeps. Records come from greedy decoding with a generous
collection tree on held-in prompts (specjax.train.pre_verifier.record_steps); they are kept in
the pre-verifier's folder (replay.npz), so that the thresholds can be chosen again under the
costs of the machine the drafter runs on (specjax.pre_verifier_local) rather than those of the
machine it was trained on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models.pre_verifier import PreVerifier
from specjax.pre_verify import default_buckets
from specjax.tree import NODE_STATS

THRESHOLDS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
# Small fixed trees replayed beside the thresholds: the pre-verifier is worth keeping only if it
# beats the best of these, not just the collection tree it prunes. Each is also a budget of the
# per-budget threshold table.
FIXED_TREES = ((4, 2, 2), (7, 3, 4), (15, 5, 4))


@dataclasses.dataclass
class StepRecord:
    """One live row's step: parents, valid [N], node_stats [N, S], accepted path nodes; with
    record_steps(with_hidden=True) also tokens [N] and hidden [N, H] (DraftTree.node_hidden,
    float16), which save_records does not keep."""

    parents: np.ndarray
    valid: np.ndarray
    node_stats: np.ndarray
    path: np.ndarray
    tokens: np.ndarray | None = None
    hidden: np.ndarray | None = None


def predict(pv: PreVerifier, stats: np.ndarray) -> np.ndarray:
    """[X] predicted P(accepted | parent accepted)."""
    return np.asarray(jax.nn.sigmoid(pv.logits(jnp.asarray(stats, jnp.float32))))


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
    oracle: bool = False,
    by_cost: bool = False,
    node_probs: np.ndarray | None = None,
) -> Simulated:
    """Pruning at `threshold` replayed on greedy records (pv and node_probs None: no pruning).

    t_verify(n): seconds for the target over n nodes; t_draft(d): seconds to draft d levels
    (with a pre-verifier a feature drafter stops one level below its deepest kept node). base:
    prune a smaller fixed dynamic(nodes, depth, topk) tree instead of the recorded one (its
    nodes from fixed_subtree, its default buckets). oracle (pv None): a perfect discriminator,
    which keeps exactly the nodes the target accepts: the tree's whole tau with the fewest
    nodes and levels that keep it. (Not a bound on every pruning: where the accepted path just
    overflows a bucket, dropping its last node can pay when the next bucket costs much more;
    on a t(N) as flat as a CPU's up to a few nodes that is rare.) by_cost (with pv): after the
    threshold, verify the bucket that maximizes expected tokens / t_verify(bucket), keeping the
    most probable nodes (the engine's specjax.pre_verify.bucket_by_cost at batch 1); drafting
    still stops where the threshold pruned. node_probs [sum of the records' N]: P(accepted |
    parent accepted) of every recorded node, records in order, used instead of pv's (a
    hypothetical discriminator)."""
    if oracle and (pv is not None or node_probs is not None):
        raise ValueError("simulate: oracle replaces the pre-verifier; pass pv=None")
    probs = node_probs
    if probs is not None and len(probs) != sum(len(r.parents) for r in records):
        raise ValueError(
            f"simulate: node_probs has {len(probs)} entries for "
            f"{sum(len(r.parents) for r in records)} recorded nodes"
        )
    if probs is None and pv is not None:
        probs = predict(pv, np.concatenate([r.node_stats for r in records]))
    if by_cost and probs is None:
        raise ValueError("simulate: by_cost needs a pre-verifier's path probabilities")
    n_nodes = len(records[0].parents) if base is None else base[0] + 1
    buckets = buckets or default_buckets(n_nodes)
    tokens = kept_total = bucket_total = depth_total = seconds = 0.0
    full_depth = max(int(r.node_stats[r.valid, 5].max(initial=1)) for r in records)
    if base is not None:
        full_depth = min(full_depth, base[1])
    offset = 0
    for r in records:
        n = len(r.parents)
        depth = r.node_stats[:, 5].astype(int)
        keep = r.valid.copy() if base is None else fixed_subtree(r, *base)
        if probs is not None:
            pi = path_probability(probs[offset : offset + n], r.parents)
            keep &= pi >= threshold
        if oracle:
            on_path = np.zeros(n, bool)
            on_path[r.path] = True
            keep &= on_path
        offset += n
        keep[0] = True
        drafted = keep.copy()
        if by_cost:
            keep = _cheapest_bucket(keep, pi, buckets, t_verify)
        accepted = 0
        for node in r.path:
            if not keep[node]:
                break
            accepted += 1
        n_kept = int(keep.sum())
        bucket = min(b for b in buckets if b >= n_kept)
        pruned = probs is not None or oracle
        levels = min(int(depth[drafted].max()) + 1, full_depth) if pruned else full_depth
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


def _cheapest_bucket(keep, path_p, buckets, t_verify) -> np.ndarray:
    """[N] keep cut to the n - 1 most probable kept nodes (and the root), n the bucket with the
    most expected tokens (1 + their path probabilities path_p [N]) per second of
    verification."""
    prob = np.where(keep & (np.arange(len(keep)) > 0), path_p, 0.0)
    order = np.argsort(-prob, kind="stable")  # ties: the lower index, a parent before its child
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(prob[order])])
    best = max(buckets, key=lambda b: expected[min(b, len(keep)) - 1] / t_verify(b))
    cut = np.zeros(len(keep), bool)
    cut[0] = True
    cut[order[: best - 1]] = True
    return keep & cut


def simulate_oracle(
    records: list[StepRecord],
    tree: tuple[int, int, int] | None = None,
    *,
    t_verify: Callable[[int], float],
    t_draft: Callable[[int], float],
) -> Simulated:
    """A perfect discriminator (it keeps exactly the accepted nodes) replayed on the recorded
    tree (tree None) or on a fixed dynamic(nodes, depth, topk) subtree of it: see
    simulate(oracle=True)."""
    return simulate(None, records, 0.0, t_verify=t_verify, t_draft=t_draft, base=tree, oracle=True)


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


def save_records(records: list[StepRecord], path: str | Path) -> Path:
    """Write records of one collection tree (all with N nodes) to an .npz file."""
    path = Path(path)
    longest = max((len(r.path) for r in records), default=0)
    paths = np.full((len(records), max(longest, 1)), -1, np.int32)
    for i, r in enumerate(records):
        paths[i, : len(r.path)] = r.path
    np.savez_compressed(
        path,
        parents=np.stack([r.parents for r in records]).astype(np.int32),
        valid=np.stack([r.valid for r in records]),
        node_stats=np.stack([r.node_stats for r in records]).astype(np.float32),
        paths=paths,
        path_len=np.asarray([len(r.path) for r in records], np.int32),
    )
    return path


def load_records(path: str | Path) -> list[StepRecord]:
    """Records written by save_records (ValueError naming the file when it is unreadable)."""
    try:
        with np.load(path) as z:
            parents, valid, stats = z["parents"], z["valid"], z["node_stats"]
            paths, path_len = z["paths"], z["path_len"]
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"{path}: not a readable replay file ({e})") from e
    if stats.shape[-1] != len(NODE_STATS) or not (len(parents) == len(valid) == len(path_len)):
        raise ValueError(f"{path}: replay arrays of mismatched shapes")
    return [
        StepRecord(
            parents=parents[i], valid=valid[i], node_stats=stats[i], path=paths[i, : path_len[i]]
        )  # fmt: skip
        for i in range(len(parents))
    ]


@dataclasses.dataclass(frozen=True)
class ThresholdReplay:
    """Every replay the threshold choice looked at, and the choice.

    collection: the collection tree (nodes, depth, topk); unpruned: it without a pre-verifier;
    by_threshold: it pruned at each threshold; fixed: each small fixed tree without a
    pre-verifier; pruned: each small fixed tree pruned at its best threshold; best_base: the
    tree (None: the collection tree) whose pruning replayed fastest, best: that replay;
    table: {draft nodes: the threshold that replayed best on that budget's tree}."""

    collection: tuple[int, int, int]
    unpruned: Simulated
    by_threshold: tuple[Simulated, ...]
    fixed: dict
    pruned: dict
    best_base: tuple[int, int, int] | None
    best: Simulated
    table: dict

    @property
    def best_fixed(self) -> tuple[int, int, int]:
        return max(self.fixed, key=lambda t: self.fixed[t].tokens_per_second)

    @property
    def vs_best_fixed(self) -> float:
        """Replayed tokens/s of the best pruning over the best small fixed tree's."""
        return self.best.tokens_per_second / self.fixed[self.best_fixed].tokens_per_second


def replay_thresholds(
    pv: PreVerifier,
    records: list[StepRecord],
    *,
    collection: tuple[int, int, int],
    t_verify: Callable[[int], float],
    t_draft: Callable[[int, int], float],
    thresholds: tuple[float, ...] = THRESHOLDS,
    fixed_trees: tuple[tuple[int, int, int], ...] = FIXED_TREES,
    min_gain: float = 1.0,
) -> ThresholdReplay:
    """Replay every threshold on the collection tree and on each small fixed tree, under the
    costs t_verify(n nodes) and t_draft(levels, topk) (seconds), and choose: one threshold per
    budget (the best replayed on that budget's tree; 0 keeps the tree whole, and wins ties as
    it is listed first) and the overall best. min_gain > 1: a threshold that prunes is chosen
    for a budget only when its replay beats that tree whole (threshold 0) by this factor, else
    0 (thresholds must start with 0)."""
    nodes, _, topk = collection
    if min_gain != 1.0 and (not thresholds or thresholds[0] != 0.0):
        raise ValueError(f"min_gain needs thresholds that start with 0, got {thresholds}")

    def costs(k):
        return dict(t_verify=t_verify, t_draft=lambda levels: t_draft(levels, k))

    def chosen(replays: Sequence[Simulated]) -> Simulated:
        best = max(replays, key=lambda s: s.tokens_per_second)
        whole = replays[0]  # threshold 0 when min_gain applies
        if best.tokens_per_second < min_gain * whole.tokens_per_second:
            return whole
        return best

    unpruned = simulate(None, records, 0.0, **costs(topk))
    by_threshold = tuple(simulate(pv, records, t, **costs(topk)) for t in thresholds)
    fixed, pruned = {}, {}
    for tree in fixed_trees:
        fixed[tree] = simulate_fixed(records, tree, **costs(tree[2]))
        pruned[tree] = chosen(
            [simulate(pv, records, t, base=tree, **costs(tree[2])) for t in thresholds]
        )
    choices = {None: chosen(by_threshold)} | pruned
    best_base = max(choices, key=lambda b: choices[b].tokens_per_second)
    table = {nodes: choices[None].threshold} | {t[0]: pruned[t].threshold for t in fixed_trees}
    return ThresholdReplay(
        collection=tuple(collection), unpruned=unpruned, by_threshold=by_threshold,
        fixed=fixed, pruned=pruned, best_base=best_base, best=choices[best_base],
        table=dict(sorted(table.items())),
    )  # fmt: skip
