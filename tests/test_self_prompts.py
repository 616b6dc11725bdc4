"""User turns the target writes itself (specjax.train.self_prompts): which turns are kept, how a
list grows, and the answer set built on them."""

import json
import types

import numpy as np
import pytest
from flax import nnx

import specjax
import specjax.decode
import specjax.train.self_prompts as self_prompts
from specjax.config import TINY
from specjax.datasets import read_spec_bench
from specjax.train.data import DistillConfig, build_dataset, load_dataset
from specjax.train.self_prompts import keep_turn, ngrams, read_turns, write_user_turns

EOS = 2
FIXED = list(range(10, 18))  # the words w10 ... w17


class WordTokenizer:
    """Ids 3.. are the words w3, w4, ...; a chat template with a user header."""

    eos_id = EOS
    chat_template = "<user>"

    def apply_chat(self, messages, add_generation_prompt=True):
        return "w5 w6 " + messages[-1]["content"] + " w7"

    def encode(self, text, bos=True):
        words = [w for w in text.split() if w.startswith("w") and w[1:].isdigit()]
        return ([1] if bos else []) + [int(w[1:]) % TINY.vocab_size for w in words]

    def decode(self, ids):
        return " ".join(f"w{i}" for i in ids)


def fake_generate(model, prompts, *, max_new_tokens, sampling, key, eos_id):
    """Rows of random words from the key, at most 20 tokens when they end: a quarter never reach
    EOS, one repeats row 0, one is too short, one is FIXED in every batch."""
    import jax

    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    b = len(prompts)
    tokens = rng.integers(3, 40, size=(b, max_new_tokens))
    lengths = np.full(b, max_new_tokens)
    for i in range(b):
        if i % 4 != 3:  # rows 3, 7, ... run to max_new_tokens without EOS
            lengths[i] = rng.integers(6, min(max_new_tokens, 20))
            tokens[i, lengths[i] - 1] = eos_id
    tokens[1], lengths[1] = tokens[0], lengths[0]
    tokens[2, 2], lengths[2] = eos_id, 3  # two words
    tokens[4, :9], lengths[4] = [*FIXED, eos_id], 9  # the same 8 words in every batch
    return types.SimpleNamespace(tokens=tokens, lengths=lengths)


@pytest.fixture
def no_target(monkeypatch):
    monkeypatch.setattr(specjax.decode, "generate", fake_generate)
    monkeypatch.setattr(self_prompts, "evaluation_ngrams", lambda n=8: set())


def test_turns_sharing_a_run_of_words_with_an_evaluation_turn_are_dropped():
    excluded = self_prompts.evaluation_ngrams()
    question = read_spec_bench("mt_bench_question.jsonl")[0].turns[0]
    run = " ".join(question.split()[:10])
    assert not keep_turn(f"Please help: {run}, thanks", True, set(), excluded)
    assert not keep_turn(run.upper(), True, set(), excluded)  # case and punctuation ignored
    fresh = "Can you suggest three names for a bakery that sells only rye bread?"
    assert not ngrams(fresh) & excluded
    assert keep_turn(fresh, True, set(), excluded)
    assert not keep_turn(fresh, False, set(), excluded)  # did not end
    assert not keep_turn(fresh, True, {fresh}, excluded)  # a repeat
    assert not keep_turn("Hi there", True, set(), excluded)  # too short


def test_a_grown_list_extends_the_first(no_target, tmp_path):
    model, tok = object(), WordTokenizer()
    first = write_user_turns(model, tok, tmp_path / "a.json", 5, seed=3, batch=8, max_tokens=12)
    grown = write_user_turns(model, tok, tmp_path / "a.json", 20, seed=3, batch=8, max_tokens=12)
    at_once = write_user_turns(model, tok, tmp_path / "b.json", 20, seed=3, batch=8, max_tokens=12)
    assert len(first) == 5 and len(grown) == 20
    assert grown[:5] == first and grown == at_once
    state = read_turns(tmp_path / "a.json")
    assert state == json.loads((tmp_path / "b.json").read_text())
    # Each batch of 8 drops its 2 unfinished rows, its repeat and its short row, and every batch
    # after the first its FIXED row (a repeat of the first batch's).
    assert state["dropped"] == 5 * state["batches"] - 1
    assert len(set(state["turns"])) == len(state["turns"])
    assert "evaluation_overlaps" not in state
    other = write_user_turns(model, tok, tmp_path / "c.json", 20, seed=4, batch=8, max_tokens=12)
    assert other != grown
    with pytest.raises(ValueError, match="seed 3"):
        write_user_turns(model, tok, tmp_path / "a.json", 30, seed=4)


