"""Tokenizers: llama2.c BPE, the GGUF-embedded byte-level BPE, HF tokenizer.json, chat templates."""

import json

import pytest

from specjax.io.tokenizer import HFTokenizer, Llama2cTokenizer, load_tokenizer, tokenizer_from_gguf
from specjax.paths import SMOLLM2, STORIES_TOKENIZER


@pytest.fixture(scope="module")
def tok512(shared_dir):
    path = shared_dir / STORIES_TOKENIZER
    if not path.exists():
        pytest.skip(f"{path} missing")
    return Llama2cTokenizer.from_file(path)


@pytest.fixture(scope="module")
def smol_tok(shared_dir):
    path = shared_dir / SMOLLM2
    if not path.exists():
        pytest.skip(f"{path} missing")
    return tokenizer_from_gguf(path)


def sample_texts(shared_dir, n=30):
    stories = (shared_dir / "data" / "tinystories_dev.txt").read_text().split("\n\n")[:n]
    mt = [
        json.loads(x)["turns"][0]
        for x in (shared_dir / "data" / "mt_bench_question.jsonl").read_text().splitlines()[:n]
    ]
    code = [
        json.loads(x)["turns"][0]
        for x in (shared_dir / "data" / "eagle_humaneval_question.jsonl")
        .read_text()
        .splitlines()[:10]
    ]
    return stories + mt + code + ["Prices: 1234567 and 3.14159 -- éèà 你好 😀\n\n\tend"]


def test_llama2c_known_ids(tok512):
    assert tok512.encode("Once upon a time") == [1, 403, 407, 261, 378]
    assert tok512.encode("Once upon a time", bos=False) == [403, 407, 261, 378]
    assert tok512.encode("") == [1]


def test_llama2c_round_trip(tok512, shared_dir):
    for text in sample_texts(shared_dir):
        ids = tok512.encode(text)
        assert tok512.decode(ids) == text


def test_llama2c_byte_fallback(tok512):
    """Characters outside the 512-token vocabulary become their UTF-8 bytes at id byte + 3."""
    ids = tok512.encode("😀", bos=False)
    assert ids[-4:] == [b + 3 for b in "😀".encode()]
    assert tok512.decode(tok512.encode("a 😀 é b")) == "a 😀 é b"


def test_llama2c_merges_are_greedy_by_score(tok512):
    """No adjacent pair of the output can still be merged (the merge loop ran to completion)."""
    ids = tok512.encode("The little dog played happily in the garden.", bos=False)
    for a, b in zip(ids, ids[1:], strict=False):
        assert tok512.pieces[a] + tok512.pieces[b] not in tok512.lookup


def test_gguf_special_tokens_and_round_trip(smol_tok, shared_dir):
    assert (smol_tok.bos_id, smol_tok.eos_id) == (1, 2)
    assert smol_tok.encode("<|im_start|>user<|im_end|>", bos=False)[0] == 1
    for text in sample_texts(shared_dir, 10):
        assert smol_tok.decode(smol_tok.encode(text, bos=False)) == text


@pytest.mark.hf
def test_gguf_tokenizer_matches_transformers(smol_tok, shared_dir):
    """Same ids as transformers' own GGUF tokenizer conversion, and the same chat prompt.

    One known difference: llama.cpp's "smollm" pre-tokenizer (and the original SmolLM2
    tokenizer.json) split digits one by one before the byte-level split; transformers' GGUF
    converter drops that step. The reference gets the digit split back so that what is compared is
    the vocabulary, merges, special tokens and byte-level handling.
    """
    transformers = pytest.importorskip("transformers")
    from tokenizers import pre_tokenizers

    path = shared_dir / SMOLLM2
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    for text in sample_texts(shared_dir):
        assert smol_tok.encode(text, bos=False) == hf.encode(text, add_special_tokens=False), text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert smol_tok.apply_chat(messages) == hf.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )


def test_hf_tokenizer_dir(smol_tok, tmp_path):
    smol_tok.tk.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "chat_template": smol_tok.chat_template,
            }
        )
    )
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, HFTokenizer)
    text = "Hello world, 42 times!"
    assert loaded.encode(text, bos=False) == smol_tok.encode(text, bos=False)
    assert (loaded.bos_id, loaded.eos_id) == (1, 2)
    msgs = [{"role": "user", "content": "hi"}]
    assert loaded.apply_chat(msgs) == smol_tok.apply_chat(msgs)


def test_unknown_tokenizer_format(tmp_path):
    bad = tmp_path / "vocab.txt"
    bad.write_text("hello")
    with pytest.raises(ValueError, match="unknown tokenizer format"):
        load_tokenizer(bad)


def test_no_chat_template(tok512):
    with pytest.raises(ValueError, match="no chat template"):
        tok512.apply_chat([{"role": "user", "content": "hi"}])
