"""The n-gram drafter (specjax.drafters.ngram, tables from specjax.train.ngram): hashing, lookup
with back-off, the text lookup, the history and text it keeps across steps, losslessness (greedy
equality over trees, batches and the cache's end; the one-hot tree rule's distribution when
sampling), and its checkpoint's round trip and errors."""

import dataclasses
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lively_models import lively_llama
from test_lossless_e2e import CFG, N_ROWS, PROMPT, check_rows, observed_tokens, sharpened

import specjax
from specjax.config import TINY, SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters import load_drafter
from specjax.drafters.ngram import (
    HEADER,
    NgramLayout,
    match_text,
    order_hashes,
    save_ngram_drafter,
    slots_and_fingerprints,
)
from specjax.train.checkpoint import target_fingerprint
from specjax.train.ngram import build_tables, lookup_hit_rates, lookup_logq_from

LIVELY = dataclasses.replace(TINY, vocab_size=64, max_seq_len=96)
TEST_PROMPTS = [[5, 9, 2], [3, 1, 4, 1, 5, 9, 2, 6], [7]]  # ragged: the engine right-pads


def test_hash_twins_agree_and_lengths_share_one_pass():
    """The builder's numpy hashes equal the lookup's jax ones (vocabularies up to SmolLM2's),
    and the m-token hash of a C-token context is the hash of its last m tokens alone."""
    rng = np.random.default_rng(0)
    contexts = rng.integers(0, 49152, (257, 4))
    for seed in (1, 0x9E3779B9):
        host = order_hashes(contexts, seed, xp=np)
        device = np.asarray(order_hashes(jnp.asarray(contexts, jnp.int32), seed))
        np.testing.assert_array_equal(host, device)
        for m in range(1, 5):
            alone = order_hashes(contexts[:, 4 - m :], seed, xp=np)[:, -1]
            np.testing.assert_array_equal(host[:, m - 1], alone)
    slot, fp = slots_and_fingerprints(contexts, (8, 16, 32, 64), xp=np)
    assert (slot < np.array([8, 16, 32, 64])).all() and (slot >= 0).all()
    assert fp.dtype == np.uint16 and (fp > 0).all()  # 0 marks an empty slot


def test_lookup_takes_the_longest_stored_context_and_backs_off():
    seqs = [[1, 2, 3, 4]] * 3 + [[1, 2, 3, 5]] + [[9, 2, 3, 6]] * 2 + [[7, 7]]
    drafter, report = build_tables(seqs, vocab_size=16, context=3, topk=3, load=0.05)
    assert report["dropped"] == [0, 0, 0] and report["tokens"] == sum(len(s) - 1 for s in seqs)

    def row(*context):
        tokens, logq = drafter.lookup(jnp.asarray([context], jnp.int32))
        return np.asarray(tokens)[0].tolist(), np.asarray(logq)[0]

    tokens, logq = row(1, 2, 3)  # seen 4 times: 4 (3x) then 5 (1x), then the shorter context's
    assert tokens == [4, 5, 6]
    np.testing.assert_allclose(np.exp(logq[:2]), [0.75, 0.25], rtol=1e-6)
    assert row(9, 2, 3)[0] == [6, 4, 5]  # its own 6, then (2, 3)'s others in their order
    assert row(0, 2, 3)[0] == [4, 6, 5]  # (0, 2, 3) unseen: (2, 3) saw 4 3x, 6 2x, 5 1x
    assert row(-1, -1, 3)[0] == [4, 6, 5]  # a context with no tokens yet uses what it has
    assert row(0, 0, 15)[0] == [2, 3, 4]  # nothing stored: the unigram row
    assert len(set(row(7, 7, 7)[0])) == 3  # every row holds K distinct tokens


def test_layout_and_tables_are_checked():
    with pytest.raises(ValueError, match="powers of two"):
        NgramLayout(2, 4, (16, 24))
    with pytest.raises(ValueError, match="one size per context length"):
        NgramLayout(3, 4, (16, 32))
    drafter, _ = build_tables([[1, 2, 3]], vocab_size=8, context=2, topk=2)
    with pytest.raises(ValueError, match="outside a vocabulary"):
        build_tables([[1, 2, 30]], vocab_size=8, context=2, topk=2)
    with pytest.raises(ValueError, match="no n-grams"):
        build_tables([[1]], vocab_size=8)
    assert drafter.table_tokens.shape == (drafter.layout.slots, 2)


