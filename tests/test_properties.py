"""Property test: greedy speculative decoding gives exactly `generate`'s tokens and lengths
(and bfloat16 targets: float32 logits, greedy equality).

Random tiny targets with a peaked head are drafted by every drafter kind (a second tiny Llama,
self-drafting, EAGLE, mdc) with random static trees (LM drafters) or random dynamic trees
(feature drafters, including budgets smaller than the depth, whose path commits write more
slots than the verified block), random ragged prompts and prompts that all have exactly a
multiple of 16 tokens (no padding slack: every row reaches the end of the cache while still
live), batches of 1 to 5, with and without an EOS that occurs in the output.

Compilation dominates the run time, so every shape (batch, prompt width, max_new_tokens, tree)
comes from a small set and the models are built once per module; the weights are traced, so
changing them costs no compilation. The default run covers one shape per drafter kind, the slow
run (-m slow) the whole set. Rows still live at the cache end with a budget well below the depth
(depth >= budget + 4) are what an engine that reserved only N + 1 slots past the cache end got
wrong (its last path commits were clamped back over committed positions): the default run's
EAGLE and mdc trees are such trees.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_feature_drafter import make_drafter
from test_lossless_e2e import sharpened
from test_speculative import assert_stats_consistent

import specjax
from specjax.config import ModelConfig, SpecConfig, TreeConfig

V = 32
CFG = ModelConfig(
    vocab_size=V,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    ffn_dim=64,
    max_seq_len=256,
    tie_embeddings=False,
)
BUCKET = 16  # specjax.decode.PROMPT_BUCKET
KINDS = ("lm", "self", "eagle", "mdc")
# LM drafters: the draft model is an independent random Llama ("random") or the target with each
# weight perturbed by this many standard deviations of its tensor (drafts accepted more often).
LM_DRAFTS = ("random", 0.1, 0.3)


@dataclasses.dataclass(frozen=True)
class Profile:
    """The shapes a run draws from, per drafter kind."""

    batches: tuple[int, ...]
    widths: tuple[int, ...]
    max_new: tuple[int, ...]
    trees: dict[str, tuple[TreeConfig, ...]]
    max_examples: int


STATIC_TREES = (
    TreeConfig.chain(1),
    TreeConfig.chain(4),
    TreeConfig(branching=(2, 1, 1)),
    TreeConfig(branching=(3, 2, 1)),
    TreeConfig(branching=(2, 2)),
)
# Budgets below the depth (a path commit writes depth + 1 slots, more than the N verified ones),
# from just below to far below, and ordinary bushy trees.
DYNAMIC_TREES = (
    TreeConfig.dynamic(1, 6, 1),
    TreeConfig.dynamic(2, 8, 2),
    TreeConfig.dynamic(3, 9, 2),
    TreeConfig.dynamic(2, 3, 2),
    TreeConfig.dynamic(6, 3, 3),
)
DEFAULT = Profile(
    batches=(3,),
    widths=(BUCKET,),
    max_new=(20,),
    trees={
        "lm": (TreeConfig(branching=(2, 1, 1)),),
        "self": (TreeConfig.chain(4),),
        "eagle": (TreeConfig.dynamic(2, 8, 2),),
        "mdc": (TreeConfig.dynamic(3, 9, 2),),
    },
    max_examples=10,
)
SLOW = Profile(
    batches=(1, 2, 3, 4, 5),
    widths=(BUCKET, 2 * BUCKET),
    max_new=(5, 24),
    trees={"lm": STATIC_TREES, "self": STATIC_TREES, "eagle": DYNAMIC_TREES, "mdc": DYNAMIC_TREES},
    max_examples=12,
)


@functools.cache
def target_model(seed: int):
    return sharpened(CFG, seed, 3.0)


@functools.cache
def drafter_for(kind: str, seed: int, variant=None):
    target = target_model(seed)
    if kind == "self":
        return specjax.LMDrafter.self_draft(1)
    if kind in ("eagle", "mdc"):
        return make_drafter(kind, target, seed=10 + seed, scale=2.0)
    if variant == "random":
        return specjax.LMDrafter(sharpened(CFG, 100 + seed, 3.0))
    draft = sharpened(CFG, seed, 3.0)  # the target's weights ...
    rng = np.random.default_rng(200 + seed)  # numpy: no small programs to compile
    params = jax.tree.map(np.asarray, nnx.state(draft, nnx.Param))

    def perturb(x):
        return jnp.asarray(x + variant * x.std() * rng.standard_normal(x.shape), x.dtype)

    nnx.update(draft, jax.tree.map(perturb, params))  # ... perturbed
    return specjax.LMDrafter(draft)


@dataclasses.dataclass(frozen=True)
class Case:
    prompts: tuple[tuple[int, ...], ...]
    tree: TreeConfig
    max_new: int
    seed: int  # target weights
    variant: object  # LM drafter: "random" or a noise level
    eos_pick: int | None  # index into the reference output of the token used as EOS

    def __repr__(self):  # short enough to read in a failure report
        lens = [len(p) for p in self.prompts]
        return (
            f"Case(prompt lens {lens}, tree {self.tree}, max_new {self.max_new}, "
            f"seed {self.seed}, variant {self.variant}, eos_pick {self.eos_pick}, "
            f"prompts {self.prompts})"
        )


@st.composite
def cases(draw, kind: str, profile: Profile) -> Case:
    batch = draw(st.sampled_from(profile.batches))
    width = draw(st.sampled_from(profile.widths))
    if draw(st.booleans()):  # every row exactly `width` tokens: no padding slack at all
        lens = [width] * batch
    else:  # ragged, the longest row in (width - 16, width] so the padded width is `width`
        lens = draw(st.lists(st.integers(1, width), min_size=batch, max_size=batch))
        lens[draw(st.integers(0, batch - 1))] = draw(st.integers(width - BUCKET + 1, width))
    prompts = tuple(
        tuple(draw(st.lists(st.integers(0, V - 1), min_size=n, max_size=n))) for n in lens
    )
    return Case(
        prompts=prompts,
        tree=draw(st.sampled_from(profile.trees[kind])),
        max_new=draw(st.sampled_from(profile.max_new)),
        seed=draw(st.integers(0, 1)),
        variant=draw(st.sampled_from(LM_DRAFTS)) if kind == "lm" else None,
        eos_pick=draw(st.none() | st.integers(0, 10**6)),
    )


def full_width_case(kind: str, profile: Profile, seed: int) -> Case:
    """Every row exactly as long as the padded width: each reaches the cache end while live."""
    rng = np.random.default_rng(seed)
    width, batch = profile.widths[-1], profile.batches[-1]
    return Case(
        prompts=tuple(tuple(int(t) for t in rng.integers(0, V, width)) for _ in range(batch)),
        tree=profile.trees[kind][0],
        max_new=profile.max_new[-1],
        seed=seed,
        variant=LM_DRAFTS[1] if kind == "lm" else None,
        eos_pick=None,
    )


def check_case(kind: str, case: Case) -> np.ndarray:
    """Assert greedy equality (with and without an EOS) and consistent statistics; returns the
    number of steps, of steps accepting a draft token and of steps rejecting one."""
    target = target_model(case.seed)
    drafter = drafter_for(kind, case.seed, case.variant)
    prompts = [list(p) for p in case.prompts]
    config = SpecConfig(tree=case.tree)
    ref = specjax.generate(target, prompts, max_new_tokens=case.max_new)
    runs = [(None, ref)]
    if case.eos_pick is not None:
        ref_tokens = np.asarray(ref.tokens).ravel()
        eos = int(ref_tokens[case.eos_pick % ref_tokens.size])
        runs.append(
            (eos, specjax.generate(target, prompts, max_new_tokens=case.max_new, eos_id=eos))
        )
    p = case.tree.max_depth + 1
    counts = np.zeros(3, np.int64)
    for eos, expected in runs:
        out = specjax.speculative_generate(
            target, drafter, prompts, max_new_tokens=case.max_new, config=config, eos_id=eos
        )
        lengths = np.asarray(out.lengths)
        np.testing.assert_array_equal(lengths, np.asarray(expected.lengths), err_msg=f"eos {eos}")
        np.testing.assert_array_equal(
            np.asarray(out.tokens), np.asarray(expected.tokens), err_msg=f"eos {eos}"
        )
        assert_stats_consistent(out, p)
        hist = np.asarray(out.stats["accepted_hist"]).sum(0)
        counts += [hist.sum(), hist[1:].sum(), hist[:-1].sum()]
    return counts


def run_property(kind: str, profile: Profile) -> np.ndarray:
    """Runs the property; returns check_case's counts summed over the examples."""
    total = np.zeros(3, np.int64)

    @settings(
        max_examples=profile.max_examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @example(case=full_width_case(kind, profile, seed=0))
    @example(case=full_width_case(kind, profile, seed=1))
    @given(case=cases(kind, profile))
    def prop(case):
        total[:] += check_case(kind, case)

    prop()
    return total


def assert_partly_rejected(counts: np.ndarray) -> None:
    """Drafts were sometimes accepted and sometimes rejected (else the property is vacuous)."""
    steps, accepting, rejecting = counts
    assert accepting > 0.05 * steps and rejecting > 0.05 * steps, counts


# mdc runs under `slow` (the feature drafters' default greedy cases are in test_feature_drafter
# and test_pre_verifier).
@pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=pytest.mark.slow) if k == "mdc" else k for k in KINDS]
)
def test_greedy_equals_generate_property(kind):
    assert_partly_rejected(run_property(kind, DEFAULT))


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_generate_property_many_shapes(kind):
    assert_partly_rejected(run_property(kind, SLOW))