def test_turns_that_overlap_an_evaluation_turn_are_counted_apart(no_target, monkeypatch, tmp_path):
    fixed = WordTokenizer().decode(FIXED)
    monkeypatch.setattr(self_prompts, "evaluation_ngrams", lambda n=8: ngrams(fixed))
    turns = write_user_turns(object(), WordTokenizer(), tmp_path / "t.json", 20, seed=3, batch=8,
                             max_tokens=12)  # fmt: skip
    state = read_turns(tmp_path / "t.json")
    assert fixed not in turns
    assert state["evaluation_overlaps"] == state["batches"]
    assert state["dropped"] == 5 * state["batches"]


def test_a_target_that_never_ends_a_turn_is_an_error(monkeypatch, tmp_path):
    def endless(model, prompts, *, max_new_tokens, **_):
        b = len(prompts)
        return types.SimpleNamespace(
            tokens=np.full((b, max_new_tokens), 9), lengths=np.full(b, max_new_tokens)
        )

    monkeypatch.setattr(specjax.decode, "generate", endless)
    monkeypatch.setattr(self_prompts, "evaluation_ngrams", lambda n=8: set())
    with pytest.raises(RuntimeError, match="EOS id"):
        write_user_turns(object(), WordTokenizer(), tmp_path / "t.json", 4, batch=2)


def test_the_self_answer_set_answers_the_written_turns(no_target, tmp_path, monkeypatch):
    import specjax.train.data as data_mod

    loaded = types.SimpleNamespace(
        model=specjax.Llama(TINY, rngs=nnx.Rngs(0)), tokenizer=WordTokenizer()
    )
    cfg = DistillConfig(
        kind="chat", sets=(), synthetic_prompts=40, prompt_style="self", sort_window=2,
        temperatures=(0.0,), batch=4, max_new_tokens=6,
    )  # fmt: skip
    with pytest.raises(ValueError, match="answers_dir"):
        build_dataset(loaded, tmp_path / "f0", cfg, source="tiny.bin")
    monkeypatch.setattr(data_mod, "make_answers", lambda model, prompts, **kw: _answers(prompts))
    answers = tmp_path / "answers"
    build_dataset(loaded, tmp_path / "f", cfg, source="tiny.bin", answers_dir=answers,
                  max_shards=3)  # fmt: skip
    state = read_turns(answers / self_prompts.TURNS_FILE)
    # Three shards need the whole second window of 2 shards: 16 turns (the last batch may add).
    assert len(state["turns"]) >= 16
    data = load_dataset(tmp_path / "f")
    prompts = {tuple(t[:n]) for t, n in zip(data.tokens, data.prompt_lens, strict=True)}
    wanted = {tuple(WordTokenizer().encode(f"w5 w6 {t} w7", bos=False))
              for t in state["turns"][:16]}  # fmt: skip
    assert len(prompts) == 12 and prompts <= wanted


def _answers(prompts):
    """An answer shard of three tokens after each prompt."""
    lengths = np.array([len(p) + 3 for p in prompts], np.int32)
    tokens = np.zeros((len(prompts), 64), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p) + 3] = list(p) + [3, 4, 5]
    return {
        "tokens": tokens,
        "lengths": lengths,
        "prompt_lens": np.array([len(p) for p in prompts], np.int32),
    }


def test_chat_targets_calibrate_on_self_written_turns(no_target):
    from specjax.calibration import CALIBRATION_SEED, calibration_prompts, ensure_pair_profiles

    tok = WordTokenizer()
    prompts, description = calibration_prompts("chat", object(), tok, n=6)
    assert len(prompts) == 6 and f"seed {CALIBRATION_SEED}" in description
    # Each prompt is a written turn inside the chat template (user header w5 w6, end w7).
    assert all(p[:2] == [5, 6] and p[-1] == 7 and len(p) > 6 for p in prompts)
    again, _ = calibration_prompts("chat", object(), tok, n=6)
    assert again == prompts

    # A drafter with its own checkpoint profile never asks for calibration prompts.
    def refuse():
        raise AssertionError("prompts were written for a drafter that has a profile")

    ensure_pair_profiles(object(), types.SimpleNamespace(checkpoint_dir="x"), refuse)
