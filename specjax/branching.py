"""Choosing one of a few computations at run time without copying the buffers they update.

`lax.switch` and `lax.cond` pass their operands into the chosen branch, and XLA:CPU copies an
operand that a branch updates in place: with a KV cache among the operands, every call pays a
copy of the whole cache. Measured on a 2-core Xeon (experiments/switch_cost.py: SmolLM2-135M,
batch 1, the target's forward over 8 nodes inside a `lax.switch` of an 8- and a 16-node
branch): +1.7 ms a call at a 256-position cache, +3.2 ms at 512, +15.0 ms at 2048, against a
forward of 29-40 ms. A `lax.while_loop` updates its carry in place (the speculative loop itself
relies on it), so `switch_in_place` runs each branch inside a while loop of zero or one trip:
only the chosen branch runs, and the updated buffers stay where they are (the same experiment:
no measurable cost at any cache size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp


def switch_in_place(
    index: jax.Array,
    branches: Sequence[Callable],
    state,
    *operands,
):
    """branches[index](state, *operands) -> (new_state, out), with `state` updated in place.

    state: the pytree the branches update (e.g. a KV cache); every branch returns a new_state of
    the same structure, shapes and dtypes. out: any pytree, the same structure, shapes and dtypes
    in every branch (as lax.switch requires); it starts as zeros, so keep large buffers in state.
    operands are read only. index: int32 scalar; an index outside [0, len(branches)) is clamped,
    as lax.switch does. Returns (new_state, out)."""
    if not branches:
        raise ValueError("switch_in_place needs at least one branch")
    index = jnp.clip(jnp.asarray(index, jnp.int32), 0, len(branches) - 1)
    out_shape = jax.eval_shape(lambda s: branches[0](s, *operands)[1], state)
    out = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), out_shape)
    for k, branch in enumerate(branches):
        state, out = _run_if(index == k, branch, state, out, operands)
    return state, out


def cond_in_place(pred: jax.Array, true_fn: Callable, state, *operands):
    """true_fn(state, *operands) -> new_state where pred [scalar bool], else state unchanged;
    the lax.cond(pred, true_fn, identity, state) that updates `state` in place."""
    return _run_if(pred, lambda s, *ops: (true_fn(s, *ops), None), state, None, operands)[0]


def _run_if(pred, branch, state, out, operands):
    def going(carry):
        return ~carry[0]

    def once(carry):
        _, s, _ = carry
        s, o = branch(s, *operands)
        return jnp.bool_(True), s, o

    _, state, out = jax.lax.while_loop(going, once, (~jnp.asarray(pred, bool), state, out))
    return state, out
