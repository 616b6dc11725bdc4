"""The reference checkpoints in $SPECJAX_SHARED/models compute what the original models compute."""

import numpy as np
import pytest

import specjax
from specjax.paths import SMOLLM2, STORIES260K

SANITY = (
    ", there was a little girl named Lily. She loved to play outside in the park. One day, "
    "she saw a big, red ball"
)


@pytest.fixture(scope="module")
def stories(shared_dir):
    path = shared_dir / STORIES260K
    if not path.exists():
        pytest.skip(f"{path} missing")
    return specjax.load(path)


@pytest.fixture(scope="module")
def smollm(shared_dir):
    path = shared_dir / SMOLLM2
    if not path.exists():
        pytest.skip(f"{path} missing")
    return specjax.load(path)


def tinystories_paragraphs(shared_dir, n):
    text = (shared_dir / "data" / "tinystories_dev.txt").read_text()
    return [p.strip() for p in text.split("\n\n") if p.strip()][:n]


def test_stories260k_greedy_reproduces_sanity_text(stories):
    ids = stories.tokenizer.encode("Once upon a time", bos=True)
    out = specjax.generate(stories.model, [ids], max_new_tokens=40)
    text = stories.tokenizer.decode([int(t) for t in out.tokens[0]])
    assert text.startswith(SANITY), text


def stories_nll(stories, shared_dir):
    seqs = [stories.tokenizer.encode(p, bos=True) for p in tinystories_paragraphs(shared_dir, 40)]
    logp, mask = specjax.score(stories.model, seqs)
    return -float(np.sum(logp)) / float(np.sum(mask)), seqs


def test_stories260k_nll_on_tinystories_dev(stories, shared_dir):
    """Mean NLL per token over the first 40 paragraphs (each BOS + paragraph, 4,059 scored tokens).

    SOURCE.md quotes 1.460 over 4,753 tokens, evidently from a different text sample or procedure
    (its token count does not match these paragraphs); transformers on the same weights and the
    same paragraphs gives our value (see the hf test below), 1.357. The band here is wide enough
    for both and still catches a broken model (a wrong RoPE layout or norm gives > 2).
    """
    nll, _ = stories_nll(stories, shared_dir)
    assert 1.30 < nll < 1.50, nll


@pytest.mark.hf
@pytest.mark.slow
def test_stories260k_nll_equals_transformers(stories, shared_dir):
    torch = pytest.importorskip("torch")
    from specjax.io.export import to_transformers

    nll, seqs = stories_nll(stories, shared_dir)
    hf = to_transformers(stories.model)
    total, count = 0.0, 0
    for ids in seqs:
        x = torch.tensor([ids])
        with torch.no_grad():
            logp = torch.log_softmax(hf(x).logits[0, :-1], -1)
        total -= float(logp.gather(1, x[0, 1:, None]).sum())
        count += len(ids) - 1
    assert abs(nll - total / count) < 1e-4, (nll, total / count)


@pytest.mark.slow
def test_smollm2_chat_answer_contains_paris(smollm):
    tok = smollm.tokenizer
    text = tok.apply_chat(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    ids = tok.encode(text, bos=False)
    out = specjax.generate(smollm.model, [ids], max_new_tokens=24, eos_id=tok.eos_id)
    answer = tok.decode([int(t) for t in out.tokens[0, : int(out.lengths[0])]])
    assert "Paris" in answer, answer


@pytest.mark.hf
@pytest.mark.slow
def test_smollm2_logits_match_transformers_gguf(smollm, shared_dir):
    """transformers dequantizes the same GGUF (un-permuting Q/K to its half-split RoPE); our
    interleaved-layout model must give the same logits. Tolerance: atol 1e-3 on logits of
    magnitude ~20 (fp32 on both sides; the difference is accumulation order over 30 layers)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = shared_dir / SMOLLM2
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    tok = smollm.tokenizer
    ids = tok.encode(
        "The quick brown fox jumps over the lazy dog. In Paris, the weather", bos=False
    )
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits.numpy()[0]
    from specjax.cache import init_cache
    from specjax.tree import causal_mask

    t = len(ids)
    import jax.numpy as jnp

    got = smollm.model(
        jnp.asarray([ids]),
        positions=jnp.arange(t)[None],
        cache=init_cache(smollm.config, 1, t),
        tree_mask=causal_mask(1, t),
    ).logits[0]
    err = float(np.max(np.abs(np.asarray(got) - expected)))
    assert err < 1e-3, err
    np.testing.assert_array_equal(np.argmax(np.asarray(got), -1), np.argmax(expected, -1))
