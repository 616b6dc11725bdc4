"""Tokenizers: llama2.c tokenizer.bin, the tokenizers embedded in GGUF metadata, HF tokenizer.json,
and chat templates (jinja, as shipped with the checkpoint).

Every tokenizer has the same small surface:

- ``encode(text, *, bos=True) -> list[int]``: ``bos=True`` prepends BOS only where the checkpoint's
  convention does (llama2.c and sentencepiece models do; SmolLM2's GGUF says it does not).
- ``decode(ids) -> str``: BOS/EOS and control tokens are dropped, byte tokens become raw bytes,
  invalid UTF-8 becomes U+FFFD.
- ``bos_id``, ``eos_id`` (int or None), ``vocab_size``, ``chat_template`` (str or None).
- ``apply_chat(messages, add_generation_prompt=True) -> str``: the prompt text rendered with the
  checkpoint's jinja chat template, the way transformers' ``apply_chat_template`` renders it.

Loaders: `Llama2cTokenizer.from_file`, `tokenizer_from_gguf`, `HFTokenizer.from_dir`, and
`load_tokenizer`, which picks one by looking at the path.
"""

from __future__ import annotations

import functools
import heapq
import json
import re
import struct
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path


class UnsupportedTokenizerError(NotImplementedError, ValueError):
    """A tokenizer kind this module cannot rebuild. Also a ValueError, so callers that treat
    "cannot read this tokenizer" as bad input catch it too."""


class Tokenizer:
    """Common surface of every tokenizer here, and chat-template rendering."""

    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def apply_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, **template_vars
    ) -> str:
        """Render messages ``[{"role": ..., "content": ...}]`` with the checkpoint's chat template.

        The result is prompt text: encode it with ``bos=False`` when the template already writes
        ``bos_token`` itself. Extra keyword arguments become template variables (``tools``, ...).
        """
        if not self.chat_template:
            raise ValueError(
                f"{type(self).__name__} has no chat template: encode the prompt as plain text "
                "(drop --chat) or use a checkpoint that ships one"
            )
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **template_vars}
        return _compile_chat_template(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )


