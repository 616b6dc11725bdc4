"""Drafter checkpoints: orbax arrays + a JSON header + a training card.

Layout of a drafter directory:
    drafter.json   {"format": "specjax-drafter", "version": 1, "kind", "draft_vocab_size",
                    "path_tokens", "dtype", "target": {the target's ModelConfig},
                    "target_name"}
    params/        orbax StandardCheckpointer tree {"params": the drafter's own weights,
                   "draft_vocab": [U] int32}; embeddings and the LM head are the target's
    CARD.md        what it was trained for and on, for how long, and the tau it measured

Only the drafter's own weights are stored (bfloat16 by default: half the size, and the
drafter computes in float32 after loading).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.config import ModelConfig
from specjax.models.drafter import DrafterConfig, DrafterNet

FORMAT = "specjax-drafter"
VERSION = 1


def save_drafter(
    net: DrafterNet, out_dir: str | Path, *, target_name: str = "", dtype: str = "bfloat16"
) -> Path:
    """Write net to out_dir (created; an existing params/ is replaced)."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    params = nnx.to_pure_dict(nnx.state(net, nnx.Param))
    params = jax.tree.map(lambda x: np.asarray(jnp.asarray(x, dtype)), params)
    tree = {"params": params, "draft_vocab": np.asarray(net.draft_vocab[...])}
    import orbax.checkpoint as ocp  # imported on use: it is slow to import

    ckpt_dir = out_dir / "params"
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(ckpt_dir, tree, force=True)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "kind": net.config.kind,
        "draft_vocab_size": net.config.draft_vocab_size,
        "path_tokens": net.config.path_tokens,
        "dtype": dtype,
        "target": dataclasses.asdict(net.config.target),
        "target_name": target_name,
    }
    (out_dir / "drafter.json").write_text(json.dumps(header, indent=2) + "\n")
    return out_dir


def read_header(path: str | Path) -> dict:
    path = Path(path)
    header_path = path / "drafter.json"
    if not header_path.exists():
        raise ValueError(
            f"{path}: not a specjax drafter directory (no drafter.json); train one with "
            "`specjax train-drafter` or pass a draft *model* checkpoint instead"
        )
    header = json.loads(header_path.read_text())
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(
            f"{header_path}: unknown drafter checkpoint layout "
            f"(format {header.get('format')!r} version {header.get('version')!r}; "
            f"this specjax reads {FORMAT!r} version {VERSION})"
        )
    return header


def load_drafter_net(path: str | Path) -> DrafterNet:
    """The DrafterNet stored in a drafter directory (float32)."""
    path = Path(path).resolve()
    header = read_header(path)
    cfg = DrafterConfig(
        kind=header["kind"],
        target=ModelConfig(**header["target"]),
        draft_vocab_size=header["draft_vocab_size"],
        path_tokens=header.get("path_tokens", 1),  # headers before the field: the parent only
    )
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

    with ocp.StandardCheckpointer() as ckptr:
        tree = ckptr.restore(path / "params", abstract)
    state = nnx.state(net, nnx.Param)
    nnx.replace_by_pure_dict(
        state, jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree["params"])
    )
    nnx.update(net, state)
    net.draft_vocab.set_value(jnp.asarray(tree["draft_vocab"], jnp.int32))
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
