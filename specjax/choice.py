"""Hardware-aware choice of the draft tree (SpecConfig.auto()): the tree that maximizes predicted
tokens per second = E[tokens per step](tree) / (t_verify(N) + t_draft(tree) + overhead).

E[tokens per step] comes from the drafter's acceptance profile (specjax.acceptance): a trained
feature drafter's acceptance.json from its checkpoint folder (written from held-in prompts), or,
for a draft model / self-draft pair, a short calibration run (on the call's own prompts when
nothing was calibrated before) kept in the cost cache. The costs come from specjax.autotune
(measured once per backend, device kind, model, batch, dtype, context and weight layout). Every
tree within the profile's probe is a candidate: static branchings for draft models and
self-drafting, (budget, depth, top-k) for feature drafters. The predicted speedup is against
autoregressive decoding, whose cost per token is measured with specjax.generate
(VerifyCosts.ar_token).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import sys
from collections.abc import Iterator, Sequence

import numpy as np

from specjax import adaptation
from specjax.acceptance import (
    PROFILE_FILE,
    TEXT_MIN_MATCH,
    AcceptanceProfile,
    calibrate,
    mode_of,
    read_profiles,
    write_profiles,
)
from specjax.autotune import (
    DEFAULT_NODES,
    DraftCosts,
    VerifyCosts,
    cache_dir,
    draft_costs,
    drafter_key,
    timed_steps,
    verify_costs,
)
from specjax.cache import tree_reserve
from specjax.config import AutoSpecConfig, SamplingConfig, SpecConfig, TreeConfig
from specjax.prefill_costs import prefill_seconds

# Probe trees of calibration runs: every candidate lies within one.
STATIC_PROBE = TreeConfig(branching=(4, 2, 1, 1, 1, 1, 1, 1))  # 61 nodes
PROBE_DEPTH = 8
PROBE_TOPKS = (4, 8)
# A calibration on the call's own prompts (nothing calibrated before) uses at most these.
CALIBRATION_ROWS = 4
CALIBRATION_TOKENS = 48
# Every node count up to this many verified rows (batch x nodes) may be timed, never
# interpolated: on a CPU t(N) is a staircase, not a line (SmolLM2 at batch 1: t(8) 1.27x t(1)
# where t(5..7) are 1.5x and t(9..15) 1.7-1.9x; t(16) 1.5x, t(17) 2.5x; NOTES.md, "Nineteenth
# session"), and the candidates are the trees of timed node counts only. Past it the partial
# tile's share is small. The powers of two are timed first, the counts between them where a
# tree there could be the fastest (worth_timing).
FINE_ROWS = 16
# Where a count between two timed ones may cost less than the line between them, at worst: the
# counts inside the fine grid are timed only where a tree of that many nodes, priced at this
# share of the interpolated t(N), could beat every tree at a timed count (worth_timing). Measured
# on a 2-core AMD EPYC, SmolLM2 at batch 1, five full grids: t(3..15) / interpolation between
# the powers of two 0.93-1.28 (the staircase: interior counts cost more, rarely a little less).
INTERIOR_OPTIMISM = 0.9
# The smallest context costs are measured at (SpecConfig.auto() with context None): contexts are
# rounded to powers of two from here, so a machine measures a handful of cost sets at most.
MIN_COST_CONTEXT = 64
# Cache slots left free past the context and the largest tree when costs are timed.
COST_CONTEXT_MARGIN = 16


# The best candidates a Choice keeps (specjax.programs may run one already compiled instead).
ALTERNATIVES = 16
# The best timed trees whose steps are confirmed by further readings before the choice
# (autotune.timed_steps' confirm): the winner and its closest rival.
CONFIRM_TOP = 2

# Choices made in this process, by (target, drafter, batch, mode, room, context, new tokens,
# AutoSpecConfig, acceptance shift): a repeated call skips the fingerprints and file reads.
_CHOSEN: dict[tuple, tuple] = {}
_ANNOUNCED: set[tuple] = set()


def tree_label(tree: TreeConfig) -> str:
    """dynamic(N,DEPTH,TOPK) or branching(...), +text(K) with a text chain (+text(K,mM)
    drafted from matches of M+ tokens and verified where drafted)."""
    if tree.is_dynamic:
        label = f"dynamic({tree.budget},{tree.drafter_depth},{tree.topk})"
    else:
        label = "branching(" + ",".join(str(b) for b in tree.branching) + ")"
    if tree.text_min_match:
        return label + f"+text({tree.text_chain},m{tree.text_min_match})"
    return label + (f"+text({tree.text_chain})" if tree.text_chain else "")


def _say(message: str) -> None:
    print(f"[specjax] {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The chosen config with its predictions: tau (tokens per step), seconds per step, the
    autoregressive seconds per token it is compared with, and how many trees were weighed.
    config None: autoregressive decoding (no tree was predicted to be faster).
    acceptance_shift: the factor the profiles were scaled by (specjax.adaptation); profiles:
    the profiles as calibrated (what a call's outcome is recorded against); context: the
    context the costs were measured at (cost_context; None when not from resolve_auto);
    new_tokens, prefill_seconds, choose_seconds: the call it was made for (for_call)."""

    config: SpecConfig | None
    predicted_tau: float
    seconds_per_step: float
    ar_seconds_per_token: float
    candidates: int
    acceptance_shift: float = 1.0
    profiles: tuple = dataclasses.field(default=(), compare=False, repr=False)
    context: int | None = None
    new_tokens: int = 0  # 0: not made for a call, predictions are per decoding step
    prefill_seconds: float = 0.0
    choose_seconds: float = 0.0
    # The candidates as (tree, tau, seconds per step), best first (the timed ones when steps
    # were timed), and whether specjax.programs kept a compiled one over the best.
    alternatives: tuple = dataclasses.field(default=(), compare=False, repr=False)
    kept_compiled: bool = False
    # The tree chosen whole when the config verifies a wider candidate that a cost-aware
    # pre-verifier prunes every step (specjax.api._cost_aware_candidate); the predictions are
    # the chosen tree's.
    widened_from: TreeConfig | None = None

    @property
    def step_speedup(self) -> float:
        """Predicted tokens per second of the decoding steps over plain decoding's: what trees
        are ranked by."""
        return self.predicted_tau * self.ar_seconds_per_token / self.seconds_per_step

    @property
    def predicted_speedup(self) -> float:
        """The call's predicted speedup over plain decoding of the same call (for_call): the
        prefill and new_tokens plain tokens against the prefill, the call's own choosing and
        new_tokens / tau steps. The choosing counts only when it took less than the prefill:
        a call that measured costs spends seconds on it, which would make the prediction
        describe that one call; once costs are kept it is ~0.3 ms (stories260K) to ~5 ms
        (SmolLM2), a tenth of a 128-token stories260K call. Left out: compilation. Without a
        call, step_speedup."""
        if self.new_tokens == 0:
            return self.step_speedup
        plain = self.prefill_seconds + self.new_tokens * self.ar_seconds_per_token
        steps = self.new_tokens / self.predicted_tau * self.seconds_per_step
        choosing = self.choose_seconds if self.choose_seconds < self.prefill_seconds else 0.0
        return plain / (self.prefill_seconds + choosing + steps)

    def for_call(self, *, new_tokens: int, prefill_seconds: float, choose_seconds: float):
        """This choice's predictions for a call of new_tokens tokens per row whose prefill takes
        prefill_seconds (specjax.prefill_costs), and the seconds its choosing took (reported)."""
        return dataclasses.replace(self, new_tokens=new_tokens, prefill_seconds=prefill_seconds,
                                   choose_seconds=choose_seconds)  # fmt: skip

    @property
    def config_prunes(self) -> bool:
        """Whether the chosen config lets the drafter's pre-verifier prune its tree."""
        return self.config is not None and self.config.pre_verify

    @property
    def break_even_tau(self) -> float:
        """The tau at which the chosen step decodes as fast as plain decoding."""
        return self.seconds_per_step / self.ar_seconds_per_token

    def with_fallback(self) -> SpecConfig:
        """The chosen config, falling back to plain decoding within a call whose acceptance
        stays below the break-even tau (SpecConfig.fallback_tau)."""
        return dataclasses.replace(self.config, fallback_tau=round(self.break_even_tau, 3))

    def tree_label(self) -> str:
        if self.config is None:
            return "autoregressive"
        tree = self.config.tree
        if self.widened_from is not None:
            return (f"{tree_label(tree)} pre-verified by cost "
                    f"(chosen whole: {tree_label(self.widened_from)})")  # fmt: skip
        return tree_label(tree) + (" pre-verified" if self.config_prunes else "")

    def stats(self) -> dict:
        return {
            "tree": self.tree_label(),
            "predicted_tau": self.predicted_tau,
            "predicted_speedup": self.predicted_speedup,
            "predicted_step_speedup": self.step_speedup,
            "prefill_s": self.prefill_seconds,
            "choose_s": self.choose_seconds,
            "break_even_tau": self.break_even_tau,
            "acceptance_shift": self.acceptance_shift,
            "kept_compiled": self.kept_compiled,
        }

    def describe(self) -> str:
        shifted = (
            f", acceptance x{self.acceptance_shift:.2f} per depth as measured by this "
            "process's earlier calls"
            if self.acceptance_shift != 1.0
            else ""
        )
        if self.config is None:
            return (
                f"no draft tree is predicted to beat autoregressive decoding here "
                f"({self.candidates} trees weighed{shifted}): decoding autoregressively"
            )
        return (
            f"tree {self.tree_label()} ({self.config.tree.num_nodes} nodes): predicted tau "
            f"{self.predicted_tau:.2f}, predicted speedup {self.step_speedup:.2f}x per decoded "
            f"token over autoregressive decoding ({self.candidates} trees weighed{shifted})"
        )


