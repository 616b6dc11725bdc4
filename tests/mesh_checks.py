"""Mesh checks run in a subprocess with 8 host devices (tests/test_sharding.py starts it).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/mesh_checks.py \
        --meshes 1x1,8x1,2x4,1x8 --checks generate,spec_lm,spec_feature

For each mesh the target is built from the same seed, placed with specjax.shard_model, and every
check compares tokens with the same call on one device (unsharded): greedy and sampled with the
same keys. It also asserts the weights' and outputs' shardings and that a second call reuses the
compiled program. Prints one line per passed check; any mismatch raises (non-zero exit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("run with XLA_FLAGS=--xla_force_host_platform_device_count=8")

import chex
import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from lively_models import lively_llama

import specjax
from specjax import decode, speculative
from specjax.config import ModelConfig, SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters.feature import EagleDrafter, HiddenStateDrafter
from specjax.drafters.lm import LMDrafter
from specjax.models.drafter import DrafterConfig, DrafterNet
from specjax.models.exit_head import ExitHead

# Sized for the mesh: 8 query heads split over 'model' up to 8 ways; 4 kv heads split over a
# 4-way 'model' axis and stay replicated on an 8-way one (the documented fallback).
CFG = ModelConfig(
    vocab_size=64,
    d_model=64,
    n_layers=2,
    n_heads=8,
    n_kv_heads=4,
    head_dim=8,
    ffn_dim=128,
    max_seq_len=128,
)
DRAFT_CFG = ModelConfig(
    vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64,
    max_seq_len=128,
)  # fmt: skip
PROMPTS = [[1, 5, 7], [1, 2, 3, 4, 5, 6, 7, 8], [3], [9, 9, 2, 11, 4], [2], [6, 6], [8, 1, 3], [5]]
MAX_NEW = 12
SAMPLED = SamplingConfig(temperature=1.0)


def feature_drafter(target, kind: str = "mdc") -> HiddenStateDrafter | EagleDrafter:
    cfg = DrafterConfig(kind=kind, target=target.config, draft_vocab_size=CFG.vocab_size)
    net = DrafterNet(cfg, np.arange(CFG.vocab_size), rngs=nnx.Rngs(7), target=target)
    return HiddenStateDrafter(net, target) if kind == "mdc" else EagleDrafter(net, target)


def run(check: str, target, sampling: SamplingConfig, attn_impl: str):
    """One decoding call of kind `check` on `target` (drafters are rebuilt for each target)."""
    keys = jax.random.split(jax.random.key(3), len(PROMPTS))
    kwargs = dict(max_new_tokens=MAX_NEW, sampling=sampling, key=keys)
    if check == "generate":
        return specjax.generate(target, PROMPTS, attn_impl=attn_impl, **kwargs)
    if check == "spec_lm":
        drafter = LMDrafter(lively_llama(DRAFT_CFG, 5))
        config = SpecConfig(tree=TreeConfig(branching=(2, 1, 1)), attn_impl=attn_impl)
    elif check == "spec_lm_split":  # the draft model split over 'model' like the target
        draft = lively_llama(DRAFT_CFG, 5)
        mesh = specjax.sharding.mesh_of(nnx.state(target))
        drafter = LMDrafter(draft if mesh is None else specjax.shard_model(draft, mesh))
        config = SpecConfig(tree=TreeConfig(branching=(2, 1, 1)), attn_impl=attn_impl)
    elif check == "spec_self":
        drafter = LMDrafter.self_draft(1)
        config = SpecConfig(tree=TreeConfig.chain(3), attn_impl=attn_impl)
    elif check == "spec_feature":
        drafter = feature_drafter(target)
        config = SpecConfig(tree=TreeConfig.dynamic(6, 3, 2), attn_impl=attn_impl)
    elif check == "spec_eagle":
        drafter = feature_drafter(target, kind="eagle")
        config = SpecConfig(tree=TreeConfig.dynamic(6, 3, 2), attn_impl=attn_impl)
    elif check == "spec_paced":  # PACER: a pre-verifier prunes each tree, buckets verify it
        from specjax.models.pre_verifier import PreVerifier, PreVerifierConfig

        drafter = feature_drafter(target, kind="eagle")
        pv = PreVerifier(PreVerifierConfig(threshold=0.3), rngs=nnx.Rngs(1))
        pv.proj_out.kernel.set_value(pv.proj_out.kernel[...] * 8)  # predictions spread out
        drafter.pre_verifier = pv
        config = SpecConfig(tree=TreeConfig.dynamic(9, 4, 3), attn_impl=attn_impl)
    elif check == "spec_early_exit":  # HiSpec: an exit head at layer 1 screens each tree
        head = ExitHead(CFG.d_model, layer=1, kind="mlp", vocab=np.arange(CFG.vocab_size),
                        eps=CFG.norm_eps, rngs=nnx.Rngs(4))  # fmt: skip
        nnx.update(head, jax.tree.map(lambda x: x + 0.05, nnx.state(head, nnx.Param)))
        config = SpecConfig(tree=TreeConfig(branching=(2, 1)), attn_impl=attn_impl)
        return specjax.speculative_generate(
            target, LMDrafter.self_draft(1), PROMPTS, config=config,
            verifier=specjax.EarlyExitVerifier(head, target), **kwargs,
        )  # fmt: skip
    elif check == "spec_hsd":
        drafter = LMDrafter(lively_llama(DRAFT_CFG, 5))
        config = SpecConfig(tree=TreeConfig.chain(3), rule="hsd", attn_impl=attn_impl)
    elif check == "spec_tree_sampled":
        drafter = LMDrafter(lively_llama(DRAFT_CFG, 5))
        config = SpecConfig(
            tree=TreeConfig(branching=(2, 1, 1)), rule="tree_sampled", attn_impl=attn_impl
        )
    else:
        raise ValueError(f"unknown check {check!r}")
    return specjax.speculative_generate(target, drafter, PROMPTS, config=config, **kwargs)


def write_hf_dir(model, path: Path) -> None:
    """The model as a Hugging Face Llama directory (config.json + one safetensors file)."""
    from safetensors.numpy import save_file

    cfg = model.config
    w = {n: np.asarray(a) for n, a in model.layers.arrays().items()}  # canonical [L, in, out]
    names = dict(wq="self_attn.q_proj", wk="self_attn.k_proj", wv="self_attn.v_proj",
                 wo="self_attn.o_proj", w_gate="mlp.gate_proj", w_up="mlp.up_proj",
                 w_down="mlp.down_proj")  # fmt: skip
    tensors = {
        "model.embed_tokens.weight": np.asarray(model.embed[...]),
        "model.norm.weight": np.asarray(model.final_norm[...]),
    }
    for i in range(cfg.n_layers):
        for ours, theirs in names.items():
            tensors[f"model.layers.{i}.{theirs}.weight"] = np.ascontiguousarray(w[ours][i].T)
        tensors[f"model.layers.{i}.input_layernorm.weight"] = np.asarray(
            model.layers.attn_norm[...][i]
        )
        tensors[f"model.layers.{i}.post_attention_layernorm.weight"] = np.asarray(
            model.layers.mlp_norm[...][i]
        )
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(
        json.dumps(
            dict(
                model_type="llama",
                vocab_size=cfg.vocab_size,
                hidden_size=cfg.d_model,
                num_hidden_layers=cfg.n_layers,
                num_attention_heads=cfg.n_heads,
                num_key_value_heads=cfg.n_kv_heads,
                intermediate_size=cfg.ffn_dim,
                tie_word_embeddings=True,
                rms_norm_eps=cfg.norm_eps,
                rope_theta=cfg.rope_theta,
                max_position_embeddings=cfg.max_seq_len,
            )  # fmt: skip
        )
    )


def canonical_weights(model) -> dict:
    """A target's weights in the canonical layout (an unsharded CPU load stores its layer
    matrices [out, in]: specjax.models.target.Layers), as numpy arrays by name."""
    from specjax.train.checkpoint import fingerprint_tensors

    return {n: np.asarray(w) for n, w in fingerprint_tensors(model).items()}


def check_load(mesh, hf_dir: Path, ref_tokens) -> None:
    """specjax.load(mesh=...) reads the safetensors slice by slice onto the mesh: the same
    weights as an unsharded load, placed as shard_model places them, and the same tokens."""
    plain = specjax.load(hf_dir).model
    sharded = specjax.load(hf_dir, mesh=mesh).model
    assert_weights_sharded(sharded, mesh)
    assert sharded.layers.wq.get_metadata()["logical_axes"] == ("layers", "embed", "q_heads")
    chex.assert_trees_all_equal(canonical_weights(plain), canonical_weights(sharded))
    out = specjax.generate(sharded, PROMPTS, max_new_tokens=MAX_NEW)
    chex.assert_trees_all_equal(np.asarray(out.tokens), ref_tokens)


def check_errors(mesh) -> None:
    """Bad input is refused before anything compiles, with the reason."""
    target = specjax.shard_model(lively_llama(CFG, 0), mesh)
    try:
        specjax.generate(target, PROMPTS[:3], max_new_tokens=4)
    except ValueError as e:
        assert "does not divide over the mesh's 'data' axis" in str(e), e
    else:
        raise AssertionError("a batch of 3 on a 2-way 'data' axis was accepted")
    try:
        specjax.make_mesh(data=4, model=4)
    except ValueError as e:
        assert "needs 16 devices, but only 8 exist" in str(e), e
    else:
        raise AssertionError("a 4x4 mesh on 8 devices was accepted")


def assert_kernel_in_shard_map(target) -> None:
    """With attn_impl="interpret" the Pallas call runs inside a shard_map (not auto-partitioned)."""
    graphdef, params = nnx.split(target)
    ids = np.ones((len(PROMPTS), 16), np.int32)
    traced = decode._generate.trace(
        graphdef, params, ids, np.ones(len(PROMPTS), np.int32),
        jax.random.split(jax.random.key(0), len(PROMPTS)), np.int32(-1),
        max_new_tokens=2, sampling=SamplingConfig(), attn_impl="interpret",
        mesh=specjax.sharding.mesh_of(params),
    )  # fmt: skip
    text = str(traced.jaxpr)
    assert "shard_map" in text and "pallas_call" in text, "kernel not inside shard_map"


def check_checkpoints(mesh, other_mesh, tmp: Path) -> None:
    """A target saved from `mesh` restores onto `other_mesh` and onto one device with the same
    values, each laid out for where it lands; drafter params and optimizer state likewise."""
    from specjax.train import sharded_checkpoint as sc
    from specjax.train.trainer import TrainConfig, make_optimizer

    target = specjax.shard_model(lively_llama(CFG, 0), mesh)
    sc.save_target(tmp / "target", target)
    for where in (other_mesh, None):
        back = sc.load_target(tmp / "target", mesh=where)
        chex.assert_trees_all_equal(canonical_weights(target), canonical_weights(back))
        if where is not None:
            assert_weights_sharded(back, where)
    net = feature_drafter(lively_llama(CFG, 0)).net
    params = nnx.state(net, nnx.Param)
    state = specjax.sharding.replicate(
        {"params": params, "opt": make_optimizer(TrainConfig(steps=2)).init(params)}, mesh
    )
    sc.save_tree(tmp / "train_state", state)
    back = sc.restore_tree(tmp / "train_state", sc.abstract_on(state, other_mesh))
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, state), jax.tree.map(np.asarray, back))
    assert all(x.sharding.mesh == other_mesh for x in jax.tree.leaves(back))


def check_training(mesh) -> None:
    """Data-parallel drafter training: the same updates as one device (gradients averaged over
    the rows of every device), up to float summation order."""
    from specjax.models.drafter import target_parts
    from specjax.train.data import Dataset
    from specjax.train.trainer import TrainConfig, train

    rng = np.random.default_rng(0)
    # Prompts long enough that the unrolled levels run on answer windows (64 of 128 positions).
    rows, width = 16, 128
    data = Dataset(
        tokens=rng.integers(0, CFG.vocab_size, (rows, width)).astype(np.int32),
        feats=rng.normal(size=(rows, width, CFG.d_model)).astype(np.float16),
        lengths=np.full(rows, width - 4, np.int32),
        prompt_lens=np.full(rows, 70, np.int32),
    )
    cfg = TrainConfig(steps=3, batch=8, warmup=1, levels=2)
    trained = []
    for where in (None, mesh):
        target = lively_llama(CFG, 0)
        net = feature_drafter(target).net
        parts = target_parts(target, net.draft_vocab[...])
        train(net, parts, data, cfg, mesh=where)
        trained.append(nnx.state(net, nnx.Param))
    leaves = jax.tree.leaves(trained[1])
    assert any(isinstance(x.sharding, NamedSharding) for x in leaves), "not trained on the mesh"
    before = jax.tree.leaves(nnx.state(feature_drafter(lively_llama(CFG, 0)).net, nnx.Param))
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in
                zip(jax.tree.leaves(trained[0]), before, strict=True))  # fmt: skip
    assert moved > 1e-4, "training did not change the drafter"
    chex.assert_trees_all_close(
        jax.tree.map(np.asarray, trained[0]), jax.tree.map(np.asarray, trained[1]),
        rtol=1e-4, atol=1e-5,
    )  # fmt: skip


def compiled_programs(check: str) -> int:
    fn = decode._generate if check == "generate" else speculative._speculative
    return fn._cache_size()


def assert_weights_sharded(model, mesh) -> None:
    """The projections are really split: each device holds 1/model of wq and wo, 1/model of the
    vocabulary, and kv heads only when they divide."""
    m = mesh.shape["model"]
    expect = {
        "wq": P(None, None, "model"),
        "wo": P(None, "model", None),
        "w_gate": P(None, None, "model"),
        "w_down": P(None, "model", None),
        "wk": P(None, None, "model") if CFG.n_kv_heads % m == 0 else P(None, None, None),
    }
    for name, spec in expect.items():
        w = getattr(model.layers, name)[...]
        want = spec if m > 1 else P(None, None, None)
        assert isinstance(w.sharding, NamedSharding), (name, w.sharding)
        assert w.sharding.mesh == mesh and w.sharding.spec == want, (name, w.sharding, want)
        shard = w.addressable_shards[0].data.shape
        split_axis = 2 if name in ("wq", "w_gate", "wk") else 1
        if want[split_axis] == "model":
            assert shard[split_axis] * m == w.shape[split_axis], (name, shard, w.shape)
    emb = model.embed[...]
    assert emb.sharding.spec == (P("model", None) if m > 1 else P(None, None)), emb.sharding


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshes", default="1x1,8x1,2x4,1x8")
    parser.add_argument("--checks", default="generate,spec_lm,spec_feature")
    parser.add_argument("--sampling", default="greedy,sampled")
    parser.add_argument("--attn", default="reference")
    parser.add_argument(
        "--rules", default="", help="logical=mesh remaps, e.g. embed=data (2D weight-stationary)"
    )
    parser.add_argument("--load", action="store_true", help="also check load(mesh=...)")
    parser.add_argument("--errors", action="store_true", help="also check the refusals")
    parser.add_argument(
        "--train", action="store_true", help="also check training and sharded checkpoints"
    )
    args = parser.parse_args()
    assert jax.device_count() == 8, jax.device_count()
    samplings = {"greedy": SamplingConfig(), "sampled": SAMPLED}
    refs = {}
    for check in args.checks.split(","):
        for s in args.sampling.split(","):
            out = run(check, lively_llama(CFG, 0), samplings[s], args.attn)
            refs[check, s] = np.asarray(out.tokens)
            # Non-degenerate reference: rows differ and tokens vary within rows.
            assert len({tuple(r) for r in refs[check, s]}) > 1, refs[check, s]
    for shape in args.meshes.split(","):
        data, model = (int(x) for x in shape.split("x"))
        mesh = specjax.make_mesh(data=data, model=model)
        if args.rules:
            rules = dict(specjax.sharding.RULES)
            rules |= dict(r.split("=") for r in args.rules.split(","))
            target = specjax.shard_model(lively_llama(CFG, 0), mesh, rules=rules)
            wq = target.layers.wq[...]
            want = specjax.sharding.weight_sharding("wq", CFG, mesh, rules)
            assert wq.sharding.spec == want.spec, (wq.sharding, want)
            print(f"rules {args.rules}: wq {wq.sharding.spec}", flush=True)
        else:
            target = specjax.shard_model(lively_llama(CFG, 0), mesh)
            assert_weights_sharded(target, mesh)
        if args.attn == "interpret" and model > 1:
            assert_kernel_in_shard_map(target)
        if args.load:
            with tempfile.TemporaryDirectory() as tmp:
                write_hf_dir(lively_llama(CFG, 0), Path(tmp))
                greedy = run("generate", lively_llama(CFG, 0), SamplingConfig(), "reference")
                check_load(mesh, Path(tmp), np.asarray(greedy.tokens))
            print(f"ok {shape} load", flush=True)
        if args.train:
            check_training(mesh)
            other = specjax.make_mesh(data=model, model=data)  # the transposed shape
            with tempfile.TemporaryDirectory() as tmp:
                check_checkpoints(mesh, other, Path(tmp))
            print(f"ok {shape} train", flush=True)
        if args.errors and data > 1:
            check_errors(mesh)
            print(f"ok {shape} errors", flush=True)
        for check in args.checks.split(","):
            for s in args.sampling.split(","):
                t0 = time.perf_counter()
                out = run(check, target, samplings[s], args.attn)
                first = time.perf_counter() - t0
                tokens = np.asarray(out.tokens)
                chex.assert_trees_all_equal(tokens, refs[check, s])
                if data > 1:  # the rows stay where they were computed
                    assert out.tokens.sharding.spec[0] == "data", out.tokens.sharding
                # A second call reuses the compiled program.
                before = compiled_programs(check)
                again = run(check, target, samplings[s], args.attn)
                np.testing.assert_array_equal(np.asarray(again.tokens), tokens)
                assert compiled_programs(check) == before, (check, shape, "recompiled")
                print(f"ok {shape} {check} {s} ({first:.1f} s first call)", flush=True)


if __name__ == "__main__":
    main()
