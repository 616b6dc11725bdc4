"""Tree-attention Pallas kernel vs the plain-jnp specification (interpret mode on CPU).

Axis letters: B batch, N tree nodes, S cache length, H query heads, K kv heads, D head dim.

The default run covers every pair of axis values (a greedy pairwise covering array over batch,
tree size, cache length, head layout, head dim, dtype, block size and kv splits); the full
cartesian grid is marked slow. The Mosaic (TPU) kernel runs in TPU interpret mode on a smaller
set, and both kernels are lowered for their real platforms (Triton IR for CUDA, Mosaic for TPU)
to catch block-shape and lowering-rule errors without a device.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from specjax.kernels.tree_attention import ops, tree_attention, tree_attention_reference

from specjax.tree import static_ancestor_mask

# (atol, rtol). bf16: inputs are exactly representable in both paths; the error comes from the
# kernel's bf16 probabilities in p @ v and the bf16 rounding of the output (2^-8 relative).
TOLERANCE = {jnp.float32: (1e-5, 1e-5), jnp.bfloat16: (2e-2, 2e-2)}

AXES = {
    "batch": (1, 3),
    "nodes": (1, 7, 16, 64),
    "seq": ("tight", 300, 1024),  # tight: S = N + 9 (below one block; < 16 for small trees)
    "heads": ((8, 8), (8, 2), (9, 3)),
    "head_dim": (64, 128),
    "dtype": (jnp.float32, jnp.bfloat16),
    "block_k": (16, 64),
    "num_splits": (1, 3),
}


def pairwise_cases(axes: dict) -> list[tuple]:
    """A small set of value tuples covering every pair of values of every two axes (greedy)."""
    names = list(axes)
    values = [axes[n] for n in names]
    uncovered = {
        (i, a, j, b)
        for i, j in itertools.combinations(range(len(names)), 2)
        for a in range(len(values[i]))
        for b in range(len(values[j]))
    }
    candidates = list(itertools.product(*[range(len(v)) for v in values]))
    cases = []
    while uncovered:

        def gain(c, uncovered=uncovered):
            pairs = itertools.combinations(range(len(c)), 2)
            return sum((i, c[i], j, c[j]) in uncovered for i, j in pairs)

        best = max(candidates, key=gain)  # first maximum: deterministic
        uncovered -= {
            (i, best[i], j, best[j]) for i, j in itertools.combinations(range(len(best)), 2)
        }
        cases.append(tuple(values[k][best[k]] for k in range(len(best))))
    return cases


def _case_id(case) -> str:
    b, n, s, (h, k), d, dtype, bk, p = case
    return f"B{b}-N{n}-S{s}-H{h}K{k}-D{d}-{jnp.dtype(dtype).name}-bk{bk}-P{p}"


def random_tree_mask(rng: np.random.Generator, batch: int, n: int) -> np.ndarray:
    """[B, N, N] ancestors-or-self masks of random trees (parents[i] < i, node 0 the root)."""
    return np.stack(
        [
            static_ancestor_mask([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
            for _ in range(batch)
        ]
    )


def ragged_lengths(rng: np.random.Generator, batch: int, n: int, s: int, block: int) -> np.ndarray:
    """[B] int32 lengths with lengths + N <= S: 0, the maximum S - N, and non-block-multiples."""
    top = s - n
    picks = [0, top]
    for _ in range(batch):
        x = int(rng.integers(0, top + 1))
        if x % block == 0 and 0 < x + 1 <= top:
            x += 1  # a length that is not a multiple of the block
        picks.append(x)
    if batch == 1:  # rotate between the interesting values
        return np.array([picks[int(rng.integers(0, 3)) if top else 0]], np.int32)
    return np.array(picks[:batch], np.int32)


def make_inputs(case, seed: int = 0):
    b, n, s, (h, kh), d, dtype, bk, _ = case
    s = n + 9 if s == "tight" else s
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, n, h, d)), dtype)
    k = jnp.asarray(rng.standard_normal((b, s, kh, d)), dtype)
    v = jnp.asarray(rng.standard_normal((b, s, kh, d)), dtype)
    lengths = jnp.asarray(ragged_lengths(rng, b, n, s, bk))
    tree_mask = jnp.asarray(random_tree_mask(rng, b, n))
    return q, k, v, lengths, tree_mask


def assert_close(out, ref, dtype):
    atol, rtol = TOLERANCE[dtype]
    assert out.dtype == ref.dtype
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=atol, rtol=rtol
    )


def _run_case(case):
    *_, dtype, block_k, num_splits = case
    args = make_inputs(case)
    out = tree_attention(
        *args, interpret=True, variant="triton", block_k=block_k, num_splits=num_splits
    )
    assert out.shape == args[0].shape
    assert_close(out, tree_attention_reference(*args), dtype)


PAIRWISE = pairwise_cases(AXES)
# Full grid over the problem axes; the two implementation axes (block_k, num_splits) rotate with
# the case index so they still vary across the grid without multiplying it by four.
_PROBLEM_AXES = ("batch", "nodes", "seq", "heads", "head_dim", "dtype")
FULL = [
    (*c, AXES["block_k"][i % 2], AXES["num_splits"][(i // 2) % 2])
    for i, c in enumerate(itertools.product(*(AXES[a] for a in _PROBLEM_AXES)))
]


@pytest.mark.parametrize("case", PAIRWISE, ids=_case_id)
def test_parity_pairwise(case):
    _run_case(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=_case_id)
def test_parity_full_grid(case):
    _run_case(case)


def test_pairwise_covers_every_value():
    for pos, values in enumerate(AXES.values()):
        assert {c[pos] for c in PAIRWISE} == set(values)


# Mosaic (TPU) kernel in TPU interpret mode: D=128 uses the in-place [B, S, K*D] view, D=64 the
# heads-major fallback; S=300 has a partial edge block, "tight" a block equal to the full cache.
MOSAIC_CASES = [
    (3, 7, 300, (9, 3), 64, jnp.float32, 128, 1),
    (3, 64, 300, (8, 2), 128, jnp.bfloat16, 128, 1),
    (1, 1, 1024, (8, 8), 128, jnp.float32, 256, 1),
    (1, 16, "tight", (8, 2), 64, jnp.bfloat16, 128, 1),
]


@pytest.mark.parametrize("case", MOSAIC_CASES, ids=_case_id)
def test_parity_mosaic_tpu_interpret(case):
    *_, dtype, block_k, _ = case
    args = make_inputs(case, seed=1)
    out = tree_attention(*args, interpret=True, variant="mosaic", block_k=block_k)
    assert_close(out, tree_attention_reference(*args), dtype)


@pytest.mark.parametrize("variant", ["triton", "mosaic"])
def test_prefill_causal_multiple_query_tiles(variant):
    """lengths 0 + causal mask = prefill; small query tiles exercise tree-chunk skipping."""
    b, n, h, kh, d = 2, 48, 4, 2, 64
    rng = np.random.default_rng(2)
    q = jnp.asarray(rng.standard_normal((b, n, h, d)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, n + 5, kh, d)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, n + 5, kh, d)), jnp.float32)
    lengths = jnp.zeros((b,), jnp.int32)
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n))
    kw = {"block_k": 16, "block_q": 16} if variant == "triton" else {"block_q": 16}
    out = tree_attention(q, k, v, lengths, causal, interpret=True, variant=variant, **kw)
    assert_close(out, tree_attention_reference(q, k, v, lengths, causal), jnp.float32)


@pytest.mark.parametrize("variant", ["triton", "mosaic"])
def test_cache_past_the_tree_is_never_used(variant):
    """NaN in every cache slot at or past lengths[b] + N must not reach the output."""
    case = (3, 7, 300, (8, 2), 64, jnp.float32, 16 if variant == "triton" else 128, 1)
    q, k, v, lengths, tree_mask = make_inputs(case, seed=3)
    ref = tree_attention_reference(q, k, v, lengths, tree_mask)
    stale = (jnp.arange(k.shape[1])[None, :] >= (lengths + q.shape[1])[:, None])[..., None, None]
    k_bad, v_bad = jnp.where(stale, jnp.nan, k), jnp.where(stale, jnp.nan, v)
    out = tree_attention(
        q, k_bad, v_bad, lengths, tree_mask, interpret=True, variant=variant, block_k=case[6]
    )
    assert_close(out, ref, jnp.float32)


def test_inside_jit_and_default_interpret():
    case = (1, 7, 300, (8, 2), 64, jnp.float32, 64, 1)
    args = make_inputs(case)
    out = jax.jit(tree_attention)(*args)  # interpret=None -> interpret on the CPU backend
    assert_close(out, tree_attention_reference(*args), jnp.float32)


# ---------------------------------------------------------------------------------------------
# Lowering for the real platforms (no device needed: the Pallas -> Triton / Mosaic lowering runs
# in Python). Shapes of the benchmark: decode-sized tree verification and one-token decode.
# ---------------------------------------------------------------------------------------------

LOWERING_CASES = [
    ("triton", (1, 64, 2048, 32, 8, 128), jnp.bfloat16, {"block_k": 64, "num_splits": 8}),
    ("triton", (8, 1, 8192, 32, 8, 128), jnp.bfloat16, {"block_k": 64, "num_splits": 1}),
    ("triton", (3, 7, 1000, 9, 3, 64), jnp.float32, {"block_k": 64, "num_splits": 1}),
    ("mosaic", (1, 64, 2048, 32, 8, 128), jnp.bfloat16, {"block_k": 512, "num_splits": 1}),
    ("mosaic", (3, 7, 1000, 9, 3, 64), jnp.float32, {"block_k": 512, "num_splits": 1}),
]


@pytest.mark.parametrize(
    "variant,shape,dtype,kw", LOWERING_CASES, ids=lambda x: str(x).replace(" ", "")
)
def test_lowers_for_device(variant, shape, dtype, kw):
    b, n, s, h, kh, d = shape
    q = jax.ShapeDtypeStruct((b, n, h, d), dtype)
    kv = jax.ShapeDtypeStruct((b, s, kh, d), dtype)
    lengths = jax.ShapeDtypeStruct((b,), jnp.int32)
    mask = jax.ShapeDtypeStruct((b, n, n), jnp.bool_)
    block_q = 64 if variant == "triton" else 256
    traced = ops._tree_attention_jit.trace(
        q, kv, kv, lengths, mask, variant=variant, interpret=False, block_q=block_q, **kw
    )
    platform = "cuda" if variant == "triton" else "tpu"
    text = traced.lower(lowering_platforms=(platform,)).as_text()
    assert ("triton" if variant == "triton" else "tpu_custom_call") in text


# ---------------------------------------------------------------------------------------------
# Validation: one test per check, all raised before tracing.
# ---------------------------------------------------------------------------------------------


def _valid():
    rng = np.random.default_rng(0)
    return {
        "q": jnp.asarray(rng.standard_normal((2, 4, 8, 16)), jnp.float32),
        "k": jnp.zeros((2, 32, 2, 16), jnp.float32),
        "v": jnp.zeros((2, 32, 2, 16), jnp.float32),
        "lengths": jnp.zeros((2,), jnp.int32),
        "tree_mask": jnp.broadcast_to(jnp.eye(4, dtype=bool), (2, 4, 4)),
    }


INVALID_INPUTS = [
    ("q_rank", {"q": jnp.zeros((2, 4, 128), jnp.float32)}, "q must be"),
    ("k_rank", {"k": jnp.zeros((2, 32, 32), jnp.float32)}, "k must be"),
    ("v_shape", {"v": jnp.zeros((2, 31, 2, 16), jnp.float32)}, "v must have"),
    ("empty", {"q": jnp.zeros((2, 0, 8, 16), jnp.float32)}, "empty dimension"),
    ("batch", {"k": jnp.zeros((3, 32, 2, 16)), "v": jnp.zeros((3, 32, 2, 16))}, "batch"),
    ("head_dim", {"k": jnp.zeros((2, 32, 2, 8)), "v": jnp.zeros((2, 32, 2, 8))}, "head dim"),
    ("gqa", {"k": jnp.zeros((2, 32, 3, 16)), "v": jnp.zeros((2, 32, 3, 16))}, "multiple of kv"),
    ("n_gt_s", {"k": jnp.zeros((2, 3, 2, 16)), "v": jnp.zeros((2, 3, 2, 16))}, "exceeds cache"),
    ("q_dtype", {"q": jnp.zeros((2, 4, 8, 16), jnp.int32)}, "q dtype"),
    ("kv_dtype", {"k": jnp.zeros((2, 32, 2, 16), jnp.bfloat16)}, "must equal q dtype"),
    ("lengths_shape", {"lengths": jnp.zeros((2, 1), jnp.int32)}, "lengths must be \\[B\\]"),
    ("lengths_dtype", {"lengths": np.zeros((2,), np.int64)}, "lengths must be int32"),
    ("mask_shape", {"tree_mask": jnp.ones((2, 4, 5), bool)}, "tree_mask must be \\[B, N, N\\]"),
    ("mask_dtype", {"tree_mask": jnp.ones((2, 4, 4), jnp.int32)}, "tree_mask must be bool"),
    ("not_array", {"lengths": [0, 0]}, "lengths must be an array"),
]


@pytest.mark.parametrize("name,override,match", INVALID_INPUTS, ids=[c[0] for c in INVALID_INPUTS])
def test_invalid_inputs(name, override, match):
    kwargs = {**_valid(), **override}
    with pytest.raises(ValueError, match=match):
        tree_attention(**kwargs, interpret=True)


INVALID_OPTIONS = [
    ("variant", {"variant": "cuda"}, "variant must be"),
    ("interpret_type", {"interpret": "yes"}, "interpret must be"),
    ("triton_block_k", {"block_k": 48}, "power of two"),
    ("triton_block_q", {"block_q": 8}, "power of two"),
    ("num_splits", {"num_splits": 0}, "num_splits must be"),
    ("mosaic_block_k", {"variant": "mosaic", "block_k": 64}, "multiple of 128"),
    ("mosaic_block_q", {"variant": "mosaic", "block_q": 12}, "multiple of 8"),
    ("mosaic_splits", {"variant": "mosaic", "num_splits": 2}, "Triton-variant option"),
]


@pytest.mark.parametrize("name,options,match", INVALID_OPTIONS, ids=[c[0] for c in INVALID_OPTIONS])
def test_invalid_options(name, options, match):
    options = {"interpret": True, **options}
    with pytest.raises(ValueError, match=match):
        tree_attention(**_valid(), **options)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU backend guard")
def test_compiled_kernel_needs_an_accelerator():
    with pytest.raises(ValueError, match="pass interpret=True"):
        tree_attention(**_valid(), interpret=False)


def test_auto_attention_uses_the_kernel_only_for_head_dims_it_takes(monkeypatch):
    """On a GPU, "auto" picks the compiled kernel for power-of-two head dims >= 16 and the
    reference otherwise (stories260K's D=8); on TPU any head dim; on CPU the CPU kernel where it
    builds (tests/test_cpu_attention.py), else the reference."""
    from specjax.attention import _cpu_kernel_builds, resolve_impl

    on_cpu = "cpu" if _cpu_kernel_builds() else "reference"

    assert [ops.compiled_supports(d, "gpu") for d in (8, 16, 48, 64, 128)] == [
        False,
        True,
        False,
        True,
        True,
    ]
    assert ops.compiled_supports(8, "tpu") and not ops.compiled_supports(64, "cpu")
    for backend, expected in [("gpu", ["reference", "pallas"]), ("cpu", [on_cpu] * 2)]:
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        assert [resolve_impl("auto", d) for d in (8, 64)] == expected
    # An explicit "pallas" is kept where the compiled kernel takes it, else refused up front
    # (the kernel's own errors name settings a caller cannot pass).
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert resolve_impl("pallas", 64) == "pallas" and resolve_impl("pallas") == "pallas"
    with pytest.raises(ValueError, match="cannot take head_dim 8 on this gpu"):
        resolve_impl("pallas", 8)
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    with pytest.raises(ValueError, match="on a CPU use 'interpret'"):
        resolve_impl("pallas", 64)