# The longest text chain the default weighs. Chains of 8 are measured but not chosen: on the
# held-in turns SmolLM2 writes itself their tables promised tau 3.4-3.5 for trees of one or two
# drafter nodes plus 8 chain nodes, and on MT-bench and EAGLE's qa such choices reached 2.1-3.1
# (experiments/results/bench_smollm2_text_default_xeon.md and _qa_xeon.md, NOTES.md "Fifty-second
# session"), behind a fixed dynamic(4,3,4) + 4 on both sets.
MAX_TEXT_CHAIN = 4


def candidate_trees(profile: AcceptanceProfile, max_nodes: int) -> Iterator[TreeConfig]:
    """Every tree within the profile's probe with at most max_nodes nodes (root included), and
    each dynamic one with every text chain the profile measured up to MAX_TEXT_CHAIN nodes, from
    any match and, where the profile measured them, from TEXT_MIN_MATCH+ token matches (verified
    where drafted). Longer chains verified where drafted cost little where they draft nothing,
    but their tables over-promise as chains of 8 from any match did: with chains of 8 and 12
    the default chose dynamic(1,1,8) + 12 from 3+ token matches on MT-bench, predicted tau
    3.5 / 3.3 and measured 2.98 / 2.42 for the eagle / mdc, 1.77x / 1.47x against 2.04x / 1.85x
    for a fixed dynamic(7,4,4) / (7,3,4) + 12 (NOTES.md, "Fifty-third session")."""
    if profile.kind == "dynamic":
        budget, depth, topk = profile.probe
        chains = [(0, 0), *((k, 0) for k in profile.text_chains if k <= MAX_TEXT_CHAIN)]
        if profile.matched_table and profile.matched_drafted:
            chains += [(k, TEXT_MIN_MATCH) for k in profile.text_chains if k <= MAX_TEXT_CHAIN]
        for k, m in chains:
            for d in range(1, depth + 1):
                for n in range(1, min(budget, max_nodes - 1 - k) + 1):
                    yield TreeConfig.dynamic(n, d, topk).with_text_chain(k, m)
        return
    for d in range(1, len(profile.probe) + 1):
        for branching in itertools.product(*(range(1, b + 1) for b in profile.probe[:d])):
            tree = TreeConfig(branching=tuple(branching))
            if tree.num_nodes <= max_nodes:
                yield tree


