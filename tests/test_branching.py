"""switch_in_place / cond_in_place: the lax.switch / lax.cond results, with the state updated by
the chosen branch only."""

import chex
import jax
import jax.numpy as jnp
import pytest

from specjax.branching import cond_in_place, switch_in_place


def _branches():
    # Each branch writes its own mark into the state at its own place and returns a summary
    # of a different shape than the state.
    def make(k):
        def run(state, x):
            state = {"cache": state["cache"].at[k].add(x * (k + 1)), "n": state["n"] + k}
            return state, {"sum": jnp.sum(state["cache"]) + k, "k": jnp.int32(k)}

        return run

    return [make(k) for k in range(3)]


@pytest.mark.parametrize("index", [-1, 0, 1, 2, 5])
def test_switch_in_place_equals_lax_switch(index):
    state = {"cache": jnp.arange(12.0).reshape(4, 3), "n": jnp.int32(7)}
    x = jnp.array([1.0, -2.0, 0.5])
    branches = _branches()

    @jax.jit
    def ours(i, state, x):
        return switch_in_place(i, branches, state, x)

    @jax.jit
    def reference(i, state, x):
        return jax.lax.switch(i, branches, state, x)

    got = ours(jnp.int32(index), state, x)
    want = reference(jnp.int32(index), state, x)
    chex.assert_trees_all_close(got, want)
    chosen = min(max(index, 0), 2)
    assert int(got[1]["k"]) == chosen
    # Only the chosen branch touched the state: the other rows are as they were.
    untouched = jnp.array([r for r in range(4) if r != chosen])
    chex.assert_trees_all_close(got[0]["cache"][untouched], state["cache"][untouched])


@pytest.mark.parametrize("pred", [True, False])
def test_cond_in_place_equals_lax_cond(pred):
    state = jnp.arange(6.0)

    def double_head(s, scale):
        return s.at[:2].multiply(scale)

    got = jax.jit(lambda p, s: cond_in_place(p, double_head, s, 3.0))(jnp.bool_(pred), state)
    want = jax.lax.cond(pred, lambda s: double_head(s, 3.0), lambda s: s, state)
    chex.assert_trees_all_close(got, want)


def test_switch_in_place_needs_a_branch():
    with pytest.raises(ValueError, match="at least one branch"):
        switch_in_place(jnp.int32(0), [], jnp.zeros(2))
