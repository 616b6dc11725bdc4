"""The target on a ('data', 'model') device mesh: partition specs, refusals, and token equality
with one device on 8 host devices.

The 8-device checks run tests/mesh_checks.py in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (the flag must be set before JAX starts, and the
rest of the suite keeps one device).
"""

import os
import subprocess
import sys
from pathlib import Path

import chex
import jax
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import specjax
from specjax import sharding
from specjax.config import TINY, ModelConfig

HERE = Path(__file__).parent
# Llama-3-70B's shapes (the README's worked plan): 64 query heads, 8 kv heads.
LLAMA3_70B = ModelConfig(
    vocab_size=128256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128,
    ffn_dim=28672, max_seq_len=8192, dtype="bfloat16",
)  # fmt: skip


def abstract_mesh(data: int, model: int) -> AbstractMesh:
    return AbstractMesh((data, model), sharding.MESH_AXES)


def run_mesh_checks(*args: str, timeout: int = 900) -> str:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(HERE / "mesh_checks.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc.stdout


def test_weight_specs_megatron_layout():
    mesh = abstract_mesh(2, 4)
    specs = {n: sharding.weight_sharding(n, LLAMA3_70B, mesh).spec for n in sharding.LOGICAL_AXES}
    assert specs["wq"] == P(None, None, "model")
    assert specs["wk"] == P(None, None, "model")  # 8 kv heads over 4
    assert specs["wo"] == P(None, "model", None)
    assert specs["w_up"] == P(None, None, "model")
    assert specs["w_down"] == P(None, "model", None)
    assert specs["embed"] == P("model", None)
    assert specs["attn_norm"] == P(None, None)


def test_kv_heads_replicate_when_they_do_not_divide():
    """8 kv heads on a 16-way 'model' axis: K/V stay whole (weights and cache), queries split."""
    mesh = abstract_mesh(1, 16)
    assert sharding.weight_sharding("wk", LLAMA3_70B, mesh).spec == P(None, None, None)
    assert sharding.weight_sharding("wq", LLAMA3_70B, mesh).spec == P(None, None, "model")
    assert sharding.cache_spec(LLAMA3_70B.n_kv_heads, mesh) == P(None, "data", None, None, None)
    assert sharding.cache_spec(8, abstract_mesh(2, 8)) == P(None, "data", None, "model", None)


def test_rules_remap_and_refuse_unknown_names():
    mesh = abstract_mesh(2, 4)
    rules = dict(sharding.RULES, vocab=None, embed="data")
    assert sharding.weight_sharding("embed", LLAMA3_70B, mesh, rules).spec == P(None, "data")
    with pytest.raises(ValueError, match="unknown logical axes"):
        sharding.check_rules({"heads": "model"})
    with pytest.raises(ValueError, match="mesh axes"):
        sharding.check_rules({"vocab": "tensor"})


def test_make_mesh_refusals():
    with pytest.raises(ValueError, match=r"needs 16 devices, but only \d+ exist"):
        specjax.make_mesh(data=jax.device_count() * 8, model=2)
    with pytest.raises(ValueError, match="positive int"):
        specjax.make_mesh(data=0)
    with pytest.raises(ValueError, match="mesh axes must be"):
        sharding.check_mesh(jax.make_mesh((1,), ("x",)))


@pytest.mark.slow
def test_one_device_mesh_keeps_tokens():
    """A 1x1 mesh in-process: the mesh path (constraints, placed inputs) on the single device."""
    from flax import nnx

    prompts = [[1, 2, 3], [4, 5]]
    ref = specjax.generate(specjax.Llama(TINY, rngs=nnx.Rngs(0)), prompts, max_new_tokens=6)
    model = specjax.shard_model(specjax.Llama(TINY, rngs=nnx.Rngs(0)), specjax.make_mesh())
    assert sharding.mesh_of(nnx.state(model)) is not None
    out = specjax.generate(model, prompts, max_new_tokens=6)
    chex.assert_trees_all_equal(out.tokens, ref.tokens)


@pytest.mark.slow
def test_mesh_2x4_same_tokens_as_one_device():
    """2x4 host mesh: greedy and sampled generate, greedy speculative with a draft model, the
    sharded safetensors load, the refusals; weights' shardings and no recompilation asserted."""
    out = run_mesh_checks(
        "--meshes", "2x4", "--checks", "generate,spec_lm", "--sampling", "greedy", "--load",
        "--errors",
    )  # fmt: skip
    assert out.count("ok ") == 4, out


@pytest.mark.slow
def test_every_mesh_every_engine_same_tokens():
    """1x1, 8x1, 2x4, 1x8: generate, a draft model, self-drafting and a feature drafter, greedy
    and sampled with the same keys, give one device's tokens (about 10 minutes on one core)."""
    out = run_mesh_checks(
        "--meshes", "1x1,8x1,2x4,1x8", "--checks", "generate,spec_lm,spec_self,spec_feature",
        timeout=1800,
    )  # fmt: skip
    assert out.count("ok ") == 4 * 4 * 2, out


@pytest.mark.slow
def test_pallas_kernel_in_shard_map_same_tokens():
    """The Pallas tree-attention kernel (interpret mode) inside shard_map over kv heads."""
    out = run_mesh_checks(
        "--meshes", "2x4,1x8", "--checks", "generate,spec_lm", "--sampling", "greedy",
        "--attn", "interpret",
    )  # fmt: skip
    assert out.count("ok ") == 4, out


@pytest.mark.slow
def test_data_parallel_training_and_sharded_checkpoints():
    """Drafter training on a 2x4 mesh matches one device; a target and a training state saved
    from 2x4 restore onto 4x2 and onto one device (about 2 minutes on one core)."""
    out = run_mesh_checks(
        "--meshes", "2x4", "--checks", "generate", "--sampling", "greedy", "--train"
    )  # fmt: skip
    assert "ok 2x4 train" in out, out


@pytest.mark.slow
def test_weight_stationary_2d_layout_same_tokens():
    """The layout the README plans for Llama-3-70B (rules embed -> 'data': weights split over
    both mesh axes) gives one device's tokens on a 2x4 mesh."""
    out = run_mesh_checks(
        "--meshes", "2x4", "--checks", "generate,spec_lm", "--rules", "embed=data"
    )  # fmt: skip
    assert out.count("ok ") == 4, out


@pytest.mark.slow
def test_other_rules_and_drafters_same_sampled_tokens():
    """Sampled decoding on 2x4 with the HSD and sampled-children tree rules (draft model), the
    EAGLE-style drafter, the early-exit verifier, a draft model split over 'model' (placed
    with shard_model: kept split, not replicated) and an EAGLE-style drafter with a
    pre-verifier (PACER: pruned trees, bucketed verification) gives one device's tokens for the
    same keys (about 3 minutes on one core)."""
    checks = "spec_hsd,spec_tree_sampled,spec_eagle,spec_early_exit,spec_lm_split,spec_paced"
    out = run_mesh_checks("--meshes", "2x4", "--checks", checks, "--sampling", "sampled")
    assert out.count("ok ") == 6, out


def test_mesh_flag_and_distributed_settings_are_checked():
    from specjax import distributed

    assert distributed.parse_mesh("2x4") == (2, 4)
    for bad in ("2x", "0x4", "2*4", ""):
        with pytest.raises(ValueError, match="DATAxMODEL"):
            distributed.parse_mesh(bad)
    with pytest.raises(ValueError, match="go together"):
        distributed.initialize("localhost:1234", None, None)
    with pytest.raises(ValueError, match="outside"):
        distributed.initialize("localhost:1234", 2, 5)


@pytest.mark.slow
def test_cli_on_a_mesh_with_the_distributed_runtime(shared_dir):
    """`specjax generate --mesh 2x4` through jax.distributed.initialize (one process, 8 host
    devices) prints the same greedy text as without a mesh."""
    import socket

    from conftest import require

    from specjax.paths import STORIES260K

    model = require(shared_dir / STORIES260K)
    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    texts = []
    for extra in ([], ["--mesh", "2x4", "--coordinator", f"localhost:{port}",
                       "--num-processes", "1", "--process-id", "0"]):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "specjax.cli", "generate", "--model", str(model),
             "--prompt", "Once upon a time", "--max-new-tokens", "24", *extra],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        texts.append(proc.stdout.strip().splitlines()[-1])  # the runtime may log lines first
    assert texts[0] == texts[1] and len(texts[0]) > 20, texts
