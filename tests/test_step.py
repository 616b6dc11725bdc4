"""The speculative step on its own (SpeculativeLoop.step): what one step commits, emits and
leaves alone, checked against plain decoding without running the while_loop."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_lossless_e2e import CFG, sharpened

import specjax
from specjax.cache import tree_reserve
from specjax.config import SamplingConfig, SpecConfig, TreeConfig
from specjax.decode import prepare_keys, prepare_prompts
from specjax.speculative import SpeculativeLoop

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 1], [3]]
MAX_NEW = 12


@pytest.fixture(scope="module")
def target():
    return sharpened(CFG, 3, 3.0)


def _loop_fns(target, drafter, tree, max_new=MAX_NEW):
    """Jitted init and step of a SpeculativeLoop (modules split outside, merged inside)."""
    config = SpecConfig(tree=tree)
    parts = [nnx.split(m) for m in (target, drafter, specjax.FullVerifier())]
    defs = [d for d, _ in parts]
    params = [p for _, p in parts]

    def make(params):
        t, d, v = (nnx.merge(g, p) for g, p in zip(defs, params, strict=True))
        return SpeculativeLoop(
            target=t,
            drafter=d,
            verifier=v,
            config=config,
            sampling=SamplingConfig(),
            max_new_tokens=max_new,
        )

    init = jax.jit(lambda params, ids, lens, keys: make(params).init(ids, lens, keys, -1))
    step = jax.jit(lambda params, state: make(params).step(state))
    return params, init, step


@pytest.mark.parametrize(
    "tree",
    [
        pytest.param(TreeConfig.chain(3), id="chain3"),
        pytest.param(TreeConfig(branching=(2, 2, 1)), id="tree221", marks=pytest.mark.slow),
    ],
)
def test_one_step_commits_what_it_emits(target, tree):
    drafter = specjax.LMDrafter.self_draft(1)
    ids, lens = prepare_prompts(
        PROMPTS, target.config, MAX_NEW, tree_reserve(tree.num_nodes, tree.max_depth)
    )
    keys = prepare_keys(None, len(PROMPTS))
    params, init, step = _loop_fns(target, drafter, tree)
    state = init(params, jnp.asarray(ids), jnp.asarray(lens), keys)
    chex.assert_trees_all_equal(state.verifier_state.lengths, jnp.asarray(lens))
    ref = np.asarray(specjax.generate(target, PROMPTS, max_new_tokens=MAX_NEW).tokens)

    after = step(params, state)
    n_acc = np.asarray(after.accepted_hist).argmax(1)  # one step: a single count per row
    np.testing.assert_array_equal(np.asarray(after.accepted_hist).sum(1), 1)
    # Every row advances by its accepted drafts + 1 and emits exactly plain decoding's tokens.
    np.testing.assert_array_equal(np.asarray(after.verifier_state.lengths), lens + n_acc + 1)
    np.testing.assert_array_equal(np.asarray(after.n_generated), 1 + n_acc + 1)
    for b in range(len(PROMPTS)):
        n = int(after.n_generated[b])
        np.testing.assert_array_equal(np.asarray(after.tokens[b, :n]), ref[b, :n])
        assert int(after.root[b]) == ref[b, n - 1]
    # The committed cache equals a fresh prefill of prompt + the emitted tokens (the pending root
    # excluded): the accepted nodes' K/V were moved into place. Checked on the row that accepted
    # the most drafts (a row that accepted none moved nothing).
    b = int(n_acc.argmax())
    assert n_acc[b] >= 1, n_acc
    seq = PROMPTS[b] + ref[b, : int(after.n_generated[b]) - 1].tolist()
    cache = specjax.cache.init_cache(target.config, 1, after.verifier_state.max_len)
    _, fresh, _ = specjax.decode.prefill(
        target, jnp.asarray([seq]), jnp.asarray([len(seq)]), cache, "reference"
    )
    for name in ("k", "v"):
        np.testing.assert_allclose(
            np.asarray(getattr(after.verifier_state, name)[:, b, : len(seq)]),
            np.asarray(getattr(fresh, name)[:, 0, : len(seq)]),
            atol=1e-5,
            err_msg=name,
        )


def test_finished_rows_do_not_move(target):
    """A row that is done stays as it is, whatever the step computes for it."""
    tree = TreeConfig.chain(2)
    drafter = specjax.LMDrafter.self_draft(1)
    ids, lens = prepare_prompts(PROMPTS, target.config, MAX_NEW, tree_reserve(3, 2))
    params, init, step = _loop_fns(target, drafter, tree)
    state = init(params, jnp.asarray(ids), jnp.asarray(lens), prepare_keys(None, 3))
    state = state.replace(done=jnp.asarray([False, True, False]))
    after = step(params, state)
    assert int(after.verifier_state.lengths[1]) == lens[1]
    assert int(after.n_generated[1]) == 1
    assert int(after.target_calls[1]) == 0
    np.testing.assert_array_equal(np.asarray(after.tokens[1]), np.asarray(state.tokens[1]))
    assert (np.asarray(after.verifier_state.lengths)[[0, 2]] > lens[[0, 2]]).all()


def test_row_finishing_at_its_budget_keeps_its_length(target):
    """The step that reaches max_new_tokens does not advance the row's cache: later steps (while
    other rows run) stay inside the reserved slots."""
    tree = TreeConfig.chain(3)
    drafter = specjax.LMDrafter.self_draft(2)
    ids, lens = prepare_prompts(PROMPTS, target.config, 2, tree_reserve(4, 3))
    params, init, step = _loop_fns(target, drafter, tree, max_new=2)
    state = init(params, jnp.asarray(ids), jnp.asarray(lens), prepare_keys(None, 3))
    after = step(params, state)
    assert bool(after.done.all())
    np.testing.assert_array_equal(np.asarray(after.n_generated), 2)
    np.testing.assert_array_equal(np.asarray(after.verifier_state.lengths), lens)
