"""Checkpoint readers: llama2.c (legacy and v1), GGUF, HF directories, and their error messages."""

import struct

import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.cache import init_cache
from specjax.io.llama2c import MAGIC_V1, read_llama2c
from specjax.paths import STORIES260K
from specjax.tree import causal_mask


def logits_of(model, ids):
    t = len(ids)
    return np.asarray(
        model(
            jnp.asarray([ids]),
            positions=jnp.arange(t)[None],
            cache=init_cache(model.config, 1, t),
            tree_mask=causal_mask(1, t),
        ).logits[0]
    )


def write_llama2c_v1(path, cfg, w):
    """Write weights in llama2.c's version-1 export order (the reader's other layout)."""
    header = (
        struct.pack("<Ii", MAGIC_V1, 1)
        + struct.pack(
            "<7i",
            cfg.d_model,
            cfg.ffn_dim,
            cfg.n_layers,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.vocab_size,
            cfg.max_seq_len,
        )
        + struct.pack("<B", 1)
    )
    header += b"\0" * (256 - len(header))
    t = lambda a: np.ascontiguousarray(a.transpose(0, 2, 1))  # noqa: E731 - back to [out, in]
    parts = [
        w["attn_norm"],
        w["mlp_norm"],
        w["final_norm"],
        w["embed"],
        t(w["wq"]),
        t(w["wk"]),
        t(w["wv"]),
        t(w["wo"]),
        t(w["w_gate"]),
        t(w["w_down"]),
        t(w["w_up"]),
    ]
    path.write_bytes(header + b"".join(np.asarray(p, "<f4").tobytes() for p in parts))


@pytest.fixture(scope="module")
def stories_file(shared_dir):
    path = shared_dir / STORIES260K
    if not path.exists():
        pytest.skip(f"{path} missing")
    return path


def test_llama2c_v1_equals_legacy(stories_file, tmp_path):
    cfg, w = read_llama2c(stories_file)
    v1 = tmp_path / "model_v1.bin"
    write_llama2c_v1(v1, cfg, w)
    ids = [1, 403, 407, 261, 378]
    np.testing.assert_allclose(
        logits_of(specjax.load(v1, tokenizer=None).model, ids),
        logits_of(specjax.load(stories_file).model, ids),
        atol=1e-6,
    )


def test_llama2c_takes_the_tokenizer_of_its_vocabulary(stories_file, tmp_path):
    """Beside a 512-token model, tok0600.bin (another model's, sorted first) is passed over for
    tok512.bin; with no tokenizer that fits, loading names the files and what to do."""
    import shutil
    import struct

    model = tmp_path / "stories260K.bin"
    shutil.copy(stories_file, model)
    other = struct.pack("<i", 1) + b"".join(struct.pack("<fi", 0.0, 1) + b"x" for _ in range(600))
    (tmp_path / "tok0600.bin").write_bytes(other)
    with pytest.raises(ValueError, match=r"tok0600.bin: 600\): pass tokenizer=PATH"):
        specjax.load(model)
    # An explicit tokenizer replaces the search beside the model.
    explicit = specjax.load(model, tokenizer=stories_file.parent / "tok512.bin")
    assert explicit.tokenizer.vocab_size == 512
    shutil.copy(stories_file.parent / "tok512.bin", tmp_path / "tok512.bin")
    assert specjax.load(model).tokenizer.vocab_size == 512


def test_truncated_llama2c_names_the_mismatch(stories_file, tmp_path):
    bad = tmp_path / "truncated.bin"
    bad.write_bytes(stories_file.read_bytes()[:-400])
    with pytest.raises(ValueError, match="shape mismatch between header and data"):
        specjax.load(bad)


def test_unknown_format(tmp_path):
    bad = tmp_path / "weights.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="unknown checkpoint format"):
        specjax.load(bad)


def test_directory_without_config(tmp_path):
    with pytest.raises(ValueError, match="unknown checkpoint layout"):
        specjax.load(tmp_path)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        specjax.load(tmp_path / "nope.gguf")


