"""load_drafter: a trained feature drafter directory bound to its target."""

from __future__ import annotations

import types
import warnings
from pathlib import Path

from specjax.drafters.feature import EagleDrafter, FeatureDrafter, HiddenStateDrafter
from specjax.drafters.ngram import is_ngram_dir, load_ngram_drafter, read_ngram_header
from specjax.models.pre_verifier import FOLDER as PV_FOLDER
from specjax.models.pre_verifier import load_pre_verifier
from specjax.train.checkpoint import (
    FINGERPRINT_SCHEME,
    load_drafter_net,
    read_header,
    target_fingerprint,
)


def check_target(path: str | Path, header: dict, net, model, *, strict: bool = True) -> None:
    """Raise ValueError (naming path) if the drafter at path was trained for another target than
    `model`: other shapes or vocabulary (always), or other weights of the same shapes (the
    header's target_fingerprint differs; a warning instead with strict=False). A header without
    a fingerprint (written before the field) cannot be checked: a warning when strict."""
    try:  # the drafter's own shape check, before anything is built from the target's weights
        FeatureDrafter.check_compatible(types.SimpleNamespace(net=net, kind=net.config.kind), model)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    stored = header.get("target_fingerprint")
    name = header.get("target_name") or "an unnamed target"
    if stored is None or not str(stored).startswith(f"{FINGERPRINT_SCHEME}:"):
        if strict:
            what = "no target fingerprint" if stored is None else f"fingerprint {stored!r}"
            warnings.warn(
                f"{path}: the drafter header has {what} (this specjax reads "
                f"{FINGERPRINT_SCHEME!r} ones), so it cannot check that the drafter was trained "
                f"for this target ({name}); add one with specjax.train.checkpoint.add_fingerprint "
                "if it was",
                stacklevel=3,
            )
        return
    actual = target_fingerprint(model)
    if stored == actual:
        return
    message = (
        f"{path}: this {net.config.kind} drafter was trained for another target ({name}, "
        f"weights fingerprint {stored}; the given target's is {actual}): same shapes, other "
        "weights (another checkpoint, quantization or fine-tune)"
    )
    if strict:
        raise ValueError(
            f"{message}. Load the drafter trained for this target, or pass strict=False to use "
            "it anyway (it stays lossless, but its drafts may be poor)"
        )
    warnings.warn(f"{message}; using it anyway (strict=False)", stacklevel=3)


def load_ngram(path: str | Path, model, *, strict: bool = True, pre_verifier=None):
    """An NgramDrafter directory for `model`: ValueError (naming the path) for another
    vocabulary, for pre_verifier=True (none is trained for n-gram tables), and -- when strict --
    for tables distilled from another target's outputs (the header's target_fingerprint)."""
    if pre_verifier:
        raise ValueError(f"{path}: n-gram drafters have no pre-verifier; pass pre_verifier=None")
    header = read_ngram_header(path)
    if header["vocab_size"] != model.config.vocab_size:
        raise ValueError(
            f"{path}: n-gram tables over a vocabulary of {header['vocab_size']} tokens, the "
            f"target has {model.config.vocab_size}: they were built for another tokenizer"
        )
    stored, actual = header.get("target_fingerprint"), target_fingerprint(model)
    if stored is not None and stored != actual:
        message = (
            f"{path}: these n-gram tables were built from another target's outputs "
            f"({header.get('target_name') or 'unnamed'}, fingerprint {stored}; this target's is "
            f"{actual})"
        )
        if strict:
            raise ValueError(f"{message}. Pass strict=False to use them anyway (still lossless)")
        warnings.warn(f"{message}; using them anyway (strict=False)", stacklevel=3)
    return load_ngram_drafter(path)


def load_drafter(
    path: str | Path,
    target,
    *,
    strict: bool = True,
    reuse: bool = True,
    fresh_slots: int | None = None,
    stale_logits: bool = False,
    pre_verifier: bool | str | None = None,
):
    """A Drafter (HiddenStateDrafter or EagleDrafter) from a drafter directory, bound to
    `target` (a specjax Llama, or a specjax.Loaded); from an exit-heads directory (hispec.json,
    e.g. checkpoints/smollm2-hispec) a specjax.hispec.HiSpec with its checkpoint's settings;
    from an n-gram directory (ngram.json, e.g. checkpoints/stories260K-ngram) an NgramDrafter.

    Raises ValueError, naming the path, before anything is compiled: for a malformed
    drafter.json (invalid JSON, missing keys), a missing or damaged params/ checkpoint,
    draft-vocabulary ids outside the target's vocabulary, a drafter trained for a target of
    other shapes or vocabulary, and -- when strict (the default) -- one trained for a target of
    the same shapes but other weights (the header's target_fingerprint, see
    specjax.train.checkpoint.target_fingerprint; strict=False warns and loads it). Headers
    without a fingerprint load with a warning. reuse / fresh_slots / stale_logits: the mdc
    draft-reuse switches (see HiddenStateDrafter; fresh_slots None: its default).
    pre_verifier: attach the trained pre-verifier kept in the directory's pre_verifier/ folder
    (specjax.models.pre_verifier: drafts and verifies only the nodes it expects to be
    accepted); None (default): when there is one,
    True: raise ValueError when there is none, False: never; "costs": as True, set to choose
    every step's node count by this machine's measured t(N) (pre_verifier_local.cost_aware),
    which also weighs a text chain's nodes (by their match)."""
    if pre_verifier not in (None, True, False, "costs"):
        raise ValueError(f"pre_verifier must be None, True, False or 'costs', got {pre_verifier!r}")
    model = getattr(target, "model", target)
    if is_ngram_dir(path):  # n-gram tables (specjax.drafters.ngram): nothing to bind
        return load_ngram(path, model, strict=strict, pre_verifier=pre_verifier)
    if (Path(path) / "hispec.json").exists():
        # An exit-heads directory (checkpoints/<target>-hispec): HiSpec's three-level drafter.
        from specjax.hispec import HiSpec

        return HiSpec.from_checkpoint(path, model)
    header = read_header(path)
    net = load_drafter_net(path)
    check_target(path, header, net, model, strict=strict)
    if net.config.kind == "mdc":
        fresh = {} if fresh_slots is None else {"fresh_slots": fresh_slots}
        drafter = HiddenStateDrafter(net, model, reuse=reuse, stale_logits=stale_logits, **fresh)
    else:
        drafter = EagleDrafter(net, model)
    pv_folder = Path(path) / PV_FOLDER
    if pre_verifier or (pre_verifier is None and pv_folder.exists()):
        if not pv_folder.exists():
            raise ValueError(
                f"{path}: no pre-verifier ({PV_FOLDER}/ is missing); train one with "
                "experiments/train_pre_verifier.py, or pass pre_verifier=False"
            )
        drafter.pre_verifier = load_pre_verifier(pv_folder)
        if pre_verifier == "costs":
            from specjax.pre_verifier_local import cost_aware

            drafter.pre_verifier = cost_aware(drafter.pre_verifier, model)
    # Where its acceptance profile (acceptance.json) lives: SpecConfig.auto() reads it.
    drafter.checkpoint_dir = str(Path(path).resolve())
    return drafter