@functools.lru_cache(maxsize=16)
def _compile_chat_template(source: str):
    """A jinja template set up the way transformers sets up chat templates, so that the same
    template renders the same text here (sandboxed: templates come with downloaded checkpoints)."""
    from datetime import datetime

    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        # transformers uses {% generation %} to find assistant spans; here it only renders.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(
                lineno
            )

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise ValueError(f"chat template error: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters; chat templates expect plain JSON.
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


# --------------------------------------------------------------------------------------------
# llama2.c / sentencepiece-style BPE with scores
# --------------------------------------------------------------------------------------------

_BYTE_PIECE = re.compile(rb"^<0x([0-9A-Fa-f]{2})>$")


class Llama2cTokenizer(Tokenizer):
    """llama2.c's sentencepiece-style BPE over byte pieces with scores.

    Encoding (llama2.c ``encode``): a dummy-prefix space before non-empty text; one token per
    UTF-8 character, or its bytes as ``<0xXX>`` byte tokens when the character is not in the
    vocabulary; then, while any adjacent pair concatenates to a vocabulary piece, merge the pair
    whose merged piece has the highest score (the leftmost among equal scores).

    Decoding (llama2.c ``decode``): BOS/EOS and control tokens are dropped, the leading space of
    the piece right after BOS is removed (it is the dummy prefix), byte tokens become raw bytes.

    Also serves GGUF files whose tokenizer model is "llama" (sentencepiece): there the control
    tokens (``<s>``, ``[INST]``-style added tokens) written in the text are recognised the way
    llama.cpp does, and the dummy prefix follows ``tokenizer.ggml.add_space_prefix``.
    """

    def __init__(
        self,
        pieces: Sequence[bytes],
        scores: Sequence[float],
        *,
        bos_id: int | None = 1,
        eos_id: int | None = 2,
        add_bos: bool = True,
        add_dummy_prefix: bool = True,
        unk_id: int | None = 0,
        control_ids: Iterable[int] = (),
        text_special_ids: Iterable[int] = (),
        chat_template: str | None = None,
    ):
        if len(pieces) != len(scores):
            raise ValueError(f"{len(pieces)} pieces but {len(scores)} scores")
        self.pieces = list(pieces)
        self.scores = [float(s) for s in scores]
        self.bos_id, self.eos_id, self.unk_id = bos_id, eos_id, unk_id
        self.add_bos, self.add_dummy_prefix = add_bos, add_dummy_prefix
        self.chat_template = chat_template
        self.control_ids = frozenset(control_ids) | {i for i in (bos_id, eos_id) if i is not None}
        self.byte_of_id: dict[int, int] = {}
        byte_ids: dict[int, int] = {}
        for i, p in enumerate(self.pieces):
            m = _BYTE_PIECE.match(p)
            if m:
                self.byte_of_id[i] = int(m.group(1), 16)
                byte_ids.setdefault(int(m.group(1), 16), i)
        self.byte_ids = [byte_ids.get(b, unk_id) for b in range(256)]
        # Control and byte pieces are never spelled by text: the literal characters "<0x41>" must
        # not merge into the byte token for "A" (llama2.c's own tokenizer.bin spells BOS as
        # "\n<s>\n" for the same reason). On duplicate pieces the lowest id wins.
        self.lookup: dict[bytes, int] = {}
        for i, p in enumerate(self.pieces):
            if i not in self.control_ids and i not in self.byte_of_id:
                self.lookup.setdefault(p, i)
        self.bos_token = self._piece_text(bos_id)
        self.eos_token = self._piece_text(eos_id)
        # Special tokens recognised when written in the text (GGUF sentencepiece models only:
        # llama2.c never looks for them).
        self._special_by_text = {self._piece_text(i): i for i in text_special_ids}
        self._special_by_text.pop("", None)
        self._special_split = None
        if self._special_by_text:
            # Longest first, so that a token that is a prefix of another does not win.
            alternatives = sorted(self._special_by_text, key=len, reverse=True)
            self._special_split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")

    def _piece_text(self, i: int | None) -> str:
        return "" if i is None else self.pieces[i].decode("utf-8", errors="replace")

    @classmethod
    def from_file(cls, path: str | Path) -> Llama2cTokenizer:
        """Read llama2.c's tokenizer.bin: int32 max_token_length, then per token float32 score,
        int32 length and that many bytes. BOS = 1, EOS = 2, byte tokens at ids 3..258."""
        raw = Path(path).read_bytes()
        pieces, scores, off = [], [], 4
        try:
            if len(raw) < 4:
                raise ValueError("file shorter than its header")
            while off < len(raw):
                score, length = struct.unpack_from("<fi", raw, off)
                off += 8
                if length < 0 or off + length > len(raw):
                    raise ValueError(f"bad piece length {length} at byte {off - 4}")
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
        ids = [self.bos_id] if bos and self.add_bos and self.bos_id is not None else []
        if self._special_split is None:
            return ids + self._encode_text(text, self.add_dummy_prefix)
        # llama.cpp: text fragments between special tokens are encoded separately, and a
        # fragment gets the dummy prefix when it starts the text or follows a special token.
        prefix = self.add_dummy_prefix
        for k, fragment in enumerate(self._special_split.split(text)):
            if k % 2:  # re.split puts the captured separators at odd positions
                ids.append(self._special_by_text[fragment])
                prefix = self.add_dummy_prefix
            elif fragment:
                ids += self._encode_text(fragment, prefix)
                prefix = False
        return ids

    def _encode_text(self, text: str, dummy_prefix: bool) -> list[int]:
        if not text:
            return []
        if dummy_prefix:
            text = " " + text
        ids = []
        for ch in text:
            b = ch.encode("utf-8")
            tid = self.lookup.get(b)
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(self.byte_ids[x] for x in b)
        return self._merge(ids)

    def _merge(self, ids: list[int]) -> list[int]:
        """Greedy highest-score pair merging, as llama2.c does it, in O(n log n).

        llama2.c rescans every pair after each merge (quadratic in the text length). Here the
        candidate pairs sit in a heap keyed by (-score, position of the left token): positions
        of the surviving tokens keep their order, so the smallest position among the best scores
        is the leftmost pair, the one llama2.c's strict ``>`` scan picks. Entries whose tokens
        have changed since they were pushed are skipped when popped.
        """
        n = len(ids)
        if n < 2:
            return ids
        tok = list(ids)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        pieces, lookup, scores = self.pieces, self.lookup, self.scores

        def candidate(i):
            j = nxt[i]
            merged = lookup.get(pieces[tok[i]] + pieces[tok[j]])
            if merged is None or not scores[merged] > float("-inf"):
                return None
            return (-scores[merged], i, tok[i], j, tok[j], merged)

        heap = [c for i in range(n - 1) if (c := candidate(i)) is not None]
        heapq.heapify(heap)
        while heap:
            _, i, left, j, right, merged = heapq.heappop(heap)
            if tok[i] != left or nxt[i] != j or tok[j] != right:
                continue  # stale: one side was merged away or changed since this was pushed
            tok[i], tok[j] = merged, -1
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prv[nxt[j]] = i
            for k in (prv[i], i):
                if k >= 0 and nxt[k] >= 0 and (c := candidate(k)) is not None:
                    heapq.heappush(heap, c)
        return [t for t in tok if t >= 0]

    def decode(self, ids: Iterable[int]) -> str:
        out, prev = bytearray(), None
        for i in (int(x) for x in ids):
            if i in self.control_ids or not 0 <= i < len(self.pieces):
                prev = i
                continue
            byte = self.byte_of_id.get(i)
            if byte is not None:
                out.append(byte)
            else:
                piece = self.pieces[i]
                if prev == self.bos_id and piece.startswith(b" "):
                    piece = piece[1:]  # the dummy prefix added by encode
                out += piece
            prev = i
        return out.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------
# HF `tokenizers` (tokenizer.json, or rebuilt from GGUF metadata)
# --------------------------------------------------------------------------------------------


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` from tokenizer.json, or rebuilt from GGUF metadata.

    Special tokens written in the text (``<|im_start|>``) are recognised as such, which is what
    encoding an `apply_chat` prompt needs; BOS is added by `encode` itself (``add_bos``), never by
    the tokenizer's post-processor, so ``bos=False`` really means no BOS.
    """

    def __init__(self, tk, *, bos_id=None, eos_id=None, add_bos=False, chat_template=None):
        self.tk = tk
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, bool(add_bos)
        self.chat_template = chat_template
        self.bos_token = (tk.id_to_token(bos_id) or "") if bos_id is not None else ""
        self.eos_token = (tk.id_to_token(eos_id) or "") if eos_id is not None else ""

    @classmethod
    def from_dir(cls, path: str | Path) -> HFTokenizer:
        """tokenizer.json, with BOS/EOS, add_bos_token and chat_template from
        tokenizer_config.json (or chat_template.jinja, where newer transformers save it)."""
        from tokenizers import Tokenizer as TkTokenizer

        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise ValueError(f"{path}: no tokenizer.json in this directory")
        tk = TkTokenizer.from_file(str(path / "tokenizer.json"))
        cfg = {}
        if (path / "tokenizer_config.json").is_file():
            cfg = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))

        def token_id(key):
            tok = cfg.get(key)
            if isinstance(tok, dict):
                tok = tok.get("content")
            return tk.token_to_id(tok) if tok else None

        bos_id, eos_id = token_id("bos_token"), token_id("eos_token")
        add_bos = cfg.get("add_bos_token")
        if add_bos is None and bos_id is not None:
            # Llama-3-style tokenizer.json add BOS in the post-processor instead of saying so.
            probe = tk.encode("a", add_special_tokens=True).ids
            add_bos = bool(probe) and probe[0] == bos_id
        return cls(
            tk,
            bos_id=bos_id,
            eos_id=eos_id,
            add_bos=bool(add_bos),
            chat_template=_chat_template_from_dir(path, cfg),
        )

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        ids = self.tk.encode(text, add_special_tokens=False).ids
        if bos and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tk.decode([int(i) for i in ids], skip_special_tokens=True)


def _chat_template_from_dir(path: Path, cfg: dict) -> str | None:
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


# --------------------------------------------------------------------------------------------
# GGUF metadata
# --------------------------------------------------------------------------------------------

# Pre-tokenizer regexes by GGUF `tokenizer.ggml.pre`, from llama.cpp's llm_tokenizer_bpe (which
# copies them from each model's tokenizer.json). The GPT-2 split is ByteLevel(use_regex=True).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_GPT2 = {"gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion"}
_PRE_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}
_PRE_SPLIT = {
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "stablelm2": _QWEN2_SPLIT,
}
# GGUF token types (llama.cpp's llama_token_type).
_CONTROL, _USER_DEFINED, _BYTE = 3, 4, 6


def _field_value(field):
    """The value of a GGUFReader field: str, int, float, bool, or a list of them.

    `ReaderField.contents()` does this in recent gguf releases; older ones only have `parts` (the
    raw numpy pieces of the record) and `data` (indices of the parts that hold the values).
    """
    if hasattr(field, "contents"):
        return field.contents()
    import gguf

    def value(part, vtype):
        if vtype == gguf.GGUFValueType.STRING:
            return bytes(part).decode("utf-8")
        v = part.tolist()[0]
        return bool(v) if vtype == gguf.GGUFValueType.BOOL else v

    if field.types[0] == gguf.GGUFValueType.ARRAY:
        return [value(field.parts[i], field.types[-1]) for i in field.data]
    return value(field.parts[field.data[0]], field.types[0])


def tokenizer_from_gguf(path_or_reader) -> Tokenizer:
    """Rebuild the tokenizer stored in a GGUF file's metadata.

    path_or_reader: a path, or a parsed file (`specjax.io.gguf_reader.open_gguf`, or any
    `gguf.GGUFReader`): parsing is most of the cost, so a loader that has one passes it.

    tokenizer.ggml.model "gpt2" (byte-level BPE: SmolLM2, Llama 3, Qwen2, ...) becomes an
    `HFTokenizer` with the vocabulary, merges, the pre-tokenizer that ``tokenizer.ggml.pre``
    names, and control tokens as special tokens; "llama" (sentencepiece BPE with scores: Llama 1/2,
    TinyLlama, Mistral) becomes a `Llama2cTokenizer`. Other kinds raise
    `UnsupportedTokenizerError`.
    """
    import gguf

    if isinstance(path_or_reader, gguf.GGUFReader):
        reader, where = path_or_reader, getattr(path_or_reader, "path", "GGUF file")
    else:
        from specjax.io.gguf_reader import open_gguf

        where = str(path_or_reader)
        reader = open_gguf(where)

    def meta(key, default=None):
        field = reader.fields.get(key)
        return default if field is None else _field_value(field)

    kind = meta("tokenizer.ggml.model")
    if kind is None or meta("tokenizer.ggml.tokens") is None:
        raise ValueError(f"{where}: no tokenizer in the GGUF metadata; pass a tokenizer file")
    tokens = list(meta("tokenizer.ggml.tokens"))
    types = list(meta("tokenizer.ggml.token_type", [1] * len(tokens)))
    if len(types) != len(tokens):
        raise ValueError(f"{where}: {len(tokens)} tokens but {len(types)} token types")
    common = dict(
        bos_id=meta("tokenizer.ggml.bos_token_id"),
        eos_id=meta("tokenizer.ggml.eos_token_id"),
        chat_template=meta("tokenizer.chat_template"),
    )
    if kind == "gpt2":
        return _byte_level_bpe(
            tokens,
            types,
            merges=list(meta("tokenizer.ggml.merges", [])),
            pre=meta("tokenizer.ggml.pre", "gpt-2"),
            # llama.cpp's default for BPE vocabularies is no BOS unless the file says so.
            add_bos=bool(meta("tokenizer.ggml.add_bos_token", False)),
            where=where,
            **common,
        )
    if kind == "llama":
        scores = list(meta("tokenizer.ggml.scores", [0.0] * len(tokens)))
        # sentencepiece writes spaces as U+2581; byte tokens keep their "<0xXX>" spelling.
        pieces = [
            t.encode("utf-8") if ty == _BYTE else t.replace("\u2581", " ").encode("utf-8")
            for t, ty in zip(tokens, types, strict=True)
        ]
        return Llama2cTokenizer(
            pieces,
            scores,
            add_bos=bool(meta("tokenizer.ggml.add_bos_token", True)),
            add_dummy_prefix=bool(meta("tokenizer.ggml.add_space_prefix", True)),
            unk_id=meta("tokenizer.ggml.unknown_token_id", 0),
            control_ids=[i for i, ty in enumerate(types) if ty == _CONTROL],
            text_special_ids=[i for i, ty in enumerate(types) if ty in (_CONTROL, _USER_DEFINED)],
            **common,
        )
    raise UnsupportedTokenizerError(
        f"{where}: GGUF tokenizer model {kind!r} is not supported (only 'gpt2' byte-level BPE "
        "and 'llama' sentencepiece BPE); pass a tokenizer.json directory with --tokenizer"
    )


def _byte_level_bpe(tokens, types, *, merges, pre, add_bos, where, **common) -> HFTokenizer:
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as TkTokenizer

    # Merges are "a b" strings; byte-level tokens never contain a plain space (it is "Ġ").
    merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    model = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=merge_pairs,
        # Llama 3's tokenizer.json sets ignore_merges (a whole pre-token that is in the
        # vocabulary is taken as is); llama.cpp does the same for that pre-tokenizer.
        ignore_merges=_PRE_SPLIT.get(pre) is _LLAMA3_SPLIT,
    )
    tk = TkTokenizer(model)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _PRE_DIGITS_THEN_GPT2:
        # SmolLM2's own tokenizer.json splits digits one by one before the GPT-2 split (and
        # llama.cpp's "smollm" regexes do the same); transformers' GGUF loader leaves this out.
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in _PRE_SPLIT:
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_PRE_SPLIT[pre]), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        if pre not in _PRE_GPT2 and pre != "default":
            warnings.warn(
                f"{where}: unknown GGUF pre-tokenizer {pre!r}; using the GPT-2 split, so ids may "
                "differ from the model's own tokenizer around digits and whitespace",
                stacklevel=3,
            )
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()

    # Control tokens are special (matched in text, dropped by decode); user-defined ones are
    # matched in text but decoded like normal text, as in transformers.
    def added(kind, special):
        return [
            AddedToken(t, special=special, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == kind
        ]

    tk.add_special_tokens(added(_CONTROL, True))
    tk.add_tokens(added(_USER_DEFINED, False))
    return HFTokenizer(tk, add_bos=add_bos, **common)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer from a llama2.c tokenizer .bin, a .gguf file, or a directory holding
    tokenizer.json."""
    path = Path(path)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return HFTokenizer.from_dir(path)
    if path.is_file() and path.name == "tokenizer.json":
        return HFTokenizer.from_dir(path.parent)
    if path.is_file():
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == b"GGUF":
            return tokenizer_from_gguf(path)
        if path.suffix == ".bin":
            return Llama2cTokenizer.from_file(path)
    if not path.exists():
        raise ValueError(f"{path}: no such tokenizer file or directory")
    raise ValueError(
        f"{path}: unknown tokenizer format (expected a llama2.c tokenizer .bin, a .gguf file, "
        "or a directory with tokenizer.json)"
    )
