"""Training prompts against the evaluation questions: the word-overlap measure, and every prompt
source of the committed answer sets and of new ones held to it."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from specjax.datasets import SPEC_BENCH_FILES, read_spec_bench
from specjax.train.data import DistillConfig, generated_user_turns
from specjax.train.evaluation_like import (
    RESEMBLING,
    REVIEWED,
    SIMILAR,
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
    config = json.loads((ANSWERS / name / "manifest.json").read_text())["config"]
    return DistillConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})


@pytest.fixture(scope="module")
def evaluation_turns() -> list[str]:
    return [t for path in SPEC_BENCH_FILES.values() for q in read_spec_bench(path) for t in q.turns]


def _unreviewed_near(turns: list[str], evaluation_turns: list[str]) -> list[str]:
    sim, _ = nearest_evaluation(turns, evaluation_turns)
    return [t for t, s in zip(turns, sim, strict=True) if s >= SIMILAR and not reviewed(t)]


@pytest.mark.parametrize("name", ["smollm2-synthetic", "smollm2-broad", "smollm2-tasks"])
def test_generators_skip_every_turn_near_an_evaluation_question(name, evaluation_turns):
    """A new answer set of each committed set's settings draws as many turns, none of them
    resembling an evaluation question, and every turn near one by words was read (REVIEWED).
    Without the skip, the committed turns of broad_prompts fail the same check: the measure
    finds the templates written after MT-bench questions."""
    committed = _answer_settings(name)
    clean = dataclasses.replace(committed, skip_evaluation_like=True)
    turns = generated_user_turns(clean)
    assert len(turns) == committed.synthetic_prompts
    assert not any(map(resembles_evaluation, turns))
    assert _unreviewed_near(turns, evaluation_turns) == []
    if committed.prompt_style == "broad":
        near = _unreviewed_near(generated_user_turns(committed), evaluation_turns)
        assert any("remainder when twice the number" in t for t in near)


def test_self_written_turns_near_an_evaluation_question_are_left_out(evaluation_turns):
    cfg = _answer_settings("smollm2-self")
    written = json.loads((ANSWERS / "smollm2-self" / "user_turns.json").read_text())["turns"]
    kept = generated_user_turns(dataclasses.replace(cfg, skip_evaluation_like=True), written)
    # Written turns are only filtered: fewer remain, in their order.
    assert 0 < len(kept) < cfg.synthetic_prompts and kept == [
        t for t in written[: cfg.synthetic_prompts] if not resembles_evaluation(t)
    ]
    assert _unreviewed_near(kept, evaluation_turns) == []


def test_every_listed_phrase_occurs_in_a_committed_turn():
    """No stale entries: each phrase of RESEMBLING and REVIEWED names turns that exist."""
    turns = []
    for name in ("smollm2-synthetic", "smollm2-broad", "smollm2-tasks"):
        turns += generated_user_turns(_answer_settings(name))
    turns += json.loads((ANSWERS / "smollm2-self" / "user_turns.json").read_text())["turns"]
    for phrase in [*RESEMBLING, *(p for p, _, _ in REVIEWED)]:
        assert any(phrase in t for t in turns), phrase


def test_committed_settings_keep_their_turns():
    """skip_evaluation_like off (the committed sets, whose manifests predate it) draws what the
    generators always drew; on, the first n clean turns of a longer draw."""
    from specjax.train.broad_prompts import broad_prompts

    off = DistillConfig(kind="chat", synthetic_prompts=300, prompt_style="broad", seed=3)
    assert generated_user_turns(off) == broad_prompts(300, seed=3)
    on = generated_user_turns(dataclasses.replace(off, skip_evaluation_like=True))
    assert on == [t for t in broad_prompts(600, seed=3) if not resembles_evaluation(t)][:300]
    assert len(on) == 300


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
