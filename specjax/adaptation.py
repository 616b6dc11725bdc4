"""The acceptance shift: how a drafter's acceptance on the prompts a process decodes compares with
its calibration profile, learned from the calls SpecConfig.auto() made in this process.

Why: acceptance profiles are measured on held-in prompts (specjax.calibration), and a user's
prompts can be harder. The shipped SmolLM2 drafters are the example: on MT-bench the default
call's trees reach tau 1.6-1.9 where their profiles predict 2.1-2.4, so the choice favours trees
that do not pay there. The within-call stop (SpecConfig.fallback_tau) limits the damage inside a
call; the shift carries what calls measured into the next call's choice.

Model: one factor `shift` scales every depth's acceptance given the parent's
(AcceptanceProfile.scaled). After a call that speculated, its speculative steps and the tokens
they emitted are kept with the tree and the (unscaled) profiles it was chosen from. The shift is
the factor at which the profiles predict the kept tokens over all kept calls, shrunk toward 1
(the calibration) by a prior worth PRIOR_STEPS steps, rounded to QUANTUM so that a handful of
trees (each compiled once) serve a process. Nothing is written to disk: the shift describes this
process's prompts.

Older calls weigh less: a call's steps count with weight 2^(-age / HALF_LIFE_CALLS), age being
the number of default calls under the same key since it (calls that decoded plainly included).
Why: a call whose choice was plain decoding measures nothing, so without forgetting, a process
whose shift once made plain decoding the choice would stay there for good, however its later
prompts would have gone. With it, each plain call moves the shift back toward the calibration
until a tree is chosen again; that call measures the prompts of the moment, and if they are
still hard, the within-call stop limits what the try costs. `reset()` forgets what was learned.

Keys are (target, drafter, sampling mode) by identity, like specjax.choice's memo.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from specjax.acceptance import AcceptanceProfile
from specjax.config import TreeConfig

# The calibration's weight, in speculative steps: two or three calls' worth. Why not fewer: the
# spread of acceptance between one user prompt and the next is not sampling noise that a call's
# ~100 steps average out, so a light prior chased it. Replayed over 80 recorded default calls
# of SmolLM2's drafters (MT-bench first turns and EAGLE's qa, greedy), the tau predicted per
# call was off by 18.6% / 19.5% on average (|predicted / measured - 1|) at 32 steps, 17.4% /
# 15.3% at 256, 16.9% / 13.0% with no shift at all (NOTES.md, "Forty-sixth session").
PRIOR_STEPS = 256
QUANTUM = 0.1  # each distinct shift may time its own candidate trees (specjax.choice)
MAX_CALLS = 256  # the latest calls kept per key
HALF_LIFE_CALLS = 8.0  # a call's weight halves with every 8 default calls after it
SHIFT_RANGE = (0.05, 2.0)
# The fit is rounded to QUANTUM: 20 halvings of SHIFT_RANGE leave ~2e-6, far below it (each
# halving costs a prediction per tree the kept calls ran: a call of a small model lasts ms).
BISECTIONS = 20


@dataclasses.dataclass
class Observation:
    """One call: its tree, the profiles it was chosen from, and its speculative steps and the
    tokens they emitted (summed over rows). A recorded call keeps its stats' arrays until first
    read (steps and tokens None), so that recording neither waits for the call nor runs device
    ops on the host path."""

    profiles: tuple[AcceptanceProfile, ...]
    tree: TreeConfig
    steps: float | None = None
    tokens: float | None = None
    stats: dict | None = None
    age: int = 0  # default calls under the same key since this one

    def counts(self) -> tuple[float, float]:
        if self.steps is None:
            self.steps, self.tokens = speculative_counts(self.stats)
            self.stats = None
        return self.steps, self.tokens


# key -> (target, drafter, [Observation]); holding target and drafter keeps their ids unique.
_CALLS: dict[tuple, tuple] = {}


def key_of(target, drafter, mode: str) -> tuple:
    return (id(target), id(drafter), mode)


def predicted_tau(profiles: Sequence[AcceptanceProfile], tree: TreeConfig, shift: float) -> float:
    """tau of `tree` under the profiles scaled by shift: the best profile covering it (as
    specjax.choice.rank weighs each profile's candidates)."""
    return max(p.scaled_tau(tree, shift) for p in profiles if p.covers(tree))


def speculative_counts(stats: dict) -> tuple[float, float]:
    """(speculative steps, tokens they emitted) of a call's stats, summed over rows: plain steps
    after a stop (stats plain_steps, one token each, recorded as accepted length 0) excluded."""
    hist = np.asarray(stats["accepted_hist"], np.int64)
    plain = float(np.sum(np.asarray(stats.get("plain_steps", 0))))
    emitted = np.arange(1, hist.shape[1] + 1)
    return float(hist.sum()) - plain, float((hist * emitted[None, :]).sum()) - plain


def record(key: tuple, target, drafter, profiles, tree: TreeConfig, stats: dict) -> None:
    """Keep a speculative call's outcome (stats of speculative_generate) under key."""
    kept = {k: stats[k] for k in ("accepted_hist", "plain_steps") if k in stats}
    _, _, calls = _CALLS.setdefault(key, (target, drafter, []))
    _age(calls)
    calls.append(Observation(tuple(profiles), tree, stats=kept))
    del calls[:-MAX_CALLS]


def record_plain(key: tuple) -> None:
    """A default call under key decoded plainly: it measured nothing, but the calls before it
    age (so the shift drifts back toward the calibration). Nothing to do before any speculative
    call was recorded."""
    entry = _CALLS.get(key)
    if entry is not None:
        _age(entry[2])


def _age(calls: list[Observation]) -> None:
    for c in calls:
        c.age += 1


def weight(c: Observation, half_life: float = HALF_LIFE_CALLS) -> float:
    """How much a kept call counts in the fit: 1 for the latest, halving every half_life calls."""
    return 2.0 ** (-c.age / half_life)


def fit_shift(
    calls: Sequence[Observation], prior_steps: float = PRIOR_STEPS, quantum: float | None = None
) -> float:
    """The shift at which the calls' profiles predict the tokens their speculative steps emitted
    (each call's steps and tokens weighted by `weight`: recent calls count more), with the
    calibration (shift 1 on the first call's tree) weighing prior_steps steps. Predicted tokens
    grow with the shift; bisection within SHIFT_RANGE. quantum: stop as soon as both ends of
    the interval round to the same multiple of it (the caller rounds the shift so anyway; ~6
    halvings instead of BISECTIONS, each a prediction per tree the kept calls ran)."""
    # Calls sharing profiles and tree predict alike: their weighted steps are summed once, so
    # a bisection step costs a few predictions, not one per kept call (up to MAX_CALLS: ~1 ms
    # a default call otherwise, as much as a whole call of a small target).
    steps_by_pair: dict[tuple, float] = {}
    observed = 0.0
    for c in calls:
        s, t = c.counts()
        pair = (c.profiles, c.tree)
        steps_by_pair[pair] = steps_by_pair.get(pair, 0.0) + weight(c) * s
        observed += weight(c) * t
    first = calls[0]
    calibrated = predicted_tau(first.profiles, first.tree, 1.0)

    def excess(shift: float) -> float:
        predicted = sum(s * predicted_tau(profiles, tree, shift)
                        for (profiles, tree), s in steps_by_pair.items())  # fmt: skip
        prior = prior_steps * (predicted_tau(first.profiles, first.tree, shift) - calibrated)
        return predicted + prior - observed

    lo, hi = SHIFT_RANGE
    if excess(lo) >= 0:
        return lo
    if excess(hi) <= 0:
        return hi
    for _ in range(BISECTIONS):
        if quantum is not None and round(lo / quantum) == round(hi / quantum):
            break
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def current_shift(key: tuple) -> float:
    """The shift for the next call under key: 1.0 before any speculative call, else fit_shift
    over the kept calls, rounded to QUANTUM."""
    entry = _CALLS.get(key)
    if entry is None or not entry[2]:
        return 1.0
    calls = [c for c in entry[2] if c.counts()[0] > 0]
    if not calls:
        return 1.0
    return max(QUANTUM, round(round(fit_shift(calls, quantum=QUANTUM) / QUANTUM) * QUANTUM, 6))


def reset() -> None:
    """Forget every shift learned in this process."""
    _CALLS.clear()
