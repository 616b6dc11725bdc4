"""Checkpoint and tokenizer readers, and `load`, which picks the right one for a path."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from specjax.config import ModelConfig


@dataclasses.dataclass
class Loaded:
    """A loaded model: the NNX module, its tokenizer (None when none was found) and config."""

    model: object
    tokenizer: object | None
    config: ModelConfig


def detect_format(path: Path) -> str:
    if path.is_dir():
        if (path / "config.json").exists():
            return "hf"
        raise ValueError(
            f"{path}: unknown checkpoint layout (a directory needs config.json + *.safetensors)"
        )
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return "gguf"
    if path.suffix == ".bin":
        return "llama2c"
    raise ValueError(
        f"{path}: unknown checkpoint format (expected a llama2.c .bin, a .gguf file, "
        "or a Hugging Face directory with config.json + *.safetensors)"
    )


def _llama2c_tokenizer_next_to(path: Path, vocab_size: int):
    """The llama2.c tokenizer beside `path` (tokenizer.bin or tok*.bin) whose vocabulary is the
    model's, else the largest smaller one; None when there is none; ValueError naming the files
    when every one is larger (another model's: tok4096.bin beside a 512-token model)."""
    names = ["tokenizer.bin", *sorted(p.name for p in path.parent.glob("tok*.bin"))]
    found = [path.parent / n for n in names if (path.parent / n).exists() and n != path.name]
    if not found:
        return None
    from specjax.io.tokenizer import Llama2cTokenizer

    tokenizers = [Llama2cTokenizer.from_file(f) for f in found]
    fitting = [t for t in tokenizers if t.vocab_size == vocab_size]
    smaller = [t for t in tokenizers if t.vocab_size < vocab_size]
    fitting = fitting or sorted(smaller, key=lambda t: -t.vocab_size)
    if not fitting:
        pairs = zip(found, tokenizers, strict=True)
        sizes = ", ".join(f"{f.name}: {t.vocab_size}" for f, t in pairs)
        raise ValueError(
            f"{path}: no tokenizer beside it fits its {vocab_size}-token vocabulary ({sizes}): "
            "pass tokenizer=PATH (--tokenizer PATH)"
        )
    return fitting[0]


def load(
    path: str | Path,
    *,
    tokenizer: str | Path | None = None,
    dtype: str = "float32",
    mesh=None,
    rules=None,
) -> Loaded:
    """Load a llama2.c .bin, GGUF file or Hugging Face safetensors directory.

    tokenizer: an explicit tokenizer file/directory; by default the tokenizer embedded in the
    checkpoint (GGUF), next to it (tokenizer.json, tok*.bin), or None.
    mesh: a ('data', 'model') Mesh (specjax.make_mesh): every weight is placed sharded as it is
    read (specjax.sharding: projections over 'model', vocabulary over 'model'); safetensors are
    read tensor by tensor and slice by slice, so no device holds more than its shards. rules:
    logical-to-mesh axis rules replacing specjax.sharding.RULES.
    """
    from specjax.io import tokenizer as tok
    from specjax.models.target import model_from_weights

    path = Path(path)
    if mesh is not None:
        from specjax.sharding import check_mesh, check_rules

        check_mesh(mesh)
        check_rules(rules)
    fmt = detect_format(path)
    if fmt == "llama2c":
        from specjax.io.llama2c import read_llama2c

        cfg, weights = read_llama2c(path)
        # An explicit tokenizer (below) replaces the search beside the model.
        found = None if tokenizer is not None else _llama2c_tokenizer_next_to(path, cfg.vocab_size)
    elif fmt == "gguf":
        from specjax.io.gguf_reader import open_gguf, read_gguf

        reader = open_gguf(path)  # parsed once for the weights and the tokenizer
        cfg, weights = read_gguf(reader)
        try:
            found = tok.tokenizer_from_gguf(reader)
        except ValueError as e:  # no tokenizer in the metadata, or a kind we cannot rebuild
            warnings.warn(
                f"{path}: {e}; loading without a tokenizer (pass tokenizer=...)", stacklevel=2
            )
            found = None
    else:
        from specjax.io.hf import read_hf_dir

        cfg, weights = read_hf_dir(path, lazy=mesh is not None)
        found = tok.HFTokenizer.from_dir(path) if (path / "tokenizer.json").exists() else None
    if dtype != cfg.dtype:
        cfg = dataclasses.replace(cfg, dtype=dtype)
    if tokenizer is not None:
        found = tok.load_tokenizer(tokenizer)
    if found is not None and found.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"tokenizer has {found.vocab_size} tokens but the model's vocabulary is "
            f"{cfg.vocab_size}: they do not belong together"
        )
    return Loaded(
        model=model_from_weights(cfg, weights, source=str(path), mesh=mesh, rules=rules),
        tokenizer=found,
        config=cfg,
    )
