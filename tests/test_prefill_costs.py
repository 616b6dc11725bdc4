"""The prefill's measured cost (specjax.prefill_costs) and the whole call's predicted speedup
that uses it (specjax.choice.Choice.for_call)."""

import chex
import pytest
from flax import nnx

import specjax
from specjax import prefill_costs
from specjax.choice import Choice
from specjax.config import TINY, SpecConfig, TreeConfig
from specjax.prefill_costs import bracket, keep_prefill_seconds, prefill_seconds


def test_bracket_is_the_powers_of_two_around_the_width():
    assert bracket(1) == (16, 16)
    assert bracket(16) == (16, 16)
    assert bracket(17) == (16, 32)
    assert bracket(64) == (64, 64)
    assert bracket(100) == (64, 128)


def test_prefill_seconds_interpolates_between_kept_widths(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    target = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    keep_prefill_seconds(target, batch=1, width=16, seconds=1.0)
    keep_prefill_seconds(target, batch=1, width=32, seconds=3.0)

    def never(*args, **kwargs):
        raise AssertionError("a kept width was measured again")

    monkeypatch.setattr(prefill_costs, "measure_prefill", never)
    assert prefill_seconds(target, batch=1, width=24) == pytest.approx(2.0)
    assert prefill_seconds(target, batch=1, width=16) == pytest.approx(1.0)
    assert prefill_seconds(target, batch=1, width=32) == pytest.approx(3.0)
    with pytest.raises(AssertionError, match="measured again"):  # another batch: not kept
        prefill_seconds(target, batch=2, width=16)
    with pytest.raises(ValueError, match="width >= 1"):
        prefill_seconds(target, batch=1, width=0)


def test_a_width_is_measured_once_with_a_progress_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    target = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    lines = []
    first = prefill_seconds(target, batch=2, width=16, progress=lines.append)
    assert first > 0 and lines == ["measuring the prefill: 2 row(s) of 16 tokens"]
    assert len(list((tmp_path / "costs").glob("prefill-*.json"))) == 1
    again = prefill_seconds(target, batch=2, width=16, progress=lines.append)
    assert again == first and len(lines) == 1


def test_call_speedup_counts_the_prefill():
    tree = SpecConfig(tree=TreeConfig.chain(2))
    # tau 2 at 1.5 s a step against 1 s a plain token: 1.33x per decoded token.
    choice = Choice(tree, predicted_tau=2.0, seconds_per_step=1.5, ar_seconds_per_token=1.0,
                    candidates=3)  # fmt: skip
    assert choice.predicted_speedup == pytest.approx(4 / 3)  # no call: the steps alone
    call = choice.for_call(new_tokens=10, prefill_seconds=1.0, choose_seconds=0.5)
    # plain: 1 + 10 x 1; speculative: 1 + 0.5 (choosing, less than the prefill) + 10 / 2 x 1.5
    assert call.predicted_speedup == pytest.approx(11 / 9.0)
    assert call.step_speedup == pytest.approx(4 / 3)
    stats = call.stats()
    chex.assert_trees_all_close(
        (stats["predicted_speedup"], stats["predicted_step_speedup"], stats["prefill_s"],
         stats["choose_s"]),
        (11 / 9.0, 4 / 3, 1.0, 0.5),
    )  # fmt: skip
    # A call that measured costs (choosing longer than its prefill): reported, not predicted.
    measuring = choice.for_call(new_tokens=10, prefill_seconds=1.0, choose_seconds=30.0)
    assert measuring.predicted_speedup == pytest.approx(11 / 8.5)
    # The default call that decodes plainly pays its choosing too.
    plain = Choice(None, 1.0, 1.0, 1.0, candidates=3).for_call(
        new_tokens=10, prefill_seconds=1.0, choose_seconds=0.5
    )
    assert plain.predicted_speedup == pytest.approx(11 / 11.5)