def greedy_equal_across_batches(target, drafter, tree):
    """Speculative greedy output equals `generate` at batch 1 and 3 (ragged prompts) and up to
    the cache's last slot; returns the calls' outputs."""
    outs = []
    for batch, new in ((1, 40), (3, 40), (3, LIVELY.max_seq_len - 8 - tree.num_nodes - 2)):
        rows = TEST_PROMPTS[:batch]
        ref = specjax.generate(target, rows, max_new_tokens=new)
        out = specjax.speculative_generate(
            target, drafter, rows, max_new_tokens=new, config=SpecConfig(tree=tree)
        )
        chex.assert_trees_all_equal(out.tokens, ref.tokens)
        chex.assert_trees_all_equal(out.lengths, ref.lengths)
        outs.append(out)
    return outs


@pytest.fixture(scope="module")
def lively():
    """A random target whose greedy text varies, and n-gram tables of its own greedy output
    (the test prompts' among others: what is tested is the mechanics, not generalization)."""
    target = lively_llama(LIVELY, seed=1)
    prompts = [[1 + i % 7, 2 + i % 5, 3 + i % 11] for i in range(24)] + TEST_PROMPTS
    out = specjax.generate(target, prompts, max_new_tokens=LIVELY.max_seq_len - 16)
    seqs = [p + list(np.asarray(t)) for p, t in zip(prompts, out.tokens, strict=True)]
    drafter, _ = build_tables(seqs, vocab_size=LIVELY.vocab_size, context=3, topk=4)
    return target, drafter


@pytest.fixture(scope="module")
def lively_lookup(lively):
    """The same target with small tables of other prompts' text and a text lookup of up to 4
    tokens: the row's own text decides most drafts."""
    target, _ = lively
    prompts = [[1 + i % 5, 2 + i % 3] for i in range(6)]
    out = specjax.generate(target, prompts, max_new_tokens=24)
    seqs = [p + list(np.asarray(t)) for p, t in zip(prompts, out.tokens, strict=True)]
    drafter, report = build_tables(seqs, vocab_size=LIVELY.vocab_size, context=2, topk=2,
                                   lookup=4, starts=[len(p) for p in prompts])  # fmt: skip
    assert sum(report["lookup_tries"]) > 0
    return target, drafter


def host_text_match(text, context, longest):
    """(token, length) of the latest longest match of context's tail in text (the token after
    it), by brute force; (None, 0) when not even the last token occurs."""
    best = (0, -1)
    for j in range(len(text)):
        m = 0
        while m < min(longest, len(context), j) and text[j - 1 - m] == context[-1 - m]:
            m += 1
        if m and (m, j) >= best:
            best = (m, j)
    return (text[best[1]], best[0]) if best[0] else (None, 0)


def test_text_match_takes_the_latest_longest_match():
    rng = np.random.default_rng(3)
    # One shape for every trial (one compilation): the text past `known` is random tokens
    # that must never match.
    match = jax.jit(match_text, static_argnums=3)
    for trial in range(40):
        length, s = int(rng.integers(1, 30)), 5
        text = rng.integers(0, 4, (2, 30)).tolist()
        known = rng.integers(1, length + 1, (2,))
        contexts = rng.integers(0, 4, (2, 3, s))
        contexts[0, 0, :2] = -1  # a context shorter than S
        token, order = match(
            jnp.asarray(text, jnp.int32), jnp.asarray(known, jnp.int32),
            jnp.asarray(contexts, jnp.int32), 4,
        )  # fmt: skip
        for b in range(2):
            for w in range(3):
                ctx = [t for t in contexts[b, w].tolist() if t >= 0]
                want_token, want_order = host_text_match(text[b][: known[b]], ctx, 4)
                assert int(order[b, w]) == want_order, (trial, b, w)
                if want_order:
                    assert int(token[b, w]) == want_token, (trial, b, w)


def test_lookup_hit_rates_count_the_latest_longest_match():
    tries, hits = lookup_hit_rates([[1, 2, 3, 1, 2, 3, 1, 2, 4]], 2)
    # Predicting positions 4..8: "1" -> 2 (length 1, right); "1 2" -> 3, "2 3" -> 1, "3 1" -> 2
    # (length 2, right); "1 2" -> 3 against 4 (wrong). Positions 1-3 have no earlier match.
    assert tries == [1, 4] and hits == [1, 3]
    q = lookup_logq_from(tries, hits)
    np.testing.assert_allclose(np.exp(q), [1.0, 0.75])
    assert lookup_logq_from([0, 2], [0, 0])[0] == pytest.approx(np.log(0.5))
    assert lookup_logq_from([0, 2], [0, 0])[1] == pytest.approx(np.log(1e-3))


