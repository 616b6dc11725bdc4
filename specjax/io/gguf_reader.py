"""Reader for GGUF checkpoints (llama, mistral and qwen2 architectures) via the `gguf` package.

Every tensor type the package can dequantize is accepted. llama.cpp stores Q/K of the llama
architecture permuted so that RoPE rotates interleaved pairs; keeping them as stored and using
rope_layout="interleaved" is exactly equivalent to un-permuting and using the half-split layout.
qwen2 files are stored unpermuted (NEOX RoPE), so they keep the half-split layout.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from specjax.config import ModelConfig

_SUPPORTED_ARCH = {"llama": "interleaved", "mistral": "interleaved", "qwen2": "half"}
_LAYER_NAMES = {
    "attn_norm": "attn_norm",
    "attn_q": "wq",
    "attn_k": "wk",
    "attn_v": "wv",
    "attn_output": "wo",
    "attn_q.bias": "bq",
    "attn_k.bias": "bk",
    "attn_v.bias": "bv",
    "ffn_norm": "mlp_norm",
    "ffn_gate": "w_gate",
    "ffn_up": "w_up",
    "ffn_down": "w_down",
}


def field_value(reader, key: str, default=None):
    """A scalar or string metadata value of a GGUF file (None/default when absent)."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def dequantized(tensor) -> np.ndarray:
    """A GGUF tensor as float32 numpy in its logical (rows = outputs) shape."""
    from gguf import quants

    try:
        arr = quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
        raise ValueError(
            f"GGUF tensor {tensor.name!r}: type {tensor.tensor_type.name} cannot be "
            f"dequantized by the installed gguf package ({e})"
        ) from e
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return np.asarray(arr, np.float32).reshape(shape)


@functools.cache
def _plain_map_reader_class():
    import gguf

    class PlainMapReader(gguf.GGUFReader):
        """`gguf.GGUFReader` whose bytes are a plain ndarray view of its memory map.

        The file stays mapped (the view shares the map's buffer); only the Python type of
        `data` changes. The reader parses every metadata record into small numpy views, and
        np.memmap's per-view bookkeeping (`__array_finalize__`, `__getitem__`) made that the
        slowest part of loading: SmolLM2's 49,152-token vocabulary and 48,900 merges took
        6.1 s to parse through np.memmap and 1.9 s through the plain view (AMD EPYC, 2 cores).
        """

        @property
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, value) -> None:  # GGUFReader.__init__ assigns np.memmap(path) here
            self._plain_data = value.view(np.ndarray)

    return PlainMapReader


def _refuse_unsupported(path, reader, arch: str, cfg: ModelConfig, tensors: dict) -> None:
    """ValueError for what the target would silently compute differently from the file's model:
    RoPE scaling (a frequency-factor tensor or a scaling type), partial rotary dimensions, a
    sliding attention window, and any tensor the loader would leave unread."""
    unsupported = []
    scaling = field_value(reader, f"{arch}.rope.scaling.type")
    if "rope_freqs.weight" in tensors or scaling not in (None, "none"):
        unsupported.append(f"RoPE scaling ({scaling or 'rope_freqs.weight'})")
    rotary = field_value(reader, f"{arch}.rope.dimension_count")
    if rotary is not None and int(rotary) != cfg.head_dim:
        unsupported.append(f"RoPE over {rotary} of {cfg.head_dim} head dimensions")
    if field_value(reader, f"{arch}.attention.sliding_window") not in (None, 0):  # 0: off
        unsupported.append("sliding-window attention")
    read = {"token_embd.weight", "output_norm.weight", "output.weight"}
    for gguf_name, name in _LAYER_NAMES.items():
        if name.startswith("b") and not cfg.qkv_bias:
            continue
        suffix = "" if gguf_name.endswith(".bias") else ".weight"
        read.update(f"blk.{i}.{gguf_name}{suffix}" for i in range(cfg.n_layers))
    unread = sorted(set(tensors) - read)
    if unread:
        more = f" and {len(unread) - 3} more" if len(unread) > 3 else ""
        unsupported.append(f"tensors this Llama layout does not use ({unread[:3]}{more})")
    if unsupported:
        raise ValueError(
            f"{path}: not supported: {'; '.join(unsupported)}. specjax runs Llama, Mistral and "
            "Qwen2 models without these: use such a model (or its transformers checkpoint)"
        )


def open_gguf(path: str | Path):
    """Parse a GGUF file's metadata and tensor records (tensor data stays on disk, mapped).

    Returns a `gguf.GGUFReader`; a loader that needs both the weights and the tokenizer opens
    the file once and passes the reader to `read_gguf` and `tokenizer_from_gguf`.
    """
    path = Path(path)
    try:
        reader = _plain_map_reader_class()(str(path))
    except Exception as e:  # the package raises ValueError / struct errors on bad files
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e
    reader.path = str(path)
    return reader


def read_gguf(path_or_reader) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Return (config, canonical weights) from a GGUF file (a path or an `open_gguf` reader)."""
    if isinstance(path_or_reader, (str, Path)):
        reader = open_gguf(path_or_reader)
    else:
        reader = path_or_reader
    path = Path(getattr(reader, "path", "GGUF file"))
    arch = field_value(reader, "general.architecture")
    if arch not in _SUPPORTED_ARCH:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported "
            f"(supported: {sorted(_SUPPORTED_ARCH)})"
        )
    tensors = {t.name: t for t in reader.tensors}

    def meta(key, default=None):
        value = field_value(reader, f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{path}: missing GGUF metadata {arch}.{key}")
        return value

    n_heads = int(meta("attention.head_count"))
    d_model = int(meta("embedding_length"))
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path}: missing tensors ['token_embd.weight']")
    vocab = int(tensors["token_embd.weight"].shape[1])
    cfg = ModelConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_layers=int(meta("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(meta("attention.head_count_kv", n_heads)),
        head_dim=int(meta("attention.key_length", d_model // n_heads)),
        ffn_dim=int(meta("feed_forward_length")),
        norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        rope_layout=_SUPPORTED_ARCH[arch],
        tie_embeddings="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        max_seq_len=int(meta("context_length", 2048)),
    )

    _refuse_unsupported(path, reader, arch, cfg, tensors)

    def get(name):
        if name not in tensors:
            raise ValueError(f"{path}: missing tensors [{name!r}]")
        return dequantized(tensors[name])

    weights = {"embed": get("token_embd.weight"), "final_norm": get("output_norm.weight")}
    if not cfg.tie_embeddings:
        weights["lm_head"] = get("output.weight").T
    for gguf_name, name in _LAYER_NAMES.items():
        if name.startswith("b") and not cfg.qkv_bias:
            continue
        suffix = "" if gguf_name.endswith(".bias") else ".weight"
        stacked = np.stack([get(f"blk.{i}.{gguf_name}{suffix}") for i in range(cfg.n_layers)])
        # Matrices are stored [out, in]; specjax multiplies x @ W with W [in, out].
        weights[name] = (
            np.ascontiguousarray(stacked.transpose(0, 2, 1)) if stacked.ndim == 3 else stacked
        )
    return cfg, weights
