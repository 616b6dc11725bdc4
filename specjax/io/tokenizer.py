"""Tokenizers: llama2.c tokenizer.bin, the BPE tokenizer embedded in GGUF files, HF tokenizer.json,
and chat templates (jinja, as shipped with the checkpoint).

Every tokenizer has the same small surface: encode(text, bos=...), decode(ids), bos_id, eos_id,
vocab_size, chat_template and apply_chat(messages).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path


class Tokenizer:
    """Common surface and chat-template rendering."""

    bos_id: int | None = None
    eos_id: int | None = None
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def apply_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render messages [{"role", "content"}] with the checkpoint's chat template."""
        if not self.chat_template:
            raise ValueError(
                f"{type(self).__name__} has no chat template: encode the prompt as "
                "plain text (drop --chat)"
            )
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ValueError(f"chat template error: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )


_BYTE_TOKEN = re.compile(rb"^<0x([0-9A-Fa-f]{2})>$")


class Llama2cTokenizer(Tokenizer):
    """llama2.c's sentencepiece-style BPE: dummy-prefix space, per-character start with byte
    fallback (<0xXX> at id byte + 3), then greedy merges of the adjacent pair whose merged string
    has the highest score. BOS = 1, EOS = 2."""

    def __init__(self, pieces: list[bytes], scores: list[float]):
        self.pieces = pieces
        self.scores = scores
        self.lookup = {p: i for i, p in enumerate(pieces)}
        self.bos_id, self.eos_id = 1, 2

    @classmethod
    def from_file(cls, path: str | Path) -> Llama2cTokenizer:
        raw = Path(path).read_bytes()
        pieces, scores, off = [], [], 4
        try:
            while off < len(raw):
                score, length = struct.unpack_from("<fi", raw, off)
                off += 8
                if length < 0 or off + length > len(raw):
                    raise ValueError("bad piece length")
                pieces.append(raw[off : off + length])
                scores.append(score)
                off += length
        except (struct.error, ValueError) as e:
            raise ValueError(f"{path}: not a llama2.c tokenizer file ({e})") from None
        if len(pieces) < 259:
            raise ValueError(
                f"{path}: only {len(pieces)} tokens; a llama2.c tokenizer has byte "
                "fallback tokens at ids 3..258"
            )
        return cls(pieces, scores)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        ids = []
        if text:
            text = " " + text  # sentencepiece's dummy prefix
        for ch in text:
            b = ch.encode("utf-8")
            if b in self.lookup:
                ids.append(self.lookup[b])
            else:
                ids.extend(byte + 3 for byte in b)
        while True:
            best, best_i, best_id = float("-inf"), -1, -1
            for i in range(len(ids) - 1):
                merged = self.lookup.get(self.pieces[ids[i]] + self.pieces[ids[i + 1]])
                if merged is not None and self.scores[merged] > best:
                    best, best_i, best_id = self.scores[merged], i, merged
            if best_i < 0:
                break
            ids[best_i : best_i + 2] = [best_id]
        return ([self.bos_id] if bos else []) + ids

    def decode(self, ids) -> str:
        out, prev = bytearray(), None
        for i in (int(x) for x in ids):
            if i in (self.bos_id, self.eos_id) or not 0 <= i < len(self.pieces):
                prev = i
                continue
            piece = self.pieces[i]
            m = _BYTE_TOKEN.match(piece)
            if m:
                piece = bytes([int(m.group(1), 16)])
            elif prev == self.bos_id and piece.startswith(b" "):
                piece = piece[1:]
            out += piece
            prev = i
        return out.decode("utf-8", errors="replace")


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` (from tokenizer.json, or rebuilt from GGUF metadata)."""

    def __init__(self, tk, *, bos_id=None, eos_id=None, add_bos=False, chat_template=None):
        self.tk = tk
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos
        self.chat_template = chat_template
        self.bos_token = tk.id_to_token(bos_id) if bos_id is not None else ""
        self.eos_token = tk.id_to_token(eos_id) if eos_id is not None else ""

    @classmethod
    def from_dir(cls, path: str | Path) -> HFTokenizer:
        from tokenizers import Tokenizer as TkTokenizer

        path = Path(path)
        tk = TkTokenizer.from_file(str(path / "tokenizer.json"))
        cfg = {}
        if (path / "tokenizer_config.json").exists():
            cfg = json.loads((path / "tokenizer_config.json").read_text())

        def token_id(key):
            tok = cfg.get(key)
            if isinstance(tok, dict):
                tok = tok.get("content")
            return tk.token_to_id(tok) if tok else None

        return cls(
            tk,
            bos_id=token_id("bos_token"),
            eos_id=token_id("eos_token"),
            add_bos=bool(cfg.get("add_bos_token", False)),
            chat_template=cfg.get("chat_template"),
        )

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        ids = self.tk.encode(text, add_special_tokens=False).ids
        if bos and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids) -> str:
        return self.tk.decode([int(i) for i in ids], skip_special_tokens=True)


def tokenizer_from_gguf(path: str | Path) -> HFTokenizer:
    """Rebuild the byte-level BPE tokenizer stored in a GGUF file's metadata."""
    import gguf
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as TkTokenizer

    reader = gguf.GGUFReader(str(path))

    def meta(key, default=None):
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    kind = meta("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"{path}: GGUF tokenizer model {kind!r} is not supported (only byte-level "
            "BPE, 'gpt2'); pass a tokenizer.json with --tokenizer"
        )
    tokens = list(meta("tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in meta("tokenizer.ggml.merges")]
    types = list(meta("tokenizer.ggml.token_type", [1] * len(tokens)))
    tk = TkTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if meta("tokenizer.ggml.pre") == "smollm":  # SmolLM splits digits one by one first
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty == 3
    ]
    tk.add_special_tokens(control)
    return HFTokenizer(
        tk,
        bos_id=meta("tokenizer.ggml.bos_token_id"),
        eos_id=meta("tokenizer.ggml.eos_token_id"),
        add_bos=bool(meta("tokenizer.ggml.add_bos_token", False)),
        chat_template=meta("tokenizer.chat_template"),
    )


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer from a llama2.c .bin, a .gguf file, or a directory with tokenizer.json."""
    path = Path(path)
    if path.is_dir() and (path / "tokenizer.json").exists():
        return HFTokenizer.from_dir(path)
    if path.is_file():
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == b"GGUF":
            return tokenizer_from_gguf(path)
        if path.suffix == ".bin":
            return Llama2cTokenizer.from_file(path)
    raise ValueError(
        f"{path}: unknown tokenizer format (expected a llama2.c tokenizer .bin, a "
        ".gguf file, or a directory with tokenizer.json)"
    )
