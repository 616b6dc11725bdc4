"""Distillation data: answers kept apart from features and rebuilt teacher-forced, settings
guarded, synthetic chat prompts (basic, broad and task prompts)."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import specjax
from specjax.config import TINY, SamplingConfig
from specjax.train.broad_prompts import FAMILIES, broad_prompts, broad_prompts_by_family
from specjax.train.data import (
    DistillConfig,
    add_features,
    build_dataset,
    load_dataset,
    teacher_forced_hidden,
    training_prompts,
)
from specjax.train.prompts import synthetic_prompts
from specjax.train.task_prompts import TASK_FAMILIES, task_prompts, task_prompts_by_family


class ByteTokenizer:
    """Characters to ids below the tiny vocabulary; a chat template so the chat prompt sets
    apply."""

    eos_id = 2
    chat_template = "{{ messages }}"

    def apply_chat(self, messages, add_generation_prompt=True):
        return messages[-1]["content"]

    def encode(self, text, bos=True):
        return ([1] if bos else []) + [3 + ord(c) % (TINY.vocab_size - 3) for c in text[:20]]


@pytest.fixture(scope="module")
def loaded():
    return types.SimpleNamespace(
        model=specjax.Llama(TINY, rngs=nnx.Rngs(0)), tokenizer=ByteTokenizer()
    )


CFG = DistillConfig(
    kind="chat", sets=(), synthetic_prompts=6, temperatures=(0.0,), batch=4, max_new_tokens=12
)


def test_synthetic_prompts_are_deterministic_and_distinct():
    a, b = synthetic_prompts(300, seed=1), synthetic_prompts(300, seed=1)
    assert a == b
    assert len(set(a)) == 300
    assert synthetic_prompts(300, seed=2) != a
    with pytest.raises(ValueError, match="n must be"):
        synthetic_prompts(-1)


def test_broad_prompts_are_deterministic_distinct_and_cover_every_family():
    a = broad_prompts(800, seed=3)
    assert a == broad_prompts(800, seed=3) and len(set(a)) == 800
    assert broad_prompts(800, seed=4) != a
    families = [f for f, _ in broad_prompts_by_family(200, seed=3)]
    assert set(families) == set(FAMILIES)
    assert max(families.count(f) for f in FAMILIES) < 2 * min(families.count(f) for f in FAMILIES)
    with pytest.raises(ValueError, match="n must be"):
        broad_prompts(-1)


def test_task_prompts_are_deterministic_distinct_and_cover_every_family():
    a = task_prompts(1000, seed=3)
    assert a == task_prompts(1000, seed=3) and len(set(a)) == 1000
    assert task_prompts(1000, seed=4) != a
    families = [f for f, _ in task_prompts_by_family(203, seed=3)]
    assert sorted(set(families)) == sorted(TASK_FAMILIES)
    counts = [families.count(f) for f in TASK_FAMILIES]
    assert max(counts) - min(counts) <= 1  # equal proportions
    assert max(len(t) for t in a) <= 1400  # ~300 SmolLM2 tokens
    assert task_prompts(0) == []
    with pytest.raises(ValueError, match="n must be"):
        task_prompts(-1)


def test_task_prompts_share_no_40_characters_with_an_evaluation_question():
    """No stretch of 40 characters (whitespace collapsed, case folded) of a prompt appears in
    MT-bench or an EAGLE question file: passages and templates are not copied from them."""
    from specjax.datasets import SPEC_BENCH_FILES, read_spec_bench

    def norm(text):
        return " ".join(text.split()).lower()

    w = 40
    evaluation = set()
    for name in SPEC_BENCH_FILES:
        for q in read_spec_bench(SPEC_BENCH_FILES[name]):
            for turn in q.turns:
                t = norm(turn)
                evaluation.update(t[i : i + w] for i in range(len(t) - w + 1))
    for text in task_prompts(4096, seed=0):  # the prompts of answer set smollm2-tasks
        t = norm(text)
        shared = [t[i : i + w] for i in range(len(t) - w + 1) if t[i : i + w] in evaluation]
        assert not shared, (shared[0], text)


def test_training_prompts_take_sets_and_synthetic(loaded):
    both = DistillConfig(kind="chat", sets=("alpaca",), synthetic_prompts=5)
    assert len(training_prompts(loaded.tokenizer, both)) == 80 + 5
    with pytest.raises(ValueError, match="never answered"):
        DistillConfig(kind="chat", sets=("mt_bench",))
    # By default a chat target answers generated turns only: no question file is read.
    assert DistillConfig(kind="chat", synthetic_prompts=3).sets == ()
    with pytest.raises(ValueError, match="no prompts: set synthetic_prompts"):
        DistillConfig(kind="chat")
    with pytest.raises(ValueError, match="chat prompts"):
        DistillConfig(kind="story", synthetic_prompts=3)
    broad = DistillConfig(kind="chat", sets=(), synthetic_prompts=7, prompt_style="broad")
    assert len(training_prompts(loaded.tokenizer, broad)) == 7
    tasks = DistillConfig(kind="chat", sets=(), synthetic_prompts=9, prompt_style="tasks")
    assert len(training_prompts(loaded.tokenizer, tasks)) == 9
    with pytest.raises(ValueError, match="unknown prompt_style"):
        DistillConfig(kind="chat", prompt_style="fancy")


def test_features_are_teacher_forced_hidden_states(loaded):
    model = loaded.model
    out = specjax.generate(
        model, [[1, 5, 6], [1, 7]], max_new_tokens=9, sampling=SamplingConfig(temperature=1.0)
    )
    tokens = np.zeros((2, 64), np.int32)
    lengths = np.array([3 + 9, 2 + 9], np.int32)
    tokens[0, :12] = [1, 5, 6, *np.asarray(out.tokens)[0]]
    tokens[1, :11] = [1, 7, *np.asarray(out.tokens)[1]]
    shard = add_features(
        model, {"tokens": tokens, "lengths": lengths, "prompt_lens": np.array([3, 2])}, batch=4
    )
    graphdef, params = nnx.split(model)
    ref = np.asarray(teacher_forced_hidden(graphdef, params, jnp.asarray(tokens)))
    for r, n in enumerate(lengths):
        np.testing.assert_allclose(shard["feats"][r, :n].astype(np.float32), ref[r, :n], atol=2e-2)
        assert np.all(shard["feats"][r, n:] == 0)


@pytest.mark.slow
def test_answers_rebuild_the_same_dataset_without_generating(loaded, tmp_path, monkeypatch):
    answers = tmp_path / "answers"
    build_dataset(loaded, tmp_path / "a", CFG, source="tiny.bin", answers_dir=answers)
    first = load_dataset(tmp_path / "a")
    kept = sorted(answers.glob("shard_*.npz"))
    assert len(kept) == 2 and "feats" not in np.load(kept[0])

    # A fresh feature directory is rebuilt from the kept answers; generating would be a bug.
    import specjax.train.data as data_mod

    def no_generation(*args, **kwargs):
        raise AssertionError("answers exist; nothing should be generated")

    monkeypatch.setattr(data_mod, "make_answers", no_generation)
    build_dataset(loaded, tmp_path / "b", CFG, source="tiny.bin", answers_dir=answers)
    second = load_dataset(tmp_path / "b")
    np.testing.assert_array_equal(first.tokens, second.tokens)
    np.testing.assert_array_equal(first.lengths, second.lengths)
    np.testing.assert_allclose(first.feats, second.feats)
    assert first.answer_tokens > 0

    both = load_dataset(tmp_path / "a", tmp_path / "b")
    assert len(both.lengths) == 2 * len(first.lengths)
    # Per-directory shard counts: the first shard of "a" and all of "b".
    some = load_dataset((tmp_path / "a", 1), (tmp_path / "b", None))
    assert len(some.lengths) == len(first.lengths) + CFG.batch
    with pytest.raises(ValueError, match="3 asked for"):
        load_dataset((tmp_path / "a", 3))

    # Features with a fusion layer: the same last hidden states, plus layer 1's; a directory
    # keeps its fusion layers, and directories with and without them do not mix.
    build_dataset(
        loaded, tmp_path / "f", CFG, source="tiny.bin", answers_dir=answers, fusion_layers=(1,)
    )
    fused = load_dataset(tmp_path / "f")
    np.testing.assert_allclose(fused.feats, first.feats)
    assert first.fusion_feats is None and fused.fusion_feats.shape == first.feats.shape[:2] + (
        1,
        first.feats.shape[2],
    )
    graphdef, params = nnx.split(loaded.model)
    row = jnp.asarray(fused.tokens[:1])
    _, lower = teacher_forced_hidden(graphdef, params, row, (1,))
    n = int(fused.lengths[0])
    np.testing.assert_allclose(
        fused.fusion_feats[0, :n, 0].astype(np.float32), np.asarray(lower)[0, :n, 0], atol=2e-2
    )
    with pytest.raises(ValueError, match="fusion layers"):
        build_dataset(loaded, tmp_path / "f", CFG, source="tiny.bin", answers_dir=answers)
    with pytest.raises(ValueError, match="some shards hold fusion layers"):
        load_dataset(tmp_path / "a", tmp_path / "f")


def test_manifest_from_before_a_setting_existed_reads_as_its_default(loaded, tmp_path):
    """Answer sets written before a DistillConfig field was added stay usable."""
    import json

    answers = tmp_path / "answers"
    build_dataset(loaded, tmp_path / "a", CFG, answers_dir=answers, max_shards=1)
    manifest = json.loads((answers / "manifest.json").read_text())
    del manifest["config"]["prompt_style"], manifest["config"]["sort_window"]
    (answers / "manifest.json").write_text(json.dumps(manifest))
    build_dataset(loaded, tmp_path / "b", CFG, answers_dir=answers, max_shards=1)
    broad = DistillConfig(**{**CFG.__dict__, "prompt_style": "broad"})
    with pytest.raises(ValueError, match="other settings"):
        build_dataset(loaded, tmp_path / "c", broad, answers_dir=answers)


def test_sort_window_keeps_every_window_together(loaded, tmp_path):
    """With sort_window the first shards hold the first prompts (sorted within the window)."""
    windowed = DistillConfig(**{**CFG.__dict__, "sort_window": 1, "synthetic_prompts": 8})
    prompts = training_prompts(loaded.tokenizer, windowed)
    data = load_dataset(build_dataset(loaded, tmp_path / "w", windowed, max_shards=1))
    got = sorted(tuple(r[:n]) for r, n in zip(data.tokens, data.prompt_lens, strict=True))
    assert got == sorted(tuple(p) for p in prompts[: CFG.batch])


def test_other_settings_are_refused(loaded, tmp_path):
    answers = tmp_path / "answers"
    build_dataset(loaded, tmp_path / "a", CFG, answers_dir=answers, max_shards=1)
    assert len(list(answers.glob("shard_*.npz"))) == 1
    other = DistillConfig(
        kind="chat", sets=(), synthetic_prompts=6, temperatures=(1.0,), batch=4, max_new_tokens=12
    )
    with pytest.raises(ValueError, match="other settings"):
        build_dataset(loaded, tmp_path / "c", other, answers_dir=answers)


def test_sampled_answers_depend_on_the_shard_key(loaded, tmp_path):
    sampled = DistillConfig(
        kind="chat",
        sets=(),
        synthetic_prompts=8,
        temperatures=(1.0, 1.0),
        batch=8,
        max_new_tokens=12,
    )
    data = load_dataset(build_dataset(loaded, tmp_path / "s", sampled))
    # The same prompts answered twice at T=1 under two shard keys: not the same answers.
    assert not np.array_equal(data.tokens[:8], data.tokens[8:])
    assert jax.numpy.all(jnp.asarray(data.lengths) > jnp.asarray(data.prompt_lens))


def test_story_answers_written_with_the_old_sets_default_stay_usable(tmp_path):
    """Story manifests recorded the old chat default of `sets` (question files a story target
    never reads): the new default reads the same data; a chat manifest's sets still count, and
    so does the model the data came from."""
    import json

    from specjax.train.data import EAGLE_QUESTION_SETS, _check_manifest

    story = DistillConfig(kind="story")
    old = {**dataclasses.asdict(story), "sets": list(EAGLE_QUESTION_SETS)}
    (tmp_path / "manifest.json").write_text(json.dumps({"config": old}))
    _check_manifest(tmp_path, {"config": json.loads(json.dumps(dataclasses.asdict(story)))})
    chat = json.loads(json.dumps(dataclasses.asdict(CFG)))
    (tmp_path / "manifest.json").write_text(json.dumps({"config": {**chat, "sets": ["sum"]}}))
    with pytest.raises(ValueError, match="other settings"):
        _check_manifest(tmp_path, {"config": chat})
    # Another model's data is refused too (the source's file name: checkouts differ in paths).
    (tmp_path / "manifest.json").write_text(json.dumps({"source": "/a/m1.gguf", "config": chat}))
    _check_manifest(tmp_path, {"source": "/b/m1.gguf", "config": chat})
    with pytest.raises(ValueError, match=r"another model \(m1.gguf\), not m2.gguf"):
        _check_manifest(tmp_path, {"source": "/a/m2.gguf", "config": chat})


def test_answers_to_evaluation_like_prompts_are_left_out():
    """Rows whose prompt text comes from a template written after an evaluation question are
    dropped (found by the text, so committed answers serve unchanged); the rest keep every
    array row for row."""
    from specjax.train.data import Dataset, drop_evaluation_like
    from specjax.train.evaluation_like import resembles_evaluation

    assert resembles_evaluation("<|im_start|>user\nIf f(x) = 3x^3 - 2x + 5, find f(3).")
    assert not resembles_evaluation("Summarize the paragraph below in two sentences.")
    prompts = ["Tell me about tea.", "Here are reviews:\n1. This movie was slow.", "Write a haiku."]
    # Token i of a row stands for character i of its prompt; answers follow.
    width = 48
    tokens = np.zeros((3, width), np.int32)
    for r, p in enumerate(prompts):
        tokens[r, : len(p)] = [ord(c) for c in p]
    lengths = np.array([len(p) + 5 for p in prompts], np.int32)
    data = Dataset(
        tokens=tokens,
        feats=np.arange(3 * width * 2, dtype=np.float16).reshape(3, width, 2),
        lengths=lengths,
        prompt_lens=np.array([len(p) for p in prompts], np.int32),
    )
    kept, dropped = drop_evaluation_like(data, lambda ids: "".join(map(chr, ids)))
    assert dropped == 1 and kept.fusion_feats is None
    for name in ("tokens", "feats", "lengths", "prompt_lens"):
        np.testing.assert_array_equal(getattr(kept, name), getattr(data, name)[[0, 2]])
