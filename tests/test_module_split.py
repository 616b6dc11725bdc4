"""specjax.module_split: the memoized nnx.split gives what nnx.split gives, and never a stale
split (a new value, a changed static attribute, an added Variable all split again)."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import module_split
from specjax.module_split import split


class Small(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones((2, 3)))
        self.mode = "a"


def values(state):
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def test_an_unchanged_module_reuses_its_split_and_a_changed_one_splits_again():
    m = Small()
    g1, s1 = split(m)
    g2, s2 = split(m)
    assert g2 is g1 and s2 is s1  # the memo
    ref_g, ref_s = nnx.split(m)
    assert g1 == ref_g
    np.testing.assert_array_equal(values(s1), values(ref_s))

    m.w.set_value(jnp.full((2, 3), 2.0))  # a new value
    _, s3 = split(m)
    np.testing.assert_array_equal(values(s3)[0], np.full((2, 3), 2.0))

    m.mode = "b"  # a static attribute: the graph definition changes
    g4, _ = split(m)
    assert g4 != g1 and g4 == nnx.split(m)[0]

    m.extra = nnx.Param(jnp.zeros(4))  # another Variable
    _, s5 = split(m)
    assert len(jax.tree.leaves(s5)) == 2


def test_a_collected_module_leaves_the_memo():
    m = Small()
    split(m)
    key = id(m)
    assert key in module_split._MEMO
    del m
    gc.collect()
    assert key not in module_split._MEMO
