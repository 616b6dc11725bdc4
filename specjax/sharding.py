"""Device meshes and partition specs: the target, its KV cache and the batch on a ('data', 'model')
mesh, with JAX's own sharding (Mesh, NamedSharding, PartitionSpec, with_sharding_constraint).

Axis letters: L layers, B batch, S cache length, H query heads, K kv heads, D head dim, M model
dim, F ffn dim, V vocab.

Layout (Megatron-style tensor parallelism over 'model', data parallelism over 'data'):
  wq / wk / wv / w_gate / w_up [L, M, out]   split on output features (whole heads) over 'model'
  wo [L, H*D, M], w_down [L, F, M]           split on input features over 'model'
  embed [V, M], lm_head [M, V]               split over the vocabulary
  KV cache [L, B, S, K, D]                   batch over 'data', kv heads over 'model'
  norms, biases of replicated projections    replicated
Every weight carries logical axis names (LOGICAL_AXES, e.g. wq = ("layers", "embed", "q_heads"));
RULES maps logical names to mesh axes, so a different layout is a different rules tuple. A
logical axis whose unit count (heads, kv heads, ffn features, vocabulary entries) does not divide
by the size of its mesh axis is replicated instead: e.g. Llama-3-70B's 8 kv heads on a 16-way
'model' axis keep K/V (wk, wv and the cache's K axis) replicated while the query heads split.

Inside the jitted loops the engine enters `use_mesh(mesh)` (JAX's abstract-mesh context), and the
helpers below (constrain_rows, gather_logits, the shard_map around the Pallas kernel in
specjax.attention) read the mesh from that context: with no mesh they return their input, so
single-device code traces exactly as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.cache import KVCache
from specjax.config import ModelConfig

DATA, MODEL = "data", "model"
MESH_AXES = (DATA, MODEL)

# Logical axis names of every canonical weight (specjax.models.target.weight_shapes).
LOGICAL_AXES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "final_norm": ("embed",),
    "attn_norm": ("layers", "embed"),
    "mlp_norm": ("layers", "embed"),
    "wq": ("layers", "embed", "q_heads"),
    "wk": ("layers", "embed", "kv_heads"),
    "wv": ("layers", "embed", "kv_heads"),
    "wo": ("layers", "q_heads", "embed"),
    "bq": ("layers", "q_heads"),
    "bk": ("layers", "kv_heads"),
    "bv": ("layers", "kv_heads"),
    "w_gate": ("layers", "embed", "ffn"),
    "w_up": ("layers", "embed", "ffn"),
    "w_down": ("layers", "ffn", "embed"),
}
# Logical axis -> mesh axis (absent or None: replicated).
RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DATA),
    ("vocab", MODEL),
    ("q_heads", MODEL),
    ("kv_heads", MODEL),
    ("ffn", MODEL),
    ("embed", None),
    ("layers", None),
)
LOGICAL_NAMES = frozenset(name for name, _ in RULES)


def make_mesh(data: int = 1, model: int = 1, *, devices: Sequence | None = None) -> Mesh:
    """A (data, model) mesh over the first data * model devices (jax.devices() by default).

    Raises ValueError for sizes < 1 or a mesh larger than the devices available (on CPU, more host
    devices come from XLA_FLAGS=--xla_force_host_platform_device_count=N set before JAX starts).
    """
    for name, size in ((DATA, data), (MODEL, model)):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"mesh axis {name!r} needs a positive int size, got {size!r}")
    devices = list(jax.devices() if devices is None else devices)
    if data * model > len(devices):
        raise ValueError(
            f"a {data}x{model} mesh needs {data * model} devices, but only {len(devices)} "
            f"exist ({jax.default_backend()}); on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={data * model} before importing jax"
        )
    grid = np.array(devices[: data * model]).reshape(data, model)
    # Auto axes: XLA's partitioner propagates shardings from the placed weights and the
    # constraints below (no sharding-in-types annotations needed in the model code).
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def check_mesh(mesh) -> Mesh:
    """ValueError unless `mesh` is a jax Mesh with exactly the axes ('data', 'model')."""
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a jax.sharding.Mesh (specjax.make_mesh), got {mesh!r}")
    if tuple(mesh.axis_names) != MESH_AXES:
        raise ValueError(
            f"mesh axes must be {MESH_AXES} (specjax.make_mesh), got {tuple(mesh.axis_names)}"
        )
    return mesh


def check_rules(rules) -> dict[str, str | None]:
    """The rules as a dict; ValueError for unknown logical or mesh axis names."""
    rules = dict(RULES if rules is None else rules)
    unknown = sorted(set(rules) - LOGICAL_NAMES)
    if unknown:
        raise ValueError(f"unknown logical axes {unknown}; known: {sorted(LOGICAL_NAMES)}")
    bad = sorted({str(v) for v in rules.values() if v is not None and v not in MESH_AXES})
    if bad:
        raise ValueError(f"rules name mesh axes {bad}; the mesh axes are {MESH_AXES}")
    return rules


def axis_units(cfg: ModelConfig) -> dict[str, int]:
    """How many indivisible units lie along each logical axis: a split must not cut a head."""
    return {
        "vocab": cfg.vocab_size,
        "embed": cfg.d_model,
        "layers": cfg.n_layers,
        "q_heads": cfg.n_heads,
        "kv_heads": cfg.n_kv_heads,
        "ffn": cfg.ffn_dim,
    }


def logical_spec(axes: Sequence[str], units: dict[str, int], mesh: Mesh, rules=None) -> P:
    """PartitionSpec of an array with logical `axes`; an axis whose unit count does not divide by
    its mesh axis size (or whose mesh axis is already used) is replicated."""
    rules = check_rules(rules)
    spec, used = [], set()
    for axis in axes:
        mesh_axis = rules.get(axis)
        if (
            mesh_axis is None
            or mesh_axis in used
            or units.get(axis, 0) % mesh.shape[mesh_axis]
            or mesh.shape[mesh_axis] == 1
        ):
            spec.append(None)
        else:
            spec.append(mesh_axis)
            used.add(mesh_axis)
    return P(*spec)


def weight_sharding(name: str, cfg: ModelConfig, mesh: Mesh, rules=None) -> NamedSharding:
    """Where the canonical weight `name` lives on `mesh`."""
    return NamedSharding(mesh, logical_spec(LOGICAL_AXES[name], axis_units(cfg), mesh, rules))


def kv_heads_axis(n_kv_heads: int, mesh) -> str | None:
    """'model' when the kv heads divide over it, else None (K/V replicated over 'model')."""
    size = mesh.shape[MODEL]
    return MODEL if size > 1 and n_kv_heads % size == 0 else None


def cache_spec(n_kv_heads: int, mesh) -> P:
    """Spec of a KV cache array [L, B, S, K, D]: batch over 'data', kv heads over 'model'."""
    return P(None, DATA, None, kv_heads_axis(n_kv_heads, mesh), None)


def check_batch(batch: int, mesh: Mesh) -> None:
    """ValueError (before compiling) unless the batch divides over the 'data' axis."""
    size = mesh.shape[DATA]
    if batch % size:
        raise ValueError(
            f"batch of {batch} rows does not divide over the mesh's 'data' axis of size {size}: "
            f"pad the batch to a multiple of {size} or use a mesh with data={_divisor(batch, size)}"
        )


def _divisor(batch: int, size: int) -> int:
    return max(d for d in range(1, size + 1) if batch % d == 0 and size % d == 0)


def place_rows(x, mesh: Mesh):
    """Put an array [B, ...] (numpy, jax or typed keys) on the mesh, rows over 'data'."""
    return jax.device_put(x, NamedSharding(mesh, P(DATA)))


def replicate(tree, mesh: Mesh):
    """Every array of `tree` replicated on the mesh (drafters, small heads)."""
    return jax.device_put(tree, NamedSharding(mesh, P()))


def onto_mesh(tree, mesh: Mesh):
    """Arrays of `tree` already placed on `mesh` stay as they are (e.g. a draft model put there
    with shard_model); the others are replicated on it. Placing a drafter once with
    `nnx.update(drafter, onto_mesh(nnx.state(drafter), mesh))` saves the copy every call
    otherwise makes."""
    replicated = NamedSharding(mesh, P())

    def place(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            return x
        return jax.device_put(x, replicated)

    return jax.tree.map(place, tree)


def mesh_of(tree) -> Mesh | None:
    """The Mesh the arrays of `tree` were placed on (by load(mesh=...) or shard_model), or None
    for single-device arrays."""
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and tuple(sharding.mesh.axis_names) == MESH_AXES:
            return sharding.mesh
    return None


def shard_model(model, mesh: Mesh, *, rules=None):
    """Place a Llama's weights on `mesh` (in place; returns the model) and record each weight's
    logical axes as its `logical_axes` metadata."""
    check_mesh(mesh)
    cfg = model.config
    model.layers.set_layout(False)  # the rules name the canonical axes
    model.pack_head()  # drops a packed LM head (the CPU kernel's, which a mesh does not use)
    for name, axes in LOGICAL_AXES.items():
        owner = model.layers if axes[0] == "layers" else model  # stacked weights live in .layers
        param = getattr(owner, name, None)
        if param is None:
            continue
        param.set_value(jax.device_put(param[...], weight_sharding(name, cfg, mesh, rules)))
        param.set_metadata(logical_axes=axes)
    return model


def place_weight(name: str, value, cfg: ModelConfig, mesh: Mesh, dtype, rules=None) -> jax.Array:
    """One canonical weight onto the mesh, shard by shard: `value` is a numpy array or a lazy
    tensor with .shape and numpy-style slicing (specjax.io.hf reads only the requested slice), so
    no device ever holds more than its shard."""
    sharding = weight_sharding(name, cfg, mesh, rules)
    if isinstance(value, jax.Array):  # already on devices (a restored checkpoint): reshard there
        return jax.device_put(value.astype(dtype), sharding)
    shape = tuple(value.shape)
    return jax.make_array_from_callback(
        shape, sharding, lambda index: np.asarray(value[index]).astype(dtype)
    )


@contextlib.contextmanager
def use_mesh(mesh: Mesh | None):
    """Inside jit: make `mesh` the abstract mesh the helpers below read (no-op for None)."""
    if mesh is None:
        yield
        return
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        yield


def active_mesh():
    """The abstract mesh entered with use_mesh, or None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or tuple(mesh.axis_names) != MESH_AXES:
        return None
    return mesh


