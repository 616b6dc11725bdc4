"""Orbax save and restore of sharded state: a target's weights, or any training state (drafter
params and optimizer state), restored onto the same or a different mesh.

Axis letters: L layers, M model dim, V vocab (shapes as in specjax.models.target.weight_shapes).

Orbax writes each array's shards from the devices that hold them (no gather onto one device) and
reads back into whatever sharding the abstract tree asks for, so a checkpoint written from a 2x4
mesh restores onto 1x8, 8x1 or one device: the layout is a property of the restore, not of the
files.

Layout of a target directory written by save_target:
    target.json   {"format": "specjax-target", "version": 1, "config": ModelConfig fields}
    weights/      orbax StandardCheckpointer tree {canonical weight name: array}
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.config import ModelConfig
from specjax.models.target import Llama, model_from_weights
from specjax.sharding import check_mesh, weight_sharding

TARGET_FORMAT = "specjax-target"


def save_tree(path: str | Path, tree) -> Path:
    """Write a pytree of (possibly sharded) arrays with orbax; an existing checkpoint is
    replaced. Returns the absolute path."""
    import orbax.checkpoint as ocp  # imported on use: it is slow to import

    path = Path(path).resolve()
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, tree, force=True)
    return path


def restore_tree(path: str | Path, abstract):
    """Read a save_tree checkpoint into the shapes, dtypes and shardings of `abstract` (a pytree
    of jax.ShapeDtypeStruct with .sharding set, e.g. from abstract_on)."""
    import orbax.checkpoint as ocp

    path = Path(path).resolve()
    if not path.is_dir():
        raise ValueError(f"{path}: no such checkpoint directory")
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path, abstract)


def abstract_on(tree, mesh, spec_of=lambda _path, _x: P()):
    """The abstract tree restore_tree needs to place `tree`'s structure on `mesh`: every leaf's
    shape and dtype, with sharding NamedSharding(mesh, spec_of(key path, leaf)) (replicated by
    default: drafters and their optimizer state are small)."""
    check_mesh(mesh)
    return jax.tree_util.tree_map_with_path(
        lambda kp, x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=NamedSharding(mesh, spec_of(kp, x))
        ),
        tree,
    )


def _target_weights(model: Llama) -> dict[str, jax.Array]:
    tensors = {"embed": model.embed[...], "final_norm": model.final_norm[...]}
    if not model.config.tie_embeddings:
        tensors["lm_head"] = model.lm_head[...]
    return tensors | model.layers.arrays()


def save_target(path: str | Path, model: Llama) -> Path:
    """Write a target's weights (sharded or not) and its config to directory `path`."""
    path = Path(path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    save_tree(path / "weights", _target_weights(model))
    header = {"format": TARGET_FORMAT, "version": 1, "config": dataclasses.asdict(model.config)}
    (path / "target.json").write_text(json.dumps(header, indent=1) + "\n")
    return path


def load_target(path: str | Path, *, mesh=None, rules=None) -> Llama:
    """A target written by save_target, placed on `mesh` by the weight layout of
    specjax.sharding (any mesh shape, whatever mesh wrote it), or on the default device."""
    path = Path(path).resolve()
    try:
        header = json.loads((path / "target.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a target checkpoint ({e})") from e
    if header.get("format") != TARGET_FORMAT:
        raise ValueError(f"{path}: target.json is not a {TARGET_FORMAT} header")
    cfg = ModelConfig(**header["config"])
    shapes = nnx.eval_shape(lambda: _target_weights(Llama(cfg, rngs=nnx.Rngs(0))))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = {
        name: jax.ShapeDtypeStruct(
            x.shape,
            jnp.dtype(cfg.dtype),
            sharding=device if mesh is None else weight_sharding(name, cfg, mesh, rules),
        )
        for name, x in shapes.items()
    }
    weights = restore_tree(path / "weights", abstract)
    if mesh is None:
        return model_from_weights(cfg, weights, source=str(path))
    # The arrays are restored in place; model_from_weights keeps them there (a no-op put).
    return model_from_weights(cfg, weights, source=str(path), mesh=mesh, rules=rules)
