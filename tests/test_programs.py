"""specjax.programs: the default call keeps a tree it has compiled unless a switch is predicted
to pay for its compile."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from auto_checks import kept_costs_call

import specjax
from specjax import api, programs
from specjax.choice import Choice
from specjax.config import SpecConfig, TreeConfig

CHAIN2, CHAIN3 = TreeConfig.chain(2), TreeConfig.chain(3)


@pytest.fixture(autouse=True)
def _forget_shapes():
    programs.reset()
    yield
    programs.reset()


def _choice() -> Choice:
    """chain 3 best (64 tokens: 64 / 2.4 x 0.05 = 1.333 s), chain 2 close behind (1.336 s)."""
    return Choice(SpecConfig(tree=CHAIN3), 2.4, 0.05, 0.032, 2,
                  alternatives=((CHAIN3, 2.4, 0.05), (CHAIN2, 2.3, 0.048)))  # fmt: skip


def test_a_compiled_tree_is_kept_until_a_switch_pays_for_its_compile():
    shape = ("target", "drafter", "greedy", 1, 16, 64)
    choice = _choice()
    assert programs.keep_compiled(choice, shape, 64) is choice  # a first call: as chosen
    programs.record(shape, None, None, CHAIN2, compile_s=3.0)
    kept = programs.keep_compiled(choice, shape, 64)
    assert kept.config == SpecConfig(tree=CHAIN2) and kept.kept_compiled
    assert (kept.predicted_tau, kept.seconds_per_step) == (2.3, 0.048)
    assert kept.stats()["kept_compiled"] is True
    # ~2.3 ms saved a call: after 1,500 calls of the shape the switch pays for a 3 s compile.
    for _ in range(1199):
        programs.record(shape, None, None, CHAIN2, compile_s=0.0)
    assert programs.keep_compiled(choice, shape, 64).kept_compiled  # 1,200 x 2.3 ms < 3 s
    for _ in range(300):
        programs.record(shape, None, None, CHAIN2, compile_s=0.0)
    assert programs.keep_compiled(choice, shape, 64) is choice
    # Another shape (other new tokens) has compiled nothing: as chosen.
    assert programs.keep_compiled(choice, shape[:-1] + (32,), 32) is choice


def test_a_compiled_tree_that_no_longer_beats_plain_decoding_is_not_kept():
    shape = ("target", "drafter", "greedy", 1, 16, 64)
    programs.record(shape, None, None, CHAIN2, compile_s=3.0)
    slow = dataclasses.replace(_choice(), ar_seconds_per_token=0.02)  # chain 2: 0.96x
    assert programs.keep_compiled(slow, shape, 64) is slow


def test_compile_seconds_count_a_jit_compile():
    before = programs.compile_seconds()
    jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.25)(jnp.arange(7.0)).block_until_ready()
    assert programs.compile_seconds() > before


def test_the_default_call_keeps_its_compiled_tree_and_stays_exact(tmp_path, monkeypatch):
    """A second default call whose best tree moved (as an acceptance shift moves it) runs the
    tree the first call compiled, reports so, and gives generate's greedy tokens."""
    target, drafter, auto, prompts, ref = kept_costs_call(tmp_path, monkeypatch, adapt=False)
    first = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=12, config=auto)
    assert first.stats["tree"] == "branching(1,1)" and not first.stats["kept_compiled"]
    chosen = api.resolve_auto

    def moved(*args, **kwargs):  # the best is now a one-node tree, the chain of 2 just behind
        choice = chosen(*args, **kwargs)
        one = TreeConfig.chain(1)
        return dataclasses.replace(
            choice, config=dataclasses.replace(choice.config, tree=one),
            alternatives=((one, 1.5, 1.01), *choice.alternatives),
        )  # fmt: skip

    monkeypatch.setattr(api, "resolve_auto", moved)
    second = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=12, config=auto)
    assert second.stats["tree"] == "branching(1,1)" and second.stats["kept_compiled"]
    for out in (first, second):
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
