"""Training progress on disk, so that a long CPU training run survives being stopped: every few
minutes the loop (specjax.train.trainer.train) writes its parameters, optimizer state, step and
history to a folder, and a run started again with the same folder and settings continues from
the last save instead of step 0.

Layout: progress.json ({"step", "seen", "wall_s", "history", "fingerprint", "state"}) and the
orbax folder it names (state-<step>/), written before progress.json points to it, so a run
killed while saving leaves the previous save intact. The fingerprint (the training settings,
the drafter's config and the data's size) must match: a folder written by another run is
refused with an error rather than silently continued.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np

PROGRESS = "progress.json"


def save_progress(folder: Path, *, step: int, seen: int, wall_s: float, history: list,
                  fingerprint: str, state) -> None:  # fmt: skip
    """Write `state` (any pytree of arrays, e.g. (params, optimizer state)) as the progress after
    `step` completed steps."""
    import orbax.checkpoint as ocp  # imported on use: it is slow to import

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    name = f"state-{step}"
    leaves = {f"{i:05d}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(state))}
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(folder / name, leaves, force=True)
    previous = _read(folder)
    info = {"step": step, "seen": seen, "wall_s": wall_s, "history": history,
            "fingerprint": fingerprint, "state": name}  # fmt: skip
    tmp = folder / (PROGRESS + ".tmp")
    tmp.write_text(json.dumps(info) + "\n")
    tmp.replace(folder / PROGRESS)
    if previous is not None and previous["state"] != name:
        shutil.rmtree(folder / previous["state"], ignore_errors=True)


def load_progress(folder: Path, *, fingerprint: str, like):
    """(info dict, state) from the last save in folder, state restored into the structure of
    `like`; None when the folder holds no save. ValueError when it was written by a run with
    other settings or data."""
    folder = Path(folder).resolve()
    info = _read(folder)
    if info is None:
        return None
    if info["fingerprint"] != fingerprint:
        raise ValueError(
            f"{folder} holds the progress of a training run with other settings or data; "
            "delete it to start again, or pass the same settings to continue it"
        )
    import orbax.checkpoint as ocp

    leaves, treedef = jax.tree.flatten(like)
    abstract = {f"{i:05d}": jax.ShapeDtypeStruct(x.shape, x.dtype) for i, x in enumerate(leaves)}
    with ocp.StandardCheckpointer() as ckptr:
        restored = ckptr.restore(folder / info["state"], abstract)
    state = jax.tree.unflatten(treedef, [restored[f"{i:05d}"] for i in range(len(leaves))])
    return info, state


def _read(folder: Path) -> dict | None:
    path = folder / PROGRESS
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: unreadable training progress ({e}); delete the folder") from e
