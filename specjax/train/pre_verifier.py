"""Training a pre-verifier (specjax.models.pre_verifier) for one drafter.

Axis letters: X labelled nodes, S = len(NODE_STATS), N tree nodes.

Labels come from the engine itself: greedy speculative decoding with a fixed, generous tree on
held-in prompts (specjax.calibration.held_in_prompts: never MT-bench or the EAGLE question
files), recording every live step's draft tree (with its node_stats) and accepted path. A node
whose parent was accepted is a positive when it was accepted too, a negative otherwise; nodes
under a rejected parent say nothing about P(accepted | parent accepted) and are left out.
Greedy labels are exact: a deterministic child is accepted iff it is the target's argmax.

The thresholds are chosen on the recorded steps by replaying the engine's pruning
(specjax.pre_verifier_replay), under the measured costs of the machine the drafter runs on.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from specjax.config import SpecConfig
from specjax.models.pre_verifier import PreVerifier, PreVerifierConfig
from specjax.pre_verifier_replay import StepRecord


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
    with_hidden: bool = False,
) -> list[StepRecord]:
    """Greedy speculative decoding of `prompts` (token-id lists) with `config` and no
    pre-verifier, batch rows at a time; every live row's step as a StepRecord. with_hidden:
    also each node's token and the drafter state its distribution was read from (feature
    drafters only)."""
    from specjax.speculative import SteppedRun

    if with_hidden and not hasattr(drafter, "record_hidden"):
        raise ValueError(
            f"record_steps(with_hidden=True) needs a feature drafter, got {type(drafter).__name__}"
        )
    saved, drafter.pre_verifier = getattr(drafter, "pre_verifier", None), None
    # The caller's own setting comes back afterwards (and an unset one stays unset: the
    # setting is part of the compiled program's key, so a leftover False would recompile).
    previous = vars(drafter).get("record_hidden")
    if with_hidden:
        drafter.record_hidden = True
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
                    extra = {}
                    if with_hidden:
                        extra = dict(
                            tokens=np.asarray(tree.tokens[b]),
                            hidden=np.asarray(tree.node_hidden[b], np.float16),
                        )
                    records.append(
                        StepRecord(
                            parents=np.asarray(tree.parents[b]),
                            valid=np.asarray(tree.valid[b]),
                            node_stats=np.asarray(tree.node_stats[b], np.float32),
                            path=np.asarray(acc.path[b][1 : n + 1]),
                            **extra,
                        )
                    )
            if progress is not None:
                progress(f"recorded {len(records)} row-steps ({start + batch} prompts)")
    finally:
        drafter.pre_verifier = saved
        if with_hidden and previous is None:
            vars(drafter).pop("record_hidden")
        elif with_hidden:
            drafter.record_hidden = previous
    return records


def labelled_nodes(record: StepRecord) -> tuple[np.ndarray, np.ndarray]:
    """(nodes [X], accepted [X]) of one step: its valid draft nodes whose parent was accepted
    (the only ones that say something about P(accepted | parent accepted)), and whether the
    target accepted each."""
    on_path = np.zeros(len(record.parents), bool)
    on_path[0] = True
    on_path[record.path] = True
    nodes = np.flatnonzero(record.valid & (np.arange(len(record.parents)) > 0))
    nodes = nodes[on_path[record.parents[nodes]]]
    return nodes, on_path[nodes]


def node_labels(records: list[StepRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(stats [X, S], accepted [X]) for every valid draft node whose parent was accepted."""
    stats, labels = [], []
    for r in records:
        nodes, accepted = labelled_nodes(r)
        stats.append(r.node_stats[nodes])
        labels.append(accepted)
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
