"""The compiled Pallas kernel and the engine on a GPU (marked `gpu`: deselected by default,
skipped on other backends). Run where a GPU is present:

    pytest -m gpu tests/test_gpu.py

The CPU suite checks the kernel in interpret mode and its Triton lowering; only a GPU runs the
compiled kernel. Cases are test_tree_attention's pairwise covering array (every pair of values
of batch, nodes, cache length, head layout, head dim, dtype, block size and kv splits) with the
given options, and every 7th case of its full grid with the options picked for the device.
End to end, greedy speculative decoding with the compiled kernel must give the tokens of
autoregressive decoding across tree shapes, batch sizes and cache boundaries (a random model
sized for the kernel, and SmolLM2 with its eagle drafter), and "auto" attention must fall back
to the reference for head dims the kernel cannot take (stories260K's D=8).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lively_models import lively_llama
from specjax.kernels.tree_attention import tree_attention, tree_attention_reference
from test_tree_attention import FULL, PAIRWISE, _case_id, make_inputs

import specjax
from specjax.config import TINY, SpecConfig, TreeConfig
from specjax.datasets import encode_question, read_spec_bench, select_questions, tinystories_prompts
from specjax.drafters.lm import LMDrafter
from specjax.paths import SMOLLM2, SMOLLM2_EAGLE, STORIES260K, STORIES260K_EAGLE, repo_dir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

# (atol, rtol). float32 dots run at HIGHEST precision in the kernel, but the compiled kernel
# sums in another order than XLA's reference (online softmax over key blocks, split merges), so
# float32 gets a few ulps of 1e-6-sized values more than interpret mode; a masking or indexing
# error gives errors of order 1.
COMPILED_TOLERANCE = {jnp.float32: (2e-4, 2e-4), jnp.bfloat16: (2e-2, 2e-2)}


def _assert_close(out, ref, dtype):
    atol, rtol = COMPILED_TOLERANCE[dtype]
    assert out.dtype == ref.dtype
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=atol, rtol=rtol
    )


@pytest.mark.parametrize("case", PAIRWISE, ids=_case_id)
def test_compiled_triton_kernel_matches_reference(case):
    *_, dtype, block_k, num_splits = case
    args = make_inputs(case)
    out = tree_attention(
        *args, interpret=False, variant="triton", block_k=block_k, num_splits=num_splits
    )
    _assert_close(out, tree_attention_reference(*args), dtype)


@pytest.mark.parametrize("case", FULL[::7], ids=_case_id)
def test_compiled_default_options_under_jit(case):
    """interpret=None on a GPU compiles; block and split sizes are the device's defaults."""
    args = make_inputs(case, seed=1)
    out = jax.jit(tree_attention)(*args)
    _assert_close(out, tree_attention_reference(*args), case[5])


# A random model whose head dim the GPU kernel takes (TINY's D=8 is below its 16 minimum). At
# initialisation scale a random model repeats one token and any drafter agrees with it; weights
# scaled by 3 give varied tokens, and its own first 2 of 4 layers then draft with tau ~1.7-1.9:
# acceptances and rejections both, at every depth.
KERNEL_SIZED = dataclasses.replace(
    TINY,
    vocab_size=512,
    d_model=64,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    max_seq_len=512,
)
RAGGED = [[1, 5, 7], [1, 2, 3, 4, 5, 6, 7, 8], [3], [9, 9, 2, 11, 4]]
TREES = {
    "chain4": TreeConfig.chain(4),
    "tree_3_2_1": TreeConfig(branching=(3, 2, 1)),
    "wide_8_4_2": TreeConfig(branching=(8, 4, 2)),
}


@pytest.fixture(scope="module")
def lively_target():
    return lively_llama(KERNEL_SIZED, 0)


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_speculative_with_compiled_kernel_equals_generate(lively_target, tree, batch):
    """attn_impl "pallas" (compiled) in both paths; 100 new tokens cross several key blocks."""
    prompts = RAGGED[:batch]
    ref = specjax.generate(lively_target, prompts, max_new_tokens=100, attn_impl="pallas")
    config = SpecConfig(tree=TREES[tree], attn_impl="pallas")
    out = specjax.speculative_generate(
        lively_target, LMDrafter.self_draft(2), prompts, max_new_tokens=100, config=config
    )
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    tau = np.asarray(out.stats["tau"])
    assert (tau > 1.2).all() and (tau < TREES[tree].max_depth + 1).all(), tau


def test_auto_attention_falls_back_for_head_dims_the_kernel_cannot_take(shared_dir):
    """stories260K (D=8) with its eagle drafter under attn_impl "auto": the reference path runs
    instead of the compiled kernel raising."""
    path = repo_dir() / STORIES260K_EAGLE
    if not (path / "drafter.json").exists():
        pytest.skip(f"{STORIES260K_EAGLE} is not in this checkout")
    stories = specjax.load(shared_dir / STORIES260K)
    drafter = specjax.load_drafter(path, stories.model)
    prompts = tinystories_prompts(stories.tokenizer, 3)
    ref = specjax.generate(stories.model, prompts, max_new_tokens=64)
    config = SpecConfig(tree=TreeConfig.dynamic(31, 6, 8))
    out = specjax.speculative_generate(
        stories.model, drafter, prompts, max_new_tokens=64, config=config
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert float(np.mean(out.stats["tau"])) > 1.5


def test_smollm2_eagle_with_compiled_kernel_equals_generate(shared_dir):
    """The realistic target (D=64) and its shipped eagle drafter through the compiled kernel."""
    model_path = shared_dir / SMOLLM2
    path = repo_dir() / SMOLLM2_EAGLE
    if not model_path.exists() or not (path / "drafter.json").exists():
        pytest.skip("SmolLM2 or its eagle drafter is missing")
    loaded = specjax.load(model_path)
    drafter = specjax.load_drafter(path, loaded.model)
    questions = select_questions(read_spec_bench("mt_bench_question.jsonl"), 4)
    prompts = [encode_question(loaded.tokenizer, q.turns[0]) for q in questions]
    kw = dict(max_new_tokens=96, eos_id=loaded.tokenizer.eos_id)
    ref = specjax.generate(loaded.model, prompts, attn_impl="pallas", **kw)
    config = SpecConfig(tree=TreeConfig.dynamic(31, 6, 8), attn_impl="pallas")
    out = specjax.speculative_generate(loaded.model, drafter, prompts, config=config, **kw)
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