def constrain_rows(tree, batch: int):
    """Constrain the arrays of a loop carry: KV caches [L, B, S, K, D] by cache_spec, other arrays
    with a leading batch axis over 'data', everything else replicated. No-op without a mesh.

    Pinning the carry keeps XLA from choosing a different layout for the while_loop state than
    for its inputs, which would reshard the whole cache every step.
    """
    mesh = active_mesh()
    if mesh is None:
        return tree

    def constrain(x):
        if isinstance(x, KVCache):
            spec = cache_spec(x.k.shape[3], mesh)
            return KVCache(
                k=jax.lax.with_sharding_constraint(x.k, spec),
                v=jax.lax.with_sharding_constraint(x.v, spec),
                lengths=jax.lax.with_sharding_constraint(x.lengths, P(DATA)),
            )
        if not hasattr(x, "shape"):
            return x
        spec = P(DATA) if x.ndim >= 1 and x.shape[0] == batch else P()
        return jax.lax.with_sharding_constraint(x, spec)

    return jax.tree.map(constrain, tree, is_leaf=lambda x: isinstance(x, KVCache))


def gather_logits(logits: jax.Array) -> jax.Array:
    """logits [B, ..., V] with the vocabulary gathered (rows stay over 'data'): the acceptance
    rules and samplers then reduce over V locally, the same computation as on one device."""
    if active_mesh() is None:
        return logits
    return jax.lax.with_sharding_constraint(logits, P(DATA, *([None] * (logits.ndim - 1))))
