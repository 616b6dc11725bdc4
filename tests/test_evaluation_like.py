"""Training prompts against the evaluation questions: the word-overlap measure, and every prompt
source of the committed answer sets and of new ones held to it."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from specjax.datasets import read_spec_bench
from specjax.train.data import DistillConfig, generated_user_turns, read_answer_settings
from specjax.train.evaluation_like import (
    RESEMBLING,
    REVIEWED,
    SIMILAR,
    evaluation_turns,
    nearest_evaluation,
    resembles_evaluation,
    reviewed,
)

ANSWERS = Path(__file__).resolve().parents[1] / "experiments" / "answers"


def test_nearest_evaluation_ranks_a_rewording_above_other_questions():
    turns = [
        "When a number is divided by 10, the remainder is 4. What is the remainder when twice the "
        "number is divided by 4?",
        "Describe a vivid and unique character, using strong imagery and creative language.",
        "Write a persuasive email to convince your introverted friend to volunteer as a speaker.",
    ]
    prompts = [
        "When a number is divided by 7, the remainder is 6. What is the remainder when twice the "
        "number is divided by 7?",
        "Describe an unusual character in two paragraphs, using strong imagery.",
        "Explain how volcanoes form.",
        "",
    ]
    sim, idx = nearest_evaluation(prompts, turns)
    np.testing.assert_array_equal(idx[:2], [0, 1])
    assert sim[0] > 0.99 and sim[1] > 0.3 and sim[2] < 0.1 and sim[3] == 0
    # A prompt's score is its own: the same with other prompts beside it, in any chunking.
    alone = [nearest_evaluation([p], turns)[0][0] for p in prompts]
    np.testing.assert_allclose(sim, alone, rtol=1e-6)
    np.testing.assert_allclose(nearest_evaluation(prompts, turns, chunk=1)[0], sim, rtol=1e-6)
    # One-letter words (a variable's name) carry no weight.
    assert nearest_evaluation(["Solve for x: x + 2 = 5."], ["What about x?"])[0][0] == 0


def _answer_settings(name: str) -> DistillConfig:
    return read_answer_settings(ANSWERS / name)


@pytest.fixture(scope="module")
def evaluation() -> tuple[list[str], list[str]]:
    return evaluation_turns()


def _unreviewed_near(turns: list[str], evaluation) -> list[str]:
    """The turns at or above SIMILAR that were not judged unlike their nearest evaluation turn."""
    labels, texts = evaluation
    sim, idx = nearest_evaluation(turns, texts)
    return [
        t
        for t, s, i in zip(turns, sim, idx, strict=True)
        if s >= SIMILAR and not reviewed(t, labels[i])
    ]


@pytest.mark.parametrize("name", ["smollm2-synthetic", "smollm2-broad", "smollm2-tasks"])
def test_generators_skip_every_turn_near_an_evaluation_question(name, evaluation):
    """A new answer set of each committed set's settings draws as many turns, none of them
    resembling an evaluation question, and every turn near one by words was read (REVIEWED).
    Without the skip, the committed turns of broad_prompts fail the same check: the measure
    finds the templates written after MT-bench questions."""
    committed = _answer_settings(name)
    clean = dataclasses.replace(committed, skip_evaluation_like=True)
    turns = generated_user_turns(clean)
    assert len(turns) == committed.synthetic_prompts
    assert not any(map(resembles_evaluation, turns))
    assert _unreviewed_near(turns, evaluation) == []
    if committed.prompt_style == "broad":
        near = _unreviewed_near(generated_user_turns(committed), evaluation)
        assert any("remainder when twice the number" in t for t in near)


def test_self_written_turns_near_an_evaluation_question_are_left_out(evaluation):
    cfg = _answer_settings("smollm2-self")
    written = json.loads((ANSWERS / "smollm2-self" / "user_turns.json").read_text())["turns"]
    assert len(written) < cfg.synthetic_prompts  # written as far as the committed shards need
    kept = generated_user_turns(dataclasses.replace(cfg, skip_evaluation_like=True), written)
    # The clean ones in their order (31 of the 2,610 resemble: "fibonacci" in lower case too).
    assert kept == [t for t in written if not resembles_evaluation(t)]
    assert len(written) - len(kept) == 31
    assert _unreviewed_near(kept, evaluation) == []


def test_self_turns_written_in_place_of_skipped_ones(tmp_path, monkeypatch):
    """With skip_evaluation_like, the written list grows until it holds n clean turns, so that
    the first n clean turns (and the windows of shards they fill) do not depend on n."""
    from types import SimpleNamespace

    import specjax.train.self_prompts as self_prompts
    from specjax.train.data import _user_turns

    pool = [
        f"Question {i}: " + ("the Fibonacci numbers" if i % 3 == 0 else "tea") for i in range(99)
    ]
    calls = []

    def write_user_turns(model, tokenizer, path, n, *, seed=0):
        calls.append(n)
        return pool[:n]

    monkeypatch.setattr(self_prompts, "write_user_turns", write_user_turns)
    cfg = DistillConfig(
        kind="chat", synthetic_prompts=10, prompt_style="self", skip_evaluation_like=True
    )
    loaded = SimpleNamespace(model=None, tokenizer=None)
    turns = _user_turns(loaded, cfg, tmp_path, max_shards=None)
    clean = [t for t in pool if not resembles_evaluation(t)]
    assert generated_user_turns(cfg, turns) == clean[:10] and calls[0] == 10
    off = _user_turns(loaded, dataclasses.replace(cfg, skip_evaluation_like=False), tmp_path, None)
    assert off == pool[:10]


def test_every_listed_phrase_occurs_in_a_committed_turn():
    """No stale entries: each phrase of RESEMBLING and REVIEWED names turns that exist."""
    turns = []
    for name in ("smollm2-synthetic", "smollm2-broad", "smollm2-tasks"):
        turns += generated_user_turns(_answer_settings(name))
    turns += json.loads((ANSWERS / "smollm2-self" / "user_turns.json").read_text())["turns"]
    for phrase in [*RESEMBLING, *(p for p, _, _ in REVIEWED)]:
        assert any(phrase in t for t in turns), phrase


def test_committed_settings_keep_their_turns():
    """skip_evaluation_like off (the committed sets, whose manifests predate it) draws what each
    generator always drew, and the written turns as they are; on, the first n clean turns of a
    longer draw."""
    from specjax.train.broad_prompts import broad_prompts
    from specjax.train.prompts import synthetic_prompts
    from specjax.train.task_prompts import task_prompts

    for style, make in (("basic", synthetic_prompts), ("broad", broad_prompts),
                        ("tasks", task_prompts)):  # fmt: skip
        off = DistillConfig(kind="chat", synthetic_prompts=300, prompt_style=style, seed=3)
        assert generated_user_turns(off) == make(300, seed=3)
        on = generated_user_turns(dataclasses.replace(off, skip_evaluation_like=True))
        assert on == [t for t in make(600, seed=3) if not resembles_evaluation(t)][:300]
    written = ["Tell me about Fibonacci.", "Tell me about tea."] * 3
    self_off = DistillConfig(kind="chat", synthetic_prompts=4, prompt_style="self")
    assert generated_user_turns(self_off, written) == written[:4]


def test_drafter_tau_reports_resembled_turns_apart(monkeypatch):
    """experiments/drafter_tau.py's split: the MT-bench turns of RESEMBLED are found among the
    80 in their order, averaged apart, and the pair is compared on the rest only."""
    import importlib.util

    from specjax.datasets import select_questions
    from specjax.paths import repo_dir
    from specjax.train.evaluation_like import RESEMBLED

    path = repo_dir() / "experiments" / "drafter_tau.py"
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location("drafter_tau_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ids = [q.question_id for q in select_questions(read_spec_bench("mt_bench_question.jsonl"), 80)]
    resembled = np.array([i in RESEMBLED["mt_bench"] for i in ids])
    a = np.where(resembled, 4.0, 2.0) + np.arange(80) / 1000
    lines = script.resemblance_lines(
        {"settings": {}, "mt_bench|0|a": list(a), "mt_bench|0|b": list(a - 0.5), "qa|0|a": [1.0]}
    )
    rest = a[~resembled].mean()
    assert resembled.sum() == len(RESEMBLED["mt_bench"])
    assert f"| mt_bench | 0 | a | {a[resembled].mean():.3f} ({resembled.sum()}) | {rest:.3f} " in (
        "\n".join(lines)
    )
    assert any(line.startswith("| mt_bench | 0 | a - b | | +0.500 ± 0.000 |") for line in lines)
    assert not any("| qa |" in line for line in lines)  # no resembled qa turns: no rows
