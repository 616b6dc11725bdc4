"""The draft trees SpecConfig.auto() has compiled a call's program for in this process, and what
compiling one cost: the default call keeps a compiled tree unless another is predicted to save
more than a compile over the calls to come.

Why: a call's program is compiled for its tree (a static shape), and the choice between close
candidates moves with the acceptance shift (specjax.adaptation). Measured on a 2-core AMD EPYC,
SmolLM2 with its eagle, 4 MT-bench first turns called in turn (NOTES.md, "Forty-fourth
session"): the choice moved between dynamic(7,4,4) and dynamic(7,3,8) from call to call, and a
call of 64 tokens (~0.85 s once compiled) spent 1-4 s compiling whenever it moved, so the
default call ran at 0.6-0.7x plain decoding in those calls and 1.5x in the others.

Rule: a call shape is (target, drafter, sampling mode, batch, padded prompt width, new tokens),
what a program is compiled for besides its config. When the chosen tree has no program for the
shape but another candidate has, the compiled one runs unless the chosen one's predicted time
saved per call, times the calls of this shape so far (a process that made k such calls is
taken to make about k more), exceeds the seconds a compile of this shape took
(`COMPILE_EVENTS`, from jax.monitoring; with the persistent compilation cache a cached program
loads in a fraction of that). The first call of a shape takes the choice as it is.
"""

from __future__ import annotations

import dataclasses

import jax

# jax.monitoring duration events that make up a jit compile (trace, lowering, XLA).
COMPILE_EVENTS = "/jax/core/compile/"

_compile_seconds = [0.0]  # every compile in this process, summed (a running total)
_listening: list[bool] = []


def _on_event(event: str, duration: float, **_) -> None:
    if event.startswith(COMPILE_EVENTS):
        _compile_seconds[0] += duration


def compile_seconds() -> float:
    """Seconds this process has spent compiling since the first call of this function (the
    listener is registered then: read it before and after a call for the call's share)."""
    if not _listening:
        jax.monitoring.register_event_duration_secs_listener(_on_event)
        _listening.append(True)
    return _compile_seconds[0]


@dataclasses.dataclass
class ShapeRecord:
    """One call shape: the trees it has a program for, the most seconds a call of it spent
    compiling, and how many default calls it has had."""

    trees: set = dataclasses.field(default_factory=set)
    compile_s: float = 0.0
    calls: int = 0


# call shape -> (target, drafter, ShapeRecord); holding target and drafter keeps ids unique.
_SHAPES: dict[tuple, tuple] = {}


def shape_of(
    target, drafter, mode: str, batch: int, width: int, new_tokens: int, settings: tuple = ()
) -> tuple:
    """A call shape: what its compiled loop is specialized on besides the tree (settings: the
    call's other static choices, e.g. the verifier, attention implementation, rule, fallback)."""
    return (id(target), id(drafter), mode, batch, width, new_tokens, settings)


def record(shape: tuple, target, drafter, tree, compile_s: float) -> None:
    """A default call of `shape` ran `tree` (None: plain decoding), compiling for compile_s."""
    entry = _SHAPES.setdefault(shape, (target, drafter, ShapeRecord()))[2]
    entry.calls += 1
    entry.compile_s = max(entry.compile_s, compile_s)
    if tree is not None:
        entry.trees.add(tree)


def keep_compiled(choice, shape: tuple, new_tokens: int):
    """The choice, or the best of its timed alternatives that this shape has a program for
    when switching is not predicted to pay for its compile (module docstring)."""
    entry = _SHAPES.get(shape)
    if choice.config is None or entry is None or choice.config.tree in entry[2].trees:
        return choice
    shape_record = entry[2]
    compiled = [a for a in choice.alternatives if a[0] in shape_record.trees]
    if not compiled:
        return choice
    tree, tau, seconds = compiled[0]  # alternatives are best first
    kept = dataclasses.replace(
        choice,
        config=dataclasses.replace(choice.config, tree=tree),
        predicted_tau=float(tau),
        seconds_per_step=float(seconds),
        kept_compiled=True,
    )
    # Seconds of new_tokens tokens: new_tokens / tau steps.
    saved = new_tokens * (seconds / tau - choice.seconds_per_step / choice.predicted_tau)
    if saved * max(shape_record.calls, 1) > shape_record.compile_s:
        return choice
    if kept.step_speedup < 1.0:
        return choice  # the compiled tree is no longer predicted to beat plain decoding
    return kept


def reset() -> None:
    """Forget every call shape (the programs stay in jit's cache)."""
    _SHAPES.clear()
