"""Drafter checkpoints: orbax arrays + a JSON header + a training card.

Layout of a drafter directory:
    drafter.json   {"format": "specjax-drafter", "version": 1, "kind", "draft_vocab_size",
                    "path_tokens", "fusion_layers", "dtype", "target": {the target's
                    ModelConfig},
                    "target_name", "target_fingerprint"}
    params/        orbax StandardCheckpointer tree {"params": the drafter's own weights,
                   "draft_vocab": [U] int32}; embeddings and the LM head are the target's
    CARD.md        what it was trained for and on, for how long, and the tau it measured

Only the drafter's own weights are stored (bfloat16 by default: half the size, and the
drafter computes in float32 after loading).

target_fingerprint (target_fingerprint()): a hash of a few fixed samples of the target's weights,
so that load_drafter can refuse a drafter trained for another target of the same shapes (another
checkpoint or quantization of the same architecture). Headers written before the field load with
a warning; add it to a drafter trained for a known target with add_fingerprint
(experiments/fingerprint_drafters.py for the shipped drafters).

Every malformed input -- invalid JSON, missing header keys, a missing or damaged params/
checkpoint, draft-vocabulary ids outside the target's vocabulary -- is a ValueError that names
the path, raised before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.acceptance import PROFILE_FILE
from specjax.config import ModelConfig
from specjax.kernels import cpu_panels
from specjax.models.drafter import DrafterConfig, DrafterNet
from specjax.models.pre_verifier import FOLDER as PRE_VERIFIER_FOLDER

FORMAT = "specjax-drafter"
VERSION = 1
# Header keys every drafter.json must have (path_tokens, target_name and target_fingerprint are
# optional: older headers lack them).
REQUIRED_KEYS = ("format", "version", "kind", "draft_vocab_size", "dtype", "target")

# target_fingerprint: "v1:" + the first 32 hex digits of a sha256 (see target_fingerprint).
FINGERPRINT_SCHEME = "v1"
FINGERPRINT_SAMPLES = 64  # values sampled per tensor
_SAMPLE_STRIDE = 2654435761  # Knuth's multiplicative-hash constant: spreads samples over a tensor


class PerLayerMatrix:
    """A matrix the target stores as one [out, in] buffer per layer (Layers.out_in), or one
    packed [P, in, 32] buffer per layer (Layers.panels: pass `out`), read at indices of its
    canonical [L, in, out] stack without building the stack (which copies every layer: ~0.3 s
    for SmolLM2, where a fingerprint samples 64 values)."""

    def __init__(self, per_layer: tuple, out: int | None = None):
        self.per_layer = per_layer
        self.out = out
        if out is None:
            out_dim, in_dim = per_layer[0].shape
        else:
            out_dim, in_dim = out, per_layer[0].shape[1]
        self.shape = (len(per_layer), in_dim, out_dim)

    def at(self, layers, rows, cols) -> np.ndarray:
        if self.out is not None:
            return np.asarray(
                [
                    cpu_panels.value_at(self.per_layer[layer], col, row)
                    for layer, row, col in zip(layers, rows, cols, strict=True)
                ],
                np.float32,
            )
        return np.asarray(
            [
                np.asarray(self.per_layer[layer])[col, row]
                for layer, row, col in zip(layers, rows, cols, strict=True)
            ],
            np.float32,
        )

    def __array__(self, dtype=None, copy=None):
        if self.out is not None:
            matrices = [cpu_panels.unpack(w, self.out) for w in self.per_layer]
        else:
            matrices = [np.asarray(w) for w in self.per_layer]
        stack = np.stack([w.T for w in matrices])
        return stack if dtype is None else stack.astype(dtype)


def fingerprint_tensors(model) -> dict:
    """The tensors target_fingerprint samples: embed, final_norm, lm_head (untied targets) and
    every layer weight in its canonical [L, ...] shape (all layers: the samples spread over the
    stack); matrices stored per layer come as PerLayerMatrix."""
    tensors = {"embed": model.embed[...], "final_norm": model.final_norm[...]}
    if not model.config.tie_embeddings:
        tensors["lm_head"] = model.lm_head[...]
    for name, stored in model.layers.compute_arrays().items():
        if isinstance(stored, tuple):
            tensors[name] = PerLayerMatrix(stored, model.layers.panel_out(name))
        else:
            tensors[name] = stored
    return tensors


def _samples(x, flat: list[int]) -> np.ndarray:
    """x at the given flat indices, as float32 (a gather on the device unless x lives on the
    host, where numpy reads it without a copy)."""
    idx = np.unravel_index(np.asarray(flat, np.int64), x.shape)
    if isinstance(x, PerLayerMatrix):
        return x.at(*idx)
    if not isinstance(x, jax.Array) or all(d.platform == "cpu" for d in x.devices()):
        values = np.asarray(x)[idx]
    else:
        values = x[tuple(jnp.asarray(i, jnp.int32) for i in idx)]
    return np.asarray(values, np.float32)


def target_fingerprint(target) -> str:
    """A cheap, deterministic fingerprint of a target's weights (a specjax Llama or Loaded).

    For each tensor of fingerprint_tensors, in name order: its name and shape, then
    FINGERPRINT_SAMPLES values at the flat indices (i + 1) * 2654435761 mod size (i = 0, 1, ...),
    read as float32 and rounded to bfloat16 (so a float32 and a bfloat16 load of the same weights
    agree), hashed with sha256; the result is "v1:" + 32 hex digits. It reads ~1000 values, so it
    takes about a millisecond for SmolLM2-135M on the CPU. Another checkpoint, quantization or
    fine-tune of the same architecture gives another fingerprint.
    """
    model = getattr(target, "model", target)
    h = hashlib.sha256(FINGERPRINT_SCHEME.encode())
    for name, x in sorted(fingerprint_tensors(model).items()):
        size = int(np.prod(x.shape))
        flat = [(i + 1) * _SAMPLE_STRIDE % size for i in range(FINGERPRINT_SAMPLES)]
        values = _samples(x, flat).astype(jnp.bfloat16).view(np.uint16).astype("<u2")
        h.update(f"{name}{tuple(int(d) for d in x.shape)};".encode())
        h.update(values.tobytes())
    return f"{FINGERPRINT_SCHEME}:{h.hexdigest()[:32]}"


def save_drafter(
    net: DrafterNet,
    out_dir: str | Path,
    *,
    target_name: str = "",
    dtype: str = "bfloat16",
    target=None,
    fingerprint: str | None = None,
) -> Path:
    """Write net to out_dir (created; an existing params/ is replaced, and what was measured on
    the weights it replaces, the acceptance profile and the pre-verifier, is removed). target:
    the model it was trained for, whose target_fingerprint is stored (or pass the fingerprint
    itself); without either the header has none and load_drafter cannot tell the drafter's
    target apart from another of the same shapes."""
    if target is not None:
        if fingerprint is not None:
            raise ValueError("pass target or fingerprint, not both")
        fingerprint = target_fingerprint(target)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    params = jax.tree.map(lambda x: np.asarray(jnp.asarray(x, dtype)), net.canonical_params())
    tree = {"params": params, "draft_vocab": np.asarray(net.draft_vocab[...])}
    import orbax.checkpoint as ocp  # imported on use: it is slow to import

    ckpt_dir = out_dir / "params"
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(ckpt_dir, tree, force=True)
    # A profile or pre-verifier of other weights would be loaded with these (load_drafter) and
    # mispredict or misprune them: calibrate and train them again for the new weights.
    (out_dir / PROFILE_FILE).unlink(missing_ok=True)
    shutil.rmtree(out_dir / PRE_VERIFIER_FOLDER, ignore_errors=True)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "kind": net.config.kind,
        "draft_vocab_size": net.config.draft_vocab_size,
        "path_tokens": net.config.path_tokens,
        "fusion_layers": list(net.config.fusion_layers),
        "dtype": dtype,
        "target": dataclasses.asdict(net.config.target),
        "target_name": target_name,
    }
    if fingerprint is not None:
        header["target_fingerprint"] = fingerprint
    _write_header(out_dir, header)
    return out_dir


def _write_header(out_dir: Path, header: dict) -> None:
    (Path(out_dir) / "drafter.json").write_text(json.dumps(header, indent=2) + "\n")


def add_fingerprint(path: str | Path, target) -> str:
    """Store target's fingerprint in the header of the drafter at path (one trained for exactly
    this target: nothing can check that here), keeping the other fields; returns it."""
    header = read_header(path)
    header["target_fingerprint"] = target_fingerprint(target)
    _write_header(Path(path), header)
    return header["target_fingerprint"]


def read_header(path: str | Path) -> dict:
    """drafter.json of a drafter directory, checked: ValueError (naming the file) if it is
    missing, not JSON, of another format or version, or lacks a required key."""
    path = Path(path)
    header_path = path / "drafter.json"
    if not header_path.exists():
        raise ValueError(
            f"{path}: not a specjax drafter directory (no drafter.json); train one with "
            "`specjax train-drafter` or pass a draft *model* checkpoint instead"
        )
    try:
        header = json.loads(header_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{header_path}: not valid JSON ({e})") from e
    if not isinstance(header, dict):
        raise ValueError(f"{header_path}: expected a JSON object, got {type(header).__name__}")
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(
            f"{header_path}: unknown drafter checkpoint layout "
            f"(format {header.get('format')!r} version {header.get('version')!r}; "
            f"this specjax reads {FORMAT!r} version {VERSION})"
        )
    missing = [k for k in REQUIRED_KEYS if k not in header]
    if missing:
        raise ValueError(f"{header_path}: drafter header is missing the keys {missing}")
    return header


def drafter_config(header: dict, path: str | Path) -> DrafterConfig:
    """The DrafterConfig a header describes; ValueError naming the file if it is invalid."""
    try:
        return DrafterConfig(
            kind=header["kind"],
            target=ModelConfig(**header["target"]),
            draft_vocab_size=header["draft_vocab_size"],
            path_tokens=header.get("path_tokens", 1),  # headers before the field: the parent
            fusion_layers=tuple(header.get("fusion_layers", ())),  # before it: no fusion
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"{Path(path) / 'drafter.json'}: invalid drafter header: {e}") from e


def load_drafter_net(path: str | Path) -> DrafterNet:
    """The DrafterNet stored in a drafter directory (float32). ValueError (naming the path) for
    an invalid header, a missing or damaged params/ checkpoint, or draft-vocabulary ids outside
    [0, the target's vocab_size)."""
    path = Path(path).resolve()
    header = read_header(path)
    cfg = drafter_config(header, path)
    vocab = np.zeros((cfg.draft_vocab_size,), np.int32)
    net = nnx.eval_shape(lambda: DrafterNet(cfg, vocab, rngs=nnx.Rngs(0)))
    abstract = {
        "params": jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(header["dtype"])),
            nnx.to_pure_dict(nnx.state(net, nnx.Param)),
        ),
        "draft_vocab": jax.ShapeDtypeStruct(vocab.shape, jnp.int32),
    }
    import orbax.checkpoint as ocp

    ckpt_dir = path / "params"
    if not ckpt_dir.is_dir():
        raise ValueError(
            f"{path}: the drafter checkpoint is incomplete (no params/ directory beside "
            "drafter.json): copy the whole drafter directory, or train it again"
        )
    try:
        with ocp.StandardCheckpointer() as ckptr:
            tree = ckptr.restore(ckpt_dir, abstract)
    except Exception as e:  # orbax / tensorstore raise many types for damaged files
        raise ValueError(
            f"{ckpt_dir}: the drafter checkpoint is incomplete or corrupted and could not be "
            f"restored ({type(e).__name__}: {str(e).strip()[:500]}): copy the whole drafter "
            "directory again, or train it again"
        ) from e
    draft_vocab = np.asarray(tree["draft_vocab"])
    bad = draft_vocab[(draft_vocab < 0) | (draft_vocab >= cfg.target.vocab_size)]
    if bad.size:
        raise ValueError(
            f"{path}: {bad.size} draft-vocabulary ids are outside the target's vocabulary "
            f"[0, {cfg.target.vocab_size}) (e.g. {int(bad[0])}): the checkpoint is corrupted "
            "or does not belong to this header"
        )
    state = nnx.state(net, nnx.Param)
    nnx.replace_by_pure_dict(
        state, jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree["params"])
    )
    nnx.update(net, state)
    net.draft_vocab.set_value(jnp.asarray(draft_vocab, jnp.int32))
    return net


def write_card(out_dir: str | Path, lines: dict) -> Path:
    """CARD.md: a title and one bullet per (field, value)."""
    out_dir = Path(out_dir)
    header = read_header(out_dir)
    text = [f"# {header['kind']} drafter for {header.get('target_name') or 'its target'}", ""]
    text += [f"- {k}: {v}" for k, v in lines.items()]
    path = out_dir / "CARD.md"
    path.write_text("\n".join(text) + "\n")
    return path