def test_the_text_token_leads_and_is_not_proposed_twice(lively_lookup):
    """Where the text's match wins, its token is the first child and the table's row follows
    without it: a twin sibling could never be accepted."""
    _, drafter = lively_lookup
    s = drafter.span
    context = [-1] * (s - 2) + [1, 2]  # a short context: the table's row of (1, 2) or less
    row = np.asarray(drafter.lookup(jnp.asarray([context[-drafter.layout.context :]]))[0])[0]
    for follower, want in ((int(row[0]), row.tolist()), (63, [63, int(row[0])])):
        text = jnp.asarray([[1, 2, follower, 9, 9, 1, 2, -1]], jnp.int32)  # root 2 at index 6
        state = drafter.init_state(None, text[:, :6], jnp.asarray([6]), 8,
                                   config=SpecConfig(tree=TreeConfig.chain(1)))  # fmt: skip
        tokens, _ = drafter.children(state, text, jnp.asarray([[context]], jnp.int32))
        assert np.asarray(tokens)[0, 0].tolist() == want, (follower, row)


# The default run keeps the longer chain and the deeper tree (~10 s a case on a 2-core CPU);
# the shorter ones run under `slow`.
@pytest.mark.parametrize(
    "tree",
    [
        pytest.param(TreeConfig.chain(1), marks=pytest.mark.slow),
        TreeConfig.chain(5),
        pytest.param(TreeConfig(branching=(2, 1)), marks=pytest.mark.slow),
        TreeConfig(branching=(3, 2, 1)),
    ],
    ids=["chain1", "chain5", "2-1", "3-2-1"],
)
def test_text_lookup_greedy_equals_generate_across_trees_batches_and_the_cache_end(
    lively_lookup, tree
):
    greedy_equal_across_batches(*lively_lookup, tree)


def test_text_lookup_follows_the_committed_text(lively_lookup):
    """Every node's text match is the one a host replay finds in the committed text (prompt,
    then root + accepted path each step): the call takes exactly the replay's steps. A text
    written one position off, or a root left out, would stay lossless but take other steps."""
    target, drafter = lively_lookup
    c = drafter.layout.context

    def guess(text, context):  # (token, whether the text's match gave it)
        row = jnp.asarray([([-1] * c + context)[-c:]], jnp.int32)
        tokens, _, order = drafter.table_lookup(row)
        found, length = host_text_match(text, context, drafter.lookup_len)
        if length and length >= int(order[0]):
            return found, True
        return int(tokens[0, 0]), False

    prompts, from_text = TEST_PROMPTS, 0
    for k in (1, 4):
        out = specjax.speculative_generate(
            target, drafter, prompts, max_new_tokens=48, config=SpecConfig(tree=TreeConfig.chain(k))
        )
        for b, prompt in enumerate(prompts):
            seq = prompt + np.asarray(out.tokens[b]).tolist()
            pos, steps = len(prompt), 0  # seq[pos] is the pending root
            while pos < len(seq) - 1:
                accepted = 0
                while accepted < k and pos + 1 + accepted < len(seq):
                    token, text_gave = guess(seq[: pos + 1], seq[: pos + 1 + accepted])
                    if token != seq[pos + 1 + accepted]:
                        break
                    from_text += text_gave
                    accepted += 1
                pos += accepted + 1
                steps += 1
            assert int(np.asarray(out.stats["target_calls"])[b]) == steps, (k, b)
    assert from_text > 10, from_text  # the text's matches were drafted and accepted


# The default run keeps a chain, a deep tree and one wider than the tables' top-k (~7 s a
# case on a 2-core CPU); the shorter chain and tree run under `slow`.
@pytest.mark.parametrize(
    "tree",
    [
        pytest.param(TreeConfig.chain(1), marks=pytest.mark.slow),
        TreeConfig.chain(4),
        pytest.param(TreeConfig(branching=(2, 1)), marks=pytest.mark.slow),
        TreeConfig(branching=(4, 2, 1)),
        TreeConfig(branching=(6,)),
    ],  # fmt: skip
    ids=["chain1", "chain4", "2-1", "4-2-1", "wider-than-k"],
)
def test_greedy_equals_generate_across_trees_batches_and_the_cache_end(lively, tree):
    for out in greedy_equal_across_batches(*lively, tree):
        assert float(np.asarray(out.stats["tau"]).mean()) > 1.2  # drafts were accepted