def test_greedy_equals_generate_with_rejections():
    """One fixed case in the default profile's shapes: a draft LM close to the target (its weights
    perturbed) has every row accept some drafts and reject others, and greedy still equals
    generate."""
    tree = DEFAULT.trees["lm"][0]
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], list(range(16)), [7]]
    target, drafter = target_model(0), drafter_for("lm", 0, 0.1)
    ref = specjax.generate(target, prompts, max_new_tokens=DEFAULT.max_new[0])
    out = specjax.speculative_generate(
        target, drafter, prompts, max_new_tokens=DEFAULT.max_new[0], config=SpecConfig(tree=tree)
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    assert_stats_consistent(out, tree.max_depth + 1)
    hist = np.asarray(out.stats["accepted_hist"])
    assert (hist[:, 1:].sum(1) > 0).all() and (hist[:, :-1].sum(1) > 0).all(), hist


# --- bfloat16 ---------------------------------------------------------------------------------

BF16 = ModelConfig(**{**CFG.__dict__, "dtype": "bfloat16"})


@functools.cache
def bf16_target():
    return sharpened(BF16, 5, 3.0)


def test_bf16_head_accumulates_in_float32():
    """The LM head of a bfloat16 model returns float32 logits accumulated in float32: the float32
    product of its bfloat16 inputs (a product rounded to bfloat16 is about 1e-2 off here)."""
    from specjax.models.layers import rms_norm

    model = bf16_target()
    hidden = jax.random.normal(jax.random.key(0), (4, BF16.d_model), jnp.bfloat16)
    logits = model.head(hidden)
    assert logits.dtype == jnp.float32
    x = rms_norm(hidden, model.final_norm[...], BF16.norm_eps).astype(jnp.float32)
    want = x @ model.lm_head[...].astype(jnp.float32)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "tree",
    [pytest.param(TreeConfig.chain(3), marks=pytest.mark.slow), TreeConfig(branching=(3, 2, 1))],
    ids=["chain3", "tree_3_2_1"],
)
def test_bf16_greedy_equals_generate(tree):
    target = bf16_target()
    prompts = [[1, 5, 7], [2] * 16, [9, 9, 2, 11, 4, 30]]
    ref = specjax.generate(target, prompts, max_new_tokens=20)
    out = specjax.speculative_generate(
        target,
        specjax.LMDrafter.self_draft(1),
        prompts,
        max_new_tokens=20,
        config=SpecConfig(tree=tree),
    )
    assert out.tokens.dtype == ref.tokens.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    assert_stats_consistent(out, tree.max_depth + 1)
    hist = np.asarray(out.stats["accepted_hist"]).sum(0)
    assert hist[1:].sum() > 0 and hist[:-1].sum() > 0, hist  # drafts accepted and rejected