def test_missing_tensor_in_hf_dir(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    import json

    (tmp_path / "config.json").write_text(
        json.dumps(
            dict(
                model_type="llama",
                vocab_size=16,
                hidden_size=8,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=2,
                intermediate_size=16,
                tie_word_embeddings=True,
            )
        )
    )
    safetensors_numpy.save_file(
        {
            "model.embed_tokens.weight": np.zeros((16, 8), np.float32),
            "model.norm.weight": np.ones(8, np.float32),
        },
        str(tmp_path / "model.safetensors"),
    )
    with pytest.raises(ValueError, match="missing tensors"):
        specjax.load(tmp_path)


TINY_HF_CONFIG = dict(
    model_type="llama", vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, intermediate_size=16, tie_word_embeddings=True,
)  # fmt: skip


def test_hf_features_the_target_would_ignore_are_refused(tmp_path):
    """An output-projection bias, an MLP of another kind, RoPE scaling under rope_parameters or
    a config lacking a key are refused, naming the problem; a sliding window caps the context
    at the window, where whole-context attention is the same."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    import json

    from specjax.io.hf import hf_config

    layer = {
        "input_layernorm.weight": (8,), "post_attention_layernorm.weight": (8,),
        "self_attn.q_proj.weight": (8, 8), "self_attn.k_proj.weight": (8, 8),
        "self_attn.v_proj.weight": (8, 8), "self_attn.o_proj.weight": (8, 8),
        "self_attn.o_proj.bias": (8,), "mlp.gate_proj.weight": (16, 8),
        "mlp.up_proj.weight": (16, 8), "mlp.down_proj.weight": (8, 16),
    }  # fmt: skip
    tensors = {f"model.layers.0.{k}": np.ones(v, np.float32) for k, v in layer.items()}
    tensors |= {"model.embed_tokens.weight": np.ones((16, 8), np.float32),
                "model.norm.weight": np.ones(8, np.float32)}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(TINY_HF_CONFIG))
    safetensors_numpy.save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"does not use \(\['layers.0.self_attn.o_proj.bias'\]"):
        specjax.load(tmp_path)
    for change, named in (
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"mlp_bias": True}, "and biases"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, r"RoPE scaling \(llama3"),
        ({"intermediate_size": None}, r"lacks \['intermediate_size'\]"),
    ):
        cfg = {k: v for k, v in {**TINY_HF_CONFIG, **change}.items() if v is not None}
        with pytest.raises(ValueError, match=named):
            hf_config(cfg, "m")
    window = {**TINY_HF_CONFIG, "max_position_embeddings": 4096, "sliding_window": 1024}
    assert hf_config(window, "m").max_seq_len == 1024
    assert hf_config({**window, "use_sliding_window": False}, "m").max_seq_len == 4096


def test_unsupported_model_type(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        specjax.load(tmp_path)


def test_shape_mismatch_in_weights():
    from specjax.models.target import model_from_weights, weight_shapes

    w = {k: np.zeros(s, np.float32) for k, s in weight_shapes(specjax.TINY).items()}
    w["wq"] = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="tensor 'wq' has shape"):
        model_from_weights(specjax.TINY, w)


def test_gguf_garbage_is_rejected(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(ValueError, match="GGUF"):
        specjax.load(bad)


def write_tiny_gguf(path, cfg, weights, extra=None):
    """A llama GGUF of `cfg` holding `weights` (canonical [in, out] matrices, stored [out, in]
    as llama.cpp does) and a byte-level BPE tokenizer of cfg.vocab_size tokens; extra(writer)
    adds metadata or tensors."""
    import gguf

    from specjax.io.gguf_reader import _LAYER_NAMES

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(ord("a") + i) for i in range(cfg.vocab_size)])
    w.add_token_types([1] * cfg.vocab_size)
    w.add_token_merges([])
    w.add_tensor("token_embd.weight", weights["embed"])
    w.add_tensor("output_norm.weight", weights["final_norm"])
    for gguf_name, name in _LAYER_NAMES.items():
        if name in weights:
            for i, layer in enumerate(weights[name]):
                w.add_tensor(f"blk.{i}.{gguf_name}.weight", layer.T if layer.ndim == 2 else layer)
    if extra is not None:
        extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_features_the_target_would_ignore_are_refused(tmp_path):
    """RoPE scaling, a sliding window or a tensor the loader would not read: the model would
    load and compute something else, so loading refuses it, naming what."""
    from specjax.models.target import weight_shapes

    weights = {k: np.ones(s, np.float32) for k, s in weight_shapes(specjax.TINY).items()}
    half = specjax.TINY.head_dim // 2
    cases = {
        "RoPE scaling": lambda w: w.add_tensor("rope_freqs.weight", np.ones(half, np.float32)),
        "sliding-window attention": lambda w: w.add_uint32("llama.attention.sliding_window", 8),
        "does not use": lambda w: w.add_tensor("blk.0.attn_output.bias", np.ones(4, np.float32)),
        "head dimensions": lambda w: w.add_uint32("llama.rope.dimension_count", half),
    }
    for i, (named, extra) in enumerate(cases.items()):
        path = write_tiny_gguf(tmp_path / f"m{i}.gguf", specjax.TINY, weights, extra)
        with pytest.raises(ValueError, match=named):
            specjax.load(path)


def test_gguf_is_parsed_once_and_read_exactly(tmp_path, monkeypatch):
    import gguf

    from specjax.models.target import weight_shapes

    rng = np.random.default_rng(0)
    weights = {
        k: rng.standard_normal(s).astype(np.float32) for k, s in weight_shapes(specjax.TINY).items()
    }
    path = write_tiny_gguf(tmp_path / "tiny.gguf", specjax.TINY, weights)

    # The reader over a plain view of the map holds the same records as the package's own.
    from specjax.io.gguf_reader import open_gguf, read_gguf

    ours, theirs = open_gguf(path), gguf.GGUFReader(str(path))
    assert list(ours.fields) == list(theirs.fields)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        np.testing.assert_array_equal(a.data, b.data)
    _, read = read_gguf(ours)
    for name, value in weights.items():
        np.testing.assert_array_equal(read[name], value, err_msg=name)

    # `load` parses the file once for the weights and the tokenizer (parsing SmolLM2's
    # vocabulary is most of its loading time).
    parses = []
    init = gguf.GGUFReader.__init__

    def counted_init(self, *args, **kwargs):
        parses.append(args)
        init(self, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFReader, "__init__", counted_init)
    loaded = specjax.load(path)
    assert len(parses) == 1
    assert loaded.tokenizer.vocab_size == specjax.TINY.vocab_size
    np.testing.assert_array_equal(np.asarray(loaded.model.embed[...]), weights["embed"])