def host_chain_steps(drafter, prompt, tokens, k: int) -> int:
    """Steps a chain of k needs for `tokens` after `prompt` when every node's context is the
    true last C tokens (what the drafter's history must give it): the reference for the
    drafter's own bookkeeping."""
    c = drafter.layout.context
    seq = list(prompt) + list(tokens)
    pos, steps = len(prompt), 0  # seq[pos] is the pending root
    while pos < len(seq) - 1:  # tokens remain after the root
        context = ([-1] * c + seq[: pos + 1])[-c:]
        accepted = 0
        while accepted < k and pos + 1 + accepted < len(seq):
            guess = int(np.asarray(drafter.lookup(jnp.asarray([context], jnp.int32))[0])[0, 0])
            if guess != seq[pos + 1 + accepted]:
                break
            context = context[1:] + [guess]
            accepted += 1
        pos += accepted + 1
        steps += 1
    return steps


def test_history_follows_the_committed_tokens(lively):
    """The drafter's per-row history (prompt tail, then root + accepted path each step) gives
    every node its true context: the call takes exactly the steps a host replay of the same
    tables on the output text takes. A history off by one token would still be lossless but
    draft from the wrong context, and take other steps."""
    target, drafter = lively
    prompts = TEST_PROMPTS[:2]
    for k in (1, 3):
        out = specjax.speculative_generate(
            target, drafter, prompts, max_new_tokens=40, config=SpecConfig(tree=TreeConfig.chain(k))
        )
        for b, prompt in enumerate(prompts):
            tokens = np.asarray(out.tokens[b]).tolist()
            # The first token comes from the prefill; steps emit the rest.
            want = host_chain_steps(drafter, prompt + tokens[:1], tokens[1:], k)
            assert int(np.asarray(out.stats["target_calls"])[b]) == want, (k, b)


# The default run keeps text-lookup (~25 s on a 2-core CPU): its children come from the
# text's matches and, where there is none, from the tables; tables alone run under `slow`.
@pytest.mark.parametrize(
    "lookup", [pytest.param(0, marks=pytest.mark.slow), 3], ids=["tables", "text-lookup"]
)
def test_sampled_ngram_trees_keep_the_target_distribution(optimized_loop, lookup):
    """Children are the tables' top-k, the text's token first where it matches (one-hot tree
    rule): the joint distribution of the first tokens over N_ROWS sampled rows is the target's
    exact one."""
    target = sharpened(CFG, 3, 3.0)
    keys = jax.random.split(jax.random.key(5), 64)
    sampled = specjax.generate(target, [PROMPT] * 64, max_new_tokens=12,
                               sampling=SamplingConfig(temperature=1.0), key=keys)  # fmt: skip
    seqs = [PROMPT + list(np.asarray(t)) for t in sampled.tokens]
    drafter, _ = build_tables(seqs, vocab_size=CFG.vocab_size, context=2, topk=2, lookup=lookup)
    tree = TreeConfig(branching=(2, 1))
    if lookup:  # the text's matches change the drafts (else this case repeats the tables')
        tables_only, _ = build_tables(seqs, vocab_size=CFG.vocab_size, context=2, topk=2)
        few = jax.random.split(jax.random.key(1), 64)
        hists = [
            np.asarray(specjax.speculative_generate(
                target, d, [PROMPT] * 64, max_new_tokens=12, config=SpecConfig(tree=tree),
                sampling=SamplingConfig(temperature=1.0), key=few,
            ).stats["accepted_hist"]).sum(0)
            for d in (drafter, tables_only)
        ]  # fmt: skip
        assert not np.array_equal(*hists), hists
    sampling = SamplingConfig(temperature=1.0)
    n = observed_tokens(tree)
    out = specjax.speculative_generate(
        target, drafter, [PROMPT] * N_ROWS, max_new_tokens=n, config=SpecConfig(tree=tree),
        sampling=sampling, key=jax.random.split(jax.random.key(0), N_ROWS),
    )  # fmt: skip
    problem = check_rows(np.asarray(out.tokens), target, sampling)
    assert problem is None, problem
    hist = np.asarray(out.stats["accepted_hist"]).sum(0)
    assert hist[1:].sum() > 0.05 * hist.sum() and hist[:-1].sum() > 0.05 * hist.sum(), hist


