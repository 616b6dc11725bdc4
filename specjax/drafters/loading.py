"""load_drafter: a trained feature drafter directory bound to its target."""

from __future__ import annotations

from pathlib import Path

from specjax.drafters.feature import EagleDrafter, HiddenStateDrafter
from specjax.train.checkpoint import load_drafter_net


def load_drafter(path: str | Path, target, *, reuse: bool = True, fresh_slots: int | None = None):
    """A Drafter (HiddenStateDrafter or EagleDrafter) from a drafter directory, bound to
    `target` (a specjax Llama, or a specjax.Loaded). Raises ValueError when the drafter was
    trained for a target of other shapes or vocabulary. reuse / fresh_slots: the mdc draft-reuse
    switches (see HiddenStateDrafter; None: its default)."""
    model = getattr(target, "model", target)
    net = load_drafter_net(path)
    if net.config.kind == "mdc":
        fresh = {} if fresh_slots is None else {"fresh_slots": fresh_slots}
        drafter = HiddenStateDrafter(net, model, reuse=reuse, **fresh)
    else:
        drafter = EagleDrafter(net, model)
    drafter.check_compatible(model)
    return drafter