def best_tau(profiles: Sequence[AcceptanceProfile], max_nodes: int) -> float:
    """The highest predicted tau of any candidate tree with at most max_nodes nodes."""
    return max(p.predict_tau(t) for p in profiles for t in candidate_trees(p, max_nodes))


def verify_grid(batch: int, max_nodes: int) -> list[int]:
    """The node counts t(N) is timed at for a call of `batch` rows: every count up to
    FINE_ROWS // batch, the powers of two past it, and max_nodes."""
    fine = set(range(1, max(FINE_ROWS // batch, 1) + 1))
    return sorted({n for n in fine | set(DEFAULT_NODES) if n < max_nodes} | {max_nodes})


def anchor_grid(batch: int, max_nodes: int) -> list[int]:
    """The node counts of verify_grid timed first, whatever the drafter: the powers of two below
    max_nodes and max_nodes. The rest of the fine grid is timed where worth_timing says so."""
    return [n for n in verify_grid(batch, max_nodes) if n & (n - 1) == 0 or n == max_nodes]


def worth_timing(
    profiles: Sequence[AcceptanceProfile],
    verify: VerifyCosts,
    draft: DraftCosts,
    counts: Sequence[int],
    **rank_kwargs,
) -> list[int]:
    """The counts among `counts` (untimed ones below the last timed count) at which some tree,
    its t(N) priced at INTERIOR_OPTIMISM x the interpolation between timed counts, is predicted
    faster than every tree at a timed count, the most promising first. The others cannot hold
    the best tree unless t(N) falls further below the line than measured, so timing them (a
    compiled program each, ~2-3 s for SmolLM2 on a 2-core CPU) would not change the choice."""
    timed = set(verify.nodes)
    open_counts = {n for n in counts if n not in timed and n < verify.nodes[-1]}
    ranked = rank(profiles, verify, draft, **rank_kwargs)
    best_timed = max((r for r, tree, _, _ in ranked if tree.num_nodes in timed), default=0.0)
    worth: dict[int, float] = {}
    for _, tree, tau, seconds in ranked:
        n = tree.num_nodes
        if n in open_counts:
            rate = tau / (seconds - (1.0 - INTERIOR_OPTIMISM) * verify.t_verify(n))
            if rate > max(best_timed, worth.get(n, 0.0)):
                worth[n] = rate
    return sorted(worth, key=lambda n: -worth[n])


def timed_twin(tree: TreeConfig) -> TreeConfig:
    """The tree whose timed step stands for `tree`'s: a chain verified where drafted
    (text_min_match) is timed as the same tree verifying its whole chain (candidate steps run on
    synthetic text, where the chain would draft as that text happens to match), and priced
    from it by verify_saving."""
    return tree.with_text_chain(tree.text_chain) if tree.text_min_match else tree


def verify_saving(profile: AcceptanceProfile, tree: TreeConfig, verify: VerifyCosts,
                  batch: int) -> float:  # fmt: skip
    """Seconds per step a tree verified where drafted saves over verifying all its nodes: t(N)
    minus t at the node counts its steps run on, weighted by their calibrated shares
    (AcceptanceProfile.verify_buckets); 0 for other trees."""
    if not tree.text_min_match:
        return 0.0
    expected = sum(share * verify.t_verify(n) for n, share in profile.verify_buckets(tree, batch))
    return max(verify.t_verify(tree.num_nodes) - expected, 0.0)


def rank(
    profiles: Sequence[AcceptanceProfile],
    verify: VerifyCosts,
    draft: DraftCosts,
    *,
    max_nodes: int = 64,
    room: int | None = None,
    rule: str = "auto",
    timed_nodes_only: bool = False,
    batch: int = 1,
) -> list[tuple[float, TreeConfig, float, float]]:
    """Every candidate tree as (predicted tokens per second, tree, predicted tau, predicted
    seconds per step), best first (module docstring). room: the cache slots a step may use
    past a row's length (None: no limit). timed_nodes_only: only trees whose node count t(N)
    was timed at (verify.nodes) are candidates, none priced by interpolation. batch: rows per
    call (a chain verified where drafted runs on the batch's most drafted row's bucket)."""
    ranked = []
    timed_nodes = set(verify.nodes)
    for profile in profiles:
        for tree in candidate_trees(profile, max_nodes):
            if rule in ("chain", "hsd") and not tree.is_chain:
                continue
            if timed_nodes_only and tree.num_nodes not in timed_nodes:
                continue
            if draft.kind == "dynamic" and tree.topk not in draft.topk:
                continue
            if room is not None and max(tree.num_nodes, tree.max_depth + 1) > room:
                continue
            tau = profile.predict_tau(tree)
            overhead = draft.overhead or 0.0  # None: not measured (resolve_auto)
            seconds = verify.t_verify(tree.num_nodes) + draft.t_draft(tree) + overhead
            seconds -= verify_saving(profile, tree, verify, batch)
            ranked.append((tau / seconds, tree, tau, seconds))
    if not ranked:
        topk = f", the drafter's timed top-k {tuple(draft.topk)}" if draft.kind == "dynamic" else ""
        raise ValueError(
            f"no candidate tree: the acceptance profiles cover no tree within max_nodes "
            f"{max_nodes}, the cache room {room} past the prompt and rule {rule!r}{topk}: raise "
            f"max_nodes or the model's max_seq_len, shorten the prompts or max_new_tokens, or "
            f"pass an explicit SpecConfig(tree=...)"
        )
    # Stable: among equal rates the first candidate (smaller depth, fewer nodes) wins.
    order = sorted(range(len(ranked)), key=lambda i: -ranked[i][0])
    return [ranked[i] for i in order]


def choose(
    profiles: Sequence[AcceptanceProfile],
    verify: VerifyCosts,
    draft: DraftCosts,
    *,
    max_nodes: int = 64,
    room: int | None = None,
    rule: str = "auto",
    attn_impl: str = "auto",
    allow_autoregressive: bool = True,
    min_speedup: float = 1.0,
    measured: tuple[float, dict] | None = None,
    timed_nodes_only: bool = False,
    batch: int = 1,
) -> Choice:
    """The candidate of highest predicted tokens per second (see rank). measured: (seconds per
    autoregressive token, {tree: measured seconds per step}) from autotune.CandidateSteps: those
    trees are then compared on their measured steps (and plain decoding on its measured
    cost) instead of the model's. When no tree is predicted to beat autoregressive decoding
    and allow_autoregressive, the choice is plain decoding (config None); likewise when the
    best is predicted below min_speedup."""
    ranked = rank(profiles, verify, draft, max_nodes=max_nodes, room=room, rule=rule,
                  timed_nodes_only=timed_nodes_only, batch=batch)  # fmt: skip
    t_ar = verify.t_autoregressive
    if measured is not None:
        t_ar, steps = measured

        def measured_seconds(tree, model_seconds):
            # A chain verified where drafted: its twin's timed step less what rank's model
            # saves on verification (the model's full price minus its price for the tree).
            full = verify.t_verify(tree.num_nodes) + draft.t_draft(tree) + (draft.overhead or 0.0)
            return steps[timed_twin(tree)] - max(full - model_seconds, 0.0)

        ranked = sorted(
            ((tau / s, tree, tau, s) for tree, tau, s in
             ((tree, tau, measured_seconds(tree, sec)) for _, tree, tau, sec in ranked
              if timed_twin(tree) in steps)),
            key=lambda r: -r[0],
        )  # fmt: skip
    rate, tree, tau, seconds = ranked[0]
    count = len(ranked) if measured is None else len(measured[1])
    if allow_autoregressive and rate * t_ar < max(min_speedup, 1.0):
        return Choice(None, 1.0, float(t_ar), float(t_ar), count)
    # The profiles and the timed steps describe the whole tree: a pre-verifier pruning it would
    # lower tau below the prediction (measured: stories260K-eagle 3.81 -> 2.95 at
    # dynamic(6,6,4)) while the step costs what was timed, so the chosen tree runs without it.
    config = SpecConfig(tree=tree, rule=rule, attn_impl=attn_impl, pre_verify=False)
    alternatives = tuple((t, float(a), float(s)) for _, t, a, s in ranked[:ALTERNATIVES])
    return Choice(config, float(tau), float(seconds), float(t_ar), count,
                  alternatives=alternatives)  # fmt: skip


def pair_profile_file(target, drafter, mode: str):
    """Where a calibrated (target, drafter) pair's profile for `mode` is kept."""
    key = drafter_key(target, drafter, batch=0, context=0) + "|" + mode
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "acceptance" / f"{digest}.json"


def probes_for(drafter, max_nodes: int = 64) -> tuple[TreeConfig, ...]:
    """The probe trees a drafter is calibrated with (every candidate lies within one): for
    dynamic trees max_nodes nodes, depth PROBE_DEPTH, top-4 and top-8; for static trees
    STATIC_PROBE, narrowed from its deepest branching level until it has <= max_nodes nodes
    (then shortened)."""
    if drafter.dynamic_trees:
        budget = max(max_nodes - 1, 1)
        return tuple(TreeConfig.dynamic(budget, PROBE_DEPTH, k) for k in PROBE_TOPKS)
    branching = list(STATIC_PROBE.branching)
    while TreeConfig(branching=tuple(branching)).num_nodes > max_nodes:
        wide = [i for i, b in enumerate(branching) if b > 1]
        if wide:
            branching[wide[-1]] -= 1
        elif len(branching) > 1:
            branching.pop()
        else:
            break
    return (TreeConfig(branching=tuple(branching)),)


def probes_span(profiles: Sequence[AcceptanceProfile], probes: Sequence[TreeConfig]) -> bool:
    """Whether kept profiles were calibrated with probes of at least as many nodes as `probes`
    (and, for dynamic trees, the same top-k). A pair first calibrated under a smaller max_nodes
    kept a narrower probe, whose candidates would silently stop short of a larger call's."""

    def nodes(profile: AcceptanceProfile) -> int:
        if profile.kind == "dynamic":
            return profile.probe[0] + 1  # (budget, depth, topk): the budget and the root
        return TreeConfig(branching=tuple(profile.probe)).num_nodes

    def spanned(probe: TreeConfig) -> bool:
        return any(
            (p.kind == "dynamic") == probe.is_dynamic
            and (not probe.is_dynamic or p.topk == probe.topk)
            and nodes(p) >= probe.num_nodes
            for p in profiles
        )

    return all(spanned(probe) for probe in probes)


def find_profiles(
    target,
    drafter,
    prompts,
    *,
    sampling: SamplingConfig,
    eos_id: int | None = None,
    max_nodes: int = 64,
    progress=_say,
) -> list[AcceptanceProfile]:
    """The drafter's acceptance profiles for this sampling mode: from its checkpoint folder, else
    from an earlier calibration of the pair whose probes span this call's (probes_span), else
    calibrated now on the first rows of `prompts` (and kept)."""
    mode = mode_of(sampling)
    folder = getattr(drafter, "checkpoint_dir", None)
    if folder is not None:
        found = [p for p in read_profiles(f"{folder}/{PROFILE_FILE}") if p.mode == mode]
        if found:
            return found
    path = pair_profile_file(target, drafter, mode)
    probes = probes_for(drafter, max_nodes)
    found = read_profiles(path)
    if found and probes_span(found, probes):
        return found
    rows = [list(map(int, np.asarray(p).reshape(-1))) for p in list(prompts)[:CALIBRATION_ROWS]]
    reserve = max(tree_reserve(p.num_nodes, p.max_depth) for p in probes)
    tokens = min(CALIBRATION_TOKENS, target.config.max_seq_len - max(map(len, rows)) - reserve)
    if tokens < 8 and found:
        # No room to widen the kept profile: choose within it (smaller trees) as before.
        if progress is not None:
            progress("the prompts leave no room to calibrate wider probes: the kept profile serves")
        return found
    if tokens < 8:
        raise ValueError(
            "SpecConfig.auto() has no acceptance profile for this drafter and the prompts leave "
            "no room to calibrate one: pass an explicit SpecConfig(tree=...), or calibrate "
            "first with specjax.calibration.ensure_pair_profiles on shorter prompts"
        )
    if progress is not None:
        progress(
            f"no acceptance profile for this drafter ({mode}): calibrating on the first "
            f"{len(rows)} prompt(s), {tokens} tokens (kept in {path.parent})"
        )
    found = [
        calibrate(
            target,
            drafter,
            rows,
            probe=probe,
            sampling=sampling,
            eos_id=eos_id,
            max_new_tokens=tokens,
            description="the first prompts of a call",
        )  # fmt: skip
        for probe in probes
    ]
    write_profiles(path, found)
    return found


def cost_context(target, auto: AutoSpecConfig, call_context: float | None = None) -> int:
    """The context costs are measured at: auto.context, else the call's context (call_context,
    see call_context(); default MIN_COST_CONTEXT) rounded to the nearest power of two (in log
    scale), at least MIN_COST_CONTEXT; that rounded context is lowered where the model's
    max_seq_len leaves no room for the largest tree after it, an explicit one is refused."""
    from specjax.autotune import AR_TOKENS

    largest = max(auto.max_nodes, AR_TOKENS)
    fits = target.config.max_seq_len - largest - COST_CONTEXT_MARGIN
    if auto.context is not None:
        if auto.context > fits:
            raise ValueError(
                f"AutoSpecConfig(context={auto.context}) leaves no room in this model's "
                f"{target.config.max_seq_len}-slot cache for a {largest}-node tree after it: "
                f"pass context <= {fits}, or a smaller max_nodes"
            )
        return auto.context
    wanted = max(float(call_context or MIN_COST_CONTEXT), MIN_COST_CONTEXT)
    return max(1, min(2 ** round(np.log2(wanted)), fits))


def call_prefill_seconds(target, batch: int, width: int, *, verbose: bool) -> float:
    """The prefill's seconds for a call of `batch` prompts padded to `width` tokens
    (specjax.prefill_costs: measured once per machine, with a progress line when verbose)."""
    return prefill_seconds(target, batch=batch, width=width, progress=_say if verbose else None)


def call_context(target, prompt_width: int, max_new_tokens: int, attn_impl: str = "auto") -> int:
    """The context at which a call's steps cost what they cost on average: with the CPU attention
    kernel, which reads only the committed positions, the call's mean context (the padded prompt
    width plus half the new tokens); with the other implementations, which attend over the whole
    static cache, masked, its cache length (prompt width plus max_new_tokens)."""
    from specjax.attention import cpu_kernel_ok, resolve_impl

    impl = resolve_impl(attn_impl, target.config.head_dim)
    if cpu_kernel_ok(impl, 1, target.config.dtype):
        return prompt_width + max_new_tokens // 2
    return prompt_width + max_new_tokens


def _family(tree: TreeConfig):
    """What sets a candidate apart for timing: a dynamic tree's top-k, whether it has a text
    chain and whether that is verified where drafted; a static tree's depth."""
    if tree.is_dynamic:
        return ("topk", tree.topk, tree.text_chain > 0, tree.text_min_match > 0)
    return ("depth", tree.max_depth)


def _best_trees(profiles, verify, draft, *, count, timed=(), **kwargs) -> list[TreeConfig]:
    """The `count` trees to time: the best predicted (see rank) of each family (_family), best
    first, then the next best of any. `timed`: trees already timed, which stay in the set and
    cover their families. Why families: the timed steps correct only the cost side of the
    model, and the model's error differs between families; timing its top few alone can leave a
    cheaper family unweighed (SmolLM2's eagle: three top-8 trees timed, never the top-4 trees a
    fixed choice of which ran faster; NOTES.md, "Seventeenth session")."""
    ranked = list(dict.fromkeys(tree for _, tree, _, _ in rank(profiles, verify, draft, **kwargs)))
    # A tree is covered when the step that stands for it (timed_twin) was timed.
    timed = set(timed)
    top = [tree for tree in ranked if timed_twin(tree) in timed]
    families = {_family(tree) for tree in top}
    for tree in ranked:
        if len(top) < count and _family(tree) not in families:
            top.append(tree)
            families.add(_family(tree))
    top += [tree for tree in ranked if tree not in top][: max(count - len(top), 0)]
    return sorted(top, key=ranked.index)


def _time_best(steps, profiles, verify, draft, *, count, **kwargs) -> DraftCosts:
    """Add the `count` best predicted trees to `steps` (autotune.CandidateSteps). When the
    drafter's step overhead is unknown, the first tree is ranked without it and timed, its
    step's excess over draft + verify becomes the overhead, and the rest are ranked with it
    (the first tree keeps its slot and covers its family: _best_trees `timed`).
    Returns `draft` with the overhead it was ranked with."""
    if draft.overhead is None:
        first = _best_trees(profiles, verify, draft, count=1, **kwargs)[0]
        seconds = steps.add(timed_twin(first))
        excess = seconds - draft.t_draft(first) - verify.t_verify(first.num_nodes)
        draft = dataclasses.replace(draft, overhead=max(excess, 0.0))
    chosen = _best_trees(profiles, verify, draft, count=count, timed=tuple(steps.trees), **kwargs)
    for tree in chosen:
        if timed_twin(tree) not in steps.trees:
            steps.add(timed_twin(tree))
    return draft


def acceptance_shift(target, drafter, mode: str, auto: AutoSpecConfig) -> float:
    """The factor the drafter's acceptance profiles are scaled by for this call (AutoSpecConfig
    .adapt): what this process's earlier calls measured, 1.0, or the shift given."""
    if auto.adapt is True:
        return adaptation.current_shift(adaptation.key_of(target, drafter, mode))
    return 1.0 if auto.adapt is False else float(auto.adapt)


def resolve_auto(
    target,
    drafter,
    prompts,
    *,
    auto: AutoSpecConfig,
    sampling: SamplingConfig,
    eos_id: int | None = None,
    room: int | None = None,
    call_context: float | None = None,
    new_tokens: int | None = None,
) -> Choice:
    """Choose the config for a call (speculative_generate with SpecConfig.auto()). room: the
    cache slots past the prompt and the new tokens (trees that need more are skipped);
    call_context: the call's context (see call_context()); new_tokens: the call's
    max_new_tokens (text chains are weighed at that answer length)."""
    batch = len(prompts)
    mode = mode_of(sampling)
    context = cost_context(target, auto, call_context)
    shift = acceptance_shift(target, drafter, mode, auto)
    # Keyed by the shift itself, not by how it was asked for (adapt=True or the same number
    # given back): a repeated choice skips the fingerprints (~1 s for SmolLM2) and file reads.
    memo_key = (id(target), id(drafter), batch, mode, room, context, new_tokens,
                dataclasses.replace(auto, adapt=False), shift)  # fmt: skip
    if memo_key in _CHOSEN:
        return _CHOSEN[memo_key][0]
    progress = _say if auto.verbose else None
    calibrated = find_profiles(target, drafter, prompts, sampling=sampling, eos_id=eos_id,
                               max_nodes=auto.max_nodes, progress=progress)  # fmt: skip
    if new_tokens is not None:
        calibrated = [p.at_answer_length(new_tokens) for p in calibrated]
    profiles = [p.scaled(shift) for p in calibrated]
    # A step verifies batch x N tokens: N is capped by max_batch_nodes, never below a root
    # and one drafted token.
    max_nodes = max(2, min(auto.max_nodes, auto.max_batch_nodes // batch))
    grid = verify_grid(batch, max_nodes)
    anchors = anchor_grid(batch, max_nodes)
    # Timed candidates measure plain decoding alongside their steps: no separate AR timing then.
    # The grid stops where a forward costs twice the best tau any candidate can reach in
    # one-node forwards: a tree that large cannot beat plain decoding (the factor leaves room
    # for plain decoding's own step costing more than a one-node forward). The calibrated
    # profiles set it, so that one cost set serves every acceptance shift.
    # With timed candidates t(N) only ranks which trees to time: 3 rounds, not 5 (~7 s less on a
    # first call of SmolLM2 on a 2-core CPU). The powers of two first; the fine grid's other
    # counts after the drafter's costs, where worth_timing finds them worth it.
    reps = 3 if auto.timed_candidates else 5
    verify = verify_costs(target, batch=batch, context=context, nodes=anchors,
                          with_ar=auto.timed_candidates == 0, reps=reps,
                          stop_ratio=2.0 * best_tau(calibrated, max_nodes),
                          progress=progress)  # fmt: skip
    if drafter.dynamic_trees:
        extra = {"topks": tuple(sorted({p.topk for p in profiles}))}
    else:
        # A draft model's cost is a smaller share of a step: its block sizes stay coarse.
        coarse = [n for n in grid if n >= 2 and (n in DEFAULT_NODES or n == max_nodes)]
        extra = {"nodes": tuple(coarse) or (2,)}
    # With timed candidates the step overhead comes from the first of them (one whole step
    # less to compile, on a first call that is mostly compilation).
    draft = draft_costs(
        target, drafter, verify, batch=batch, context=context,
        with_overhead=auto.timed_candidates == 0, progress=progress, **extra,
    )  # fmt: skip
    fine = [n for n in grid if n not in anchors]
    # Best first: each round times the most promising count (and adds it to the file); its
    # measured cost, usually above the line (a staircase), then rules out its neighbours.
    for _ in fine:
        wanted = worth_timing(profiles, verify, draft, fine, max_nodes=max_nodes, room=room,
                              rule=auto.rule, batch=batch)  # fmt: skip
        if not wanted:
            break
        verify = verify_costs(target, batch=batch, context=context,
                              nodes=sorted({*verify.nodes, wanted[0]}), with_ar=False, reps=reps,
                              progress=progress)  # fmt: skip
    measured = None
    if auto.timed_candidates > 0:

        def select(steps):
            nonlocal draft
            draft = _time_best(steps, profiles, verify, draft, max_nodes=max_nodes, room=room,
                               rule=auto.rule, count=auto.timed_candidates,
                               timed_nodes_only=True, batch=batch)  # fmt: skip

        taus = {}
        for _, tree, tau, _ in rank(profiles, verify, draft, max_nodes=max_nodes, room=room,
                                    rule=auto.rule, timed_nodes_only=True,
                                    batch=batch):  # fmt: skip
            taus.setdefault(tree, tau)

        def confirm(t_ar, seconds):  # the trees the choice hinges on: the best predicted few
            rated = sorted((t for t in seconds if t in taus), key=lambda t: -taus[t] / seconds[t])
            return rated[:CONFIRM_TOP]

        measured = timed_steps(target, drafter, select, confirm=confirm, batch=batch,
                               context=context, progress=progress)  # fmt: skip
    choice = choose(
        profiles, verify, draft, max_nodes=max_nodes, room=room, rule=auto.rule,
        attn_impl=auto.attn_impl, allow_autoregressive=auto.allow_autoregressive,
        min_speedup=auto.min_speedup,
        measured=measured, timed_nodes_only=True, batch=batch,
    )  # fmt: skip
    choice = dataclasses.replace(
        choice, acceptance_shift=shift, profiles=tuple(calibrated), context=context
    )
    announced = (id(target), id(drafter), batch, mode, choice.tree_label(), shift)
    if progress is not None and announced not in _ANNOUNCED:  # once, not per prompt width
        progress(choice.describe())
        _ANNOUNCED.add(announced)
    _CHOSEN[memo_key] = (choice, target, drafter)  # holding them keeps their ids unique
    return choice