def test_checkpoint_round_trip_and_errors(lively, tmp_path):
    target, drafter = lively
    folder = save_ngram_drafter(drafter, tmp_path / "ng", {
        "target_name": "lively", "target_fingerprint": target_fingerprint(target),
    })  # fmt: skip
    loaded = load_drafter(folder, target)
    np.testing.assert_array_equal(loaded.table_tokens, drafter.table_tokens)
    np.testing.assert_array_equal(loaded.table_logq, drafter.table_logq)
    np.testing.assert_array_equal(
        np.asarray(loaded.fingerprints[...]), np.asarray(drafter.fingerprints[...])
    )
    assert loaded.checkpoint_dir == str(folder)
    with pytest.raises(ValueError, match="no pre-verifier"):
        load_drafter(folder, target, pre_verifier=True)
    other = lively_llama(LIVELY, seed=2)  # same shapes, other weights
    with pytest.raises(ValueError, match="another target's outputs"):
        load_drafter(folder, other)
    with pytest.warns(UserWarning, match="using them anyway"):
        load_drafter(folder, other, strict=False)
    with pytest.raises(ValueError, match="vocabulary of 64 tokens, the target has 16"):
        load_drafter(folder, specjax.Llama(TINY, rngs=nnx.Rngs(0)))
    header = json.loads((folder / HEADER).read_text())
    (folder / HEADER).write_text(json.dumps({**header, "sizes": [3, 5, 7]}))
    with pytest.raises(ValueError, match="not a valid n-gram drafter header"):
        load_drafter(folder, target)
    (folder / HEADER).write_text(json.dumps(header))
    for f in (folder / "tables").rglob("*"):
        if f.is_file() and f.stat().st_size > 1000:
            f.write_bytes(b"damaged")
    with pytest.raises(ValueError, match="missing or damaged"):
        load_drafter(folder, target)


def test_text_lookup_round_trips_and_version_1_reads_as_tables_only(lively_lookup, tmp_path):
    target, drafter = lively_lookup
    header = {"target_name": "lively", "target_fingerprint": target_fingerprint(target)}
    folder = save_ngram_drafter(drafter, tmp_path / "ng", header)
    loaded = load_drafter(folder, target)
    assert loaded.lookup_len == 4 and loaded.lookup_logq == drafter.lookup_logq
    stored = json.loads((folder / HEADER).read_text())
    old = {k: v for k, v in stored.items() if k not in ("lookup", "lookup_logq")}
    (folder / HEADER).write_text(json.dumps({**old, "version": 1}))
    assert load_drafter(folder, target).lookup_len == 0
    for broken in ({"lookup_logq": [-0.1]}, {"lookup_logq": [0.5] * 4}, {"lookup": None}):
        (folder / HEADER).write_text(json.dumps({**stored, **broken}))
        with pytest.raises(ValueError, match="not a valid n-gram drafter header"):
            load_drafter(folder, target)
    with pytest.raises(ValueError, match="one log-probability <= 0 per match length"):
        type(drafter)(
            drafter.layout, drafter.fingerprints[...], drafter.table_tokens, drafter.table_logq,
            vocab_size=LIVELY.vocab_size, lookup=2, lookup_logq=(0.5, -1.0),
        )  # fmt: skip


def test_text_only_lookup_is_lossless_and_named_by_the_cli_spelling(lively):
    """The text lookup with no tables (prompt-lookup decoding): greedy equal to generate over a
    chain and a tree, batch 3, and `lookup:K` builds it for the target's vocabulary."""
    from specjax.drafters.spec import is_text_lookup, make_drafter
    from specjax.io import Loaded

    target, _ = lively
    drafter = make_drafter("lookup:5", Loaded(model=target, tokenizer=None, config=LIVELY))
    assert drafter.lookup_len == 5 and drafter.vocab_size == LIVELY.vocab_size
    assert is_text_lookup("lookup") and not is_text_lookup("lookups/dir")
    with pytest.raises(ValueError, match="lookup:K with K >= 1"):
        make_drafter("lookup:0", Loaded(model=target, tokenizer=None, config=LIVELY))
    for tree in (TreeConfig.chain(4), TreeConfig(branching=(2, 2, 1))):
        ref = specjax.generate(target, TEST_PROMPTS, max_new_tokens=40)
        out = specjax.speculative_generate(
            target, drafter, TEST_PROMPTS, max_new_tokens=40, config=SpecConfig(tree=tree)
        )
        chex.assert_trees_all_equal(out.tokens, ref.tokens)
        assert float(np.asarray(out.stats["tau"]).mean()) > 1.0
