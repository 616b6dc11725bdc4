"""A pre-verifier's thresholds chosen for the machine it runs on.

Whether pruning a draft tree pays depends on what verifying fewer nodes saves, and that is a
property of the hardware: on a 2-core CPU a 4-node target forward costs 1.2x a 1-node one and a
32-node forward 3x, on an accelerator they cost nearly the same. A threshold table chosen under
the costs of the machine the pre-verifier was trained on can be wrong elsewhere (measured: the
shipped smollm2-mdc table, chosen on an AVX2 CPU, pruned its trees to 0.4-0.6 nodes and ran at
0.88-0.96x of the same trees unpruned on an AVX-512 one, experiments/results/pacer.md).

So a checkpoint keeps its held-out recorded steps (pre_verifier/replay.npz) and, the first time
its pre-verifier would prune a call's trees, the thresholds are chosen again by replaying them
(specjax.pre_verifier_replay.replay_thresholds) under this machine's measured costs
(specjax.autotune's t(N) and the drafter's cost per level, both cached on disk). The choice is
kept on disk beside the costs, keyed by backend, device kind, target, drafter and pre-verifier,
so later processes read it. Thresholds set by the caller (set_threshold, with_settings) are
never replaced. Output is exact whatever the thresholds are: they decide only what is drafted
and verified.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from specjax import autotune
from specjax.config import TreeConfig
from specjax.pre_verifier_replay import (
    FIXED_TREES,
    load_records,
    replay_thresholds,
    simulate,
    simulate_fixed,
)

FORMAT_VERSION = 2  # 2: thresholds that prune must replay MIN_GAIN over the tree whole
SOURCE = "this machine"

# The replayed gain pruning must bring before it is used, in the thresholds chosen here and in
# the default call's decision to prune its tree: the replay approximates drafting a small tree
# by the nodes of the recorded large one (specjax.pre_verifier_replay.fixed_subtree) on held-in
# prompts, so a gain within that error is not taken. Measured why: with the best replayed
# thresholds (1-2% replayed gains) the eagle's pruned 7-node tree ran at 0.96x / 0.92x the same
# tree whole on MT-bench / qa, the mdc's at 0.99x / 0.98x (experiments/results/pacer.md of the
# AVX-512 EPYC, before this margin).
MIN_GAIN = 1.03


def pending(pv) -> bool:
    """Whether pv's thresholds are still the trained ones and it has recorded steps to choose
    new ones from."""
    return pv is not None and pv.thresholds_source == "trained" and pv.replay_file is not None


def cost_context(target) -> int:
    """The context the costs are measured at: autotune's default, less where the model's
    max_seq_len leaves no room for it and the largest node count."""
    room = target.config.max_seq_len - max(autotune.DEFAULT_NODES)
    return max(min(autotune.DEFAULT_CONTEXT, room), 1)


def _costs(target, drafter, topks, context, *, progress):
    """(t(N), the drafter's cost per level) at batch 1 and `context`, from disk or measured.
    At the context of a default call these are mostly its own measurements (autotune.verify_costs
    serves the replay's grid from the call's finer one; draft_costs times only the top-k sizes
    the call did not). The replay prices draft levels, not whole steps: no step overhead."""
    verify = autotune.verify_costs(target, context=context, with_ar=False, progress=progress)
    draft = autotune.draft_costs(target, drafter, verify, context=context,
                                 topks=tuple(sorted(topks)), with_overhead=False,
                                 progress=progress)  # fmt: skip
    return verify, draft


def choice_key(target, drafter, pv, context: int) -> str:
    digest = hashlib.sha256(Path(pv.replay_file).read_bytes()).hexdigest()[:16]
    return "|".join((
        autotune.drafter_key(target, drafter, batch=1, context=context),
        autotune.module_fingerprint(pv),
        digest,
        f"v{FORMAT_VERSION}",
    ))  # fmt: skip


def choose(target, drafter, pv, *, context: int, progress=autotune._print_progress) -> dict:
    """Replay pv's recorded steps under this machine's costs at `context`: {"threshold",
    "table" ({draft nodes: threshold}), "vs_best_fixed", "tree"} (see replay_thresholds; a
    budget prunes only where that replays MIN_GAIN over its tree whole)."""
    folder = Path(pv.replay_file).parent
    header = json.loads((folder / "pre_verifier.json").read_text())
    if "collection_tree" not in header.get("card", {}):
        raise ValueError(
            f"{folder}: its recorded steps (replay.npz) name no collection tree: train the "
            "pre-verifier again with experiments/train_pre_verifier.py, or delete replay.npz"
        )
    collection = tuple(int(x) for x in str(header["card"]["collection_tree"]).split(","))
    records = load_records(pv.replay_file)
    verify, draft = _costs(target, drafter, {collection[2], *(k for _, _, k in FIXED_TREES)},
                           context, progress=progress)  # fmt: skip
    replay = replay_thresholds(
        pv, records, collection=collection, t_verify=verify.t_verify,
        t_draft=lambda levels, k: draft.t_draft(TreeConfig.dynamic(collection[0], levels, k)),
        min_gain=MIN_GAIN,
    )  # fmt: skip
    return {
        "threshold": replay.best.threshold,
        "table": {str(n): t for n, t in replay.table.items()},
        "vs_best_fixed": round(replay.vs_best_fixed, 4),
        "tree": list(replay.best_base or collection),
    }


def localize(target, drafter, *, context: int | None = None, announce: bool = True) -> dict | None:
    """Give drafter.pre_verifier thresholds chosen under this machine's costs at `context`
    (default cost_context(target); the default call passes the context it measured its own
    costs at, so the replay reuses them) - read from disk when chosen before, else replayed and
    written there. None when it has none pending."""
    pv = getattr(drafter, "pre_verifier", None)
    if not pending(pv):
        return None
    context = cost_context(target) if context is None else context
    key = choice_key(target, drafter, pv, context)
    path, record = autotune.kept_record(key, "thresholds", FORMAT_VERSION)
    if record is None:
        progress = autotune._print_progress if announce else None
        if progress is not None:
            progress(
                "choosing the pre-verifier's thresholds for this machine (replaying its "
                "recorded steps under measured costs; once per machine)"
            )
        record = {"version": FORMAT_VERSION, "key": key,
                  **choose(target, drafter, pv, context=context, progress=progress)}  # fmt: skip
        autotune.keep_record(path, record)
    table = {int(n): float(t) for n, t in record["table"].items()}
    pv.use_thresholds(float(record["threshold"]), table, SOURCE)
    return record


_GAINS: dict[tuple, tuple] = {}


@dataclasses.dataclass(frozen=True)
class PruningGain:
    """The replay of a tree pruned at the pre-verifier's threshold for its budget against the
    same tree whole: tokens per step and seconds per step of each, and the threshold."""

    threshold: float
    tau_whole: float
    tau_pruned: float
    seconds_whole: float
    seconds_pruned: float

    @property
    def gain(self) -> float:
        """Replayed tokens/s pruned over whole."""
        return (self.tau_pruned / self.seconds_pruned) / (self.tau_whole / self.seconds_whole)


def pruning_gain(
    target, drafter, tree: TreeConfig, context: int | None = None, *, verbose: bool = True
):
    """What pruning a dynamic `tree` with the drafter's pre-verifier gains on this machine
    (PruningGain), from its recorded steps (greedy) and the costs measured at `context`
    (default cost_context(target)); the thresholds are chosen for this machine first (localize)
    unless the caller set them. None: no pre-verifier with recorded steps, a static tree, or a
    text chain (whose nodes the pre-verifier never saw: the engine leaves it off). verbose:
    progress lines while measuring or replaying."""
    pv = getattr(drafter, "pre_verifier", None)
    if pv is None or pv.replay_file is None or not tree.is_dynamic or tree.text_chain:
        return None
    context = cost_context(target) if context is None else context
    localize(target, drafter, context=context, announce=verbose)
    memo = (id(target), id(drafter), id(pv), pv.config, tree, context)
    if memo in _GAINS:
        return _GAINS[memo][0]
    threshold = pv.threshold_for(tree.budget)
    records = load_records(pv.replay_file)
    progress = autotune._print_progress if verbose else None
    verify, draft = _costs(target, drafter, {tree.topk, *(k for _, _, k in FIXED_TREES)}, context,
                           progress=progress)  # fmt: skip
    costs = dict(
        t_verify=verify.t_verify,
        t_draft=lambda levels: draft.t_draft(TreeConfig.dynamic(tree.budget, levels, tree.topk)),
    )
    base = (tree.budget, tree.max_depth, tree.topk)
    whole = simulate_fixed(records, base, **costs)
    pruned = simulate(pv, records, threshold, base=base, **costs) if threshold > 0 else whole
    result = PruningGain(threshold, whole.tau, pruned.tau, whole.seconds, pruned.seconds)
    _GAINS[memo] = (result, target, drafter, pv)  # holding them keeps their ids unique
    return result


def cost_aware(pv, target, *, batch: int = 1, context: int | None = None, verbose: bool = True):
    """The pre-verifier set to choose each step's node count by expected tokens per second
    under this machine's t(N) (PreVerifierConfig.costs; measured once, cached by
    specjax.autotune), at threshold 0: the kept nodes are the bucket's most probable ones.
    t(N) is measured at `batch` rows and `context` (default autotune's); a call of other
    batches keeps these costs. verbose: progress lines while measuring."""
    nodes = (1, 2, 4, 8, 12, 16, 32)
    context = autotune.DEFAULT_CONTEXT if context is None else context
    progress = autotune._print_progress if verbose else None
    costs = autotune.verify_costs(target, batch=batch, context=context, nodes=nodes,
                                  with_ar=False, progress=progress)  # fmt: skip
    table = tuple((int(n), float(s)) for n, s in zip(costs.nodes, costs.seconds, strict=True))
    return pv.with_settings(threshold=0.0, costs=table)
