"""Bad input gets a ValueError that names the problem (and the path), before anything compiles:
drafter directories (target fingerprint, header, orbax checkpoint, draft vocabulary) and the
decoding arguments (eos_id, token ids, sampling); NaN logits are reported in the stats.

Random TINY models only: every test but the NaN one fails before compiling a decoding loop.
"""

import dataclasses
import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import specjax
from specjax.config import TINY, SamplingConfig, SpecConfig, TreeConfig
from specjax.drafters import load_drafter
from specjax.models.drafter import DrafterConfig, DrafterNet
from specjax.models.target import model_from_weights
from specjax.train.checkpoint import save_drafter, target_fingerprint


@pytest.fixture(scope="module")
def tiny_target():
    return specjax.Llama(TINY, rngs=nnx.Rngs(0))


def random_net(target, kind="mdc", vocab=None):
    cfg = DrafterConfig(kind=kind, target=target.config, draft_vocab_size=target.config.vocab_size)
    vocab = np.arange(cfg.draft_vocab_size) if vocab is None else vocab
    return DrafterNet(cfg, vocab, rngs=nnx.Rngs(3), target=target)


@pytest.fixture()
def saved(tmp_path, tiny_target):
    """A random mdc drafter saved with tiny_target's fingerprint."""
    path = tmp_path / "d"
    net = random_net(tiny_target)
    save_drafter(net, path, target_name="tiny", dtype="float32", target=tiny_target)
    return path


def header(path) -> dict:
    return json.loads((path / "drafter.json").read_text())


# -- drafter directories ---------------------------------------------------------------------------


def test_fingerprint_is_deterministic_and_follows_the_weights(tiny_target):
    fp = target_fingerprint(tiny_target)
    assert fp.startswith("v1:") and fp == target_fingerprint(tiny_target)
    same = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    assert target_fingerprint(same) == fp
    as_bf16 = dataclasses.replace(TINY, dtype="bfloat16")  # the same weights, loaded as bf16
    weights = {"embed": same.embed[...], "final_norm": same.final_norm[...]}
    assert (
        target_fingerprint(model_from_weights(as_bf16, {**weights, **same.layers.arrays()})) == fp
    )
    same.final_norm.set_value(same.final_norm[...] * 1.5)
    assert target_fingerprint(same) != fp


def test_drafter_for_another_target_of_the_same_shapes_is_refused(saved, tiny_target):
    assert header(saved)["target_fingerprint"] == target_fingerprint(tiny_target)
    load_drafter(saved, tiny_target)  # its own target: no error
    other = specjax.Llama(TINY, rngs=nnx.Rngs(1))  # same shapes, other weights
    match = r"d: this mdc drafter was trained for another target \(tiny, .*strict=False"
    with pytest.raises(ValueError, match=match):
        load_drafter(saved, other)
    with pytest.warns(UserWarning, match="trained for another target"):
        drafter = load_drafter(saved, other, strict=False)
    assert isinstance(drafter, specjax.HiddenStateDrafter)


def test_header_without_fingerprint_loads_with_a_warning(saved, tiny_target):
    old = header(saved)
    del old["target_fingerprint"]
    (saved / "drafter.json").write_text(json.dumps(old, indent=2))
    other = specjax.Llama(TINY, rngs=nnx.Rngs(1))
    with pytest.warns(UserWarning, match="no target fingerprint"):
        load_drafter(saved, other)


def test_invalid_json_header(saved, tiny_target):
    (saved / "drafter.json").write_text('{"format": "specjax-drafter", "version": 1,')
    with pytest.raises(ValueError, match=r"d/drafter.json: not valid JSON \(Expecting"):
        load_drafter(saved, tiny_target)


def test_header_missing_keys(saved, tiny_target):
    bad = {k: v for k, v in header(saved).items() if k not in ("kind", "target")}
    (saved / "drafter.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"drafter.json: .*missing the keys \['kind', 'target'\]"):
        load_drafter(saved, tiny_target)


def test_invalid_header_value(saved, tiny_target):
    bad = header(saved)
    bad["kind"] = "medusa"
    (saved / "drafter.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="drafter.json: invalid drafter header: unknown drafter"):
        load_drafter(saved, tiny_target)


def test_missing_params_directory(saved, tiny_target):
    shutil.rmtree(saved / "params")
    with pytest.raises(ValueError, match=r"d: the drafter checkpoint is incomplete \(no params/"):
        load_drafter(saved, tiny_target)


def test_truncated_checkpoint_file(saved, tiny_target):
    data = max(
        (p for p in (saved / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(
        ValueError, match="params: the drafter checkpoint is incomplete or corrupted"
    ) as e:
        load_drafter(saved, tiny_target)
    assert e.value.__cause__ is not None  # the orbax error is chained


def test_draft_vocab_outside_the_target_vocabulary(tmp_path, tiny_target):
    vocab = np.arange(TINY.vocab_size)
    vocab[3] = TINY.vocab_size + 4
    save_drafter(random_net(tiny_target, "eagle", vocab), tmp_path / "d", target=tiny_target)
    match = r"d: 1 draft-vocabulary ids are outside the target's vocabulary \[0, 16\) \(e.g. 20\)"
    with pytest.raises(ValueError, match=match):
        load_drafter(tmp_path / "d", tiny_target)


def test_saving_new_weights_removes_what_was_measured_on_the_old(tmp_path, tiny_target):
    """Training into a drafter's folder again must not leave its old acceptance profile or
    pre-verifier beside the new weights: load_drafter would attach them."""
    vocab = np.arange(TINY.vocab_size)
    folder = tmp_path / "d"
    save_drafter(random_net(tiny_target, "eagle", vocab), folder, target=tiny_target)
    (folder / "acceptance.json").write_text("[]")
    (folder / "pre_verifier").mkdir()
    (folder / "pre_verifier" / "pre_verifier.json").write_text("{}")
    save_drafter(random_net(tiny_target, "eagle", vocab), folder, target=tiny_target)
    assert sorted(p.name for p in folder.iterdir()) == ["drafter.json", "params"]


def test_tree_flag_leaves_room_for_the_levels_below():
    from specjax.drafters.spec import parse_tree

    # 8 nodes, depth 3, top-2: (2, 2, 1) needs 10; the widest that fits is (2, 1, 1).
    assert parse_tree("8,3,2").branching == (2, 1, 1)
    assert parse_tree("14,3,2").branching == (2, 2, 2)
    assert parse_tree("4,4,1").branching == (1, 1, 1, 1)
    with pytest.raises(ValueError, match="a chain of depth 5 alone needs 5 nodes"):
        parse_tree("4,5,2")


def test_drafter_switches_a_drafter_lacks_are_refused():
    """DIR:SWITCH naming a setting the drafter does not have is refused before loading, not
    ignored (an eagle has no reuse) or failed deep in the loader (HiSpec has no reuse)."""
    from specjax.drafters.spec import make_drafter
    from specjax.paths import repo_dir

    for name, switch, named in (
        ("stories260K-eagle", "noreuse", "an eagle drafter has no switch noreuse"),
        ("stories260K-ngram", "stale", "an n-gram drafter has no switch stale"),
        ("stories260K-hispec", "fresh2", "HiSpec exit heads has no switch freshN"),
        ("stories260K-mdc", "buffer4", "an mdc drafter has no switch bufferN"),
    ):
        path = repo_dir() / "checkpoints" / name
        if not path.exists():
            pytest.skip(f"{path} is not in this checkout")
        with pytest.raises(ValueError, match=named):
            make_drafter(f"{path}:{switch}", None)


# -- decoding arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize("eos_id", [TINY.vocab_size, -1])
def test_eos_outside_the_vocabulary(tiny_target, eos_id):
    match = rf"eos_id {eos_id} is outside the vocabulary \[0, 16\)"
    with pytest.raises(ValueError, match=match):
        specjax.generate(tiny_target, [[1, 2]], max_new_tokens=4, eos_id=eos_id)
    with pytest.raises(ValueError, match=match):
        specjax.speculative_generate(
            tiny_target, specjax.LMDrafter.self_draft(1), [[1, 2]], max_new_tokens=4, eos_id=eos_id
        )


def test_non_integer_token_ids(tiny_target):
    self_draft = specjax.LMDrafter.self_draft(1)
    match = r"prompt row 0 holds non-integer token ids \(float64, e.g. .*1.5"
    with pytest.raises(ValueError, match=match):
        specjax.generate(tiny_target, [[1.5, 2.0]], max_new_tokens=4)
    with pytest.raises(ValueError, match=match):
        specjax.speculative_generate(tiny_target, self_draft, [[1.5, 2.0]], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"prompt array must be int \[B, T\], got float32"):
        specjax.generate(tiny_target, np.array([[1.5, 2.0]], np.float32), max_new_tokens=4)


@pytest.mark.parametrize("kwargs", [{"top_k": 5}, {"top_p": 0.9}])
def test_greedy_with_top_k_or_top_p(kwargs):
    with pytest.raises(ValueError, match="have no effect at temperature 0"):
        SamplingConfig(temperature=0.0, **kwargs)


def test_nan_logits_are_reported(tiny_target):
    nan_target = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    nan_target.final_norm.set_value(nan_target.final_norm[...].at[0].set(jnp.nan))
    out = specjax.speculative_generate(
        nan_target,
        specjax.LMDrafter.self_draft(1),
        [[1, 2, 3]],
        max_new_tokens=3,
        config=SpecConfig(tree=TreeConfig.chain(1)),
    )
    assert int(out.stats["nonfinite_logits"][0]) > 0


def test_train_drafter_refuses_bad_fusion_layers_before_distilling(shared_dir, tmp_path, capsys):
    from conftest import require

    from specjax.cli import main
    from specjax.paths import STORIES260K

    target = require(shared_dir / STORIES260K)
    argv = ["train-drafter", "--target", str(target), "--out", str(tmp_path / "d")]
    assert main([*argv, "--fusion-layers", "3,9"]) == 2
    assert "fusion_layers must be increasing layer indices in [1, 5)" in capsys.readouterr().err
    assert not (tmp_path / "stories260K-distill").exists()  # nothing was distilled


def test_train_drafters_refuses_evaluation_and_repeated_answer_sets(capsys, monkeypatch):
    """experiments/train_drafters.py refuses, before distilling anything, an answer set written
    from evaluation prompts (through --extra or the recipe's extra_sets) and a set named twice."""
    import importlib.util

    from specjax.paths import repo_dir

    path = repo_dir() / "experiments" / "train_drafters.py"
    monkeypatch.syspath_prepend(str(path.parent))  # as when run: it imports its siblings
    spec = importlib.util.spec_from_file_location("train_drafters_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    only = ["--only", "smollm2-mdc"]
    for argv, named in (
        (["--extra", "smollm2-chat"], "evaluation data"),
        (["--recipe", "extra_sets=(('smollm2-chat', 4),)"], "evaluation data"),
        (["--extra", "smollm2-broad"], "named twice"),  # the recipe's extra_sets hold it
    ):
        with pytest.raises(SystemExit) as stopped:
            script.main([*only, *argv])
        assert stopped.value.code == 2 and named in capsys.readouterr().err


def test_train_drafters_refuses_bad_steps_and_continuations(capsys, monkeypatch, tmp_path):
    """experiments/train_drafters.py refuses, before distilling anything, a step count below 1,
    a continuation of a folder holding no drafter and one --init-from for several drafters."""
    import importlib.util

    from specjax.paths import SMOLLM2_MDC, repo_dir

    path = repo_dir() / "experiments" / "train_drafters.py"
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location("train_drafters_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shipped = str(repo_dir() / SMOLLM2_MDC)
    for argv, named in (
        (["--only", "smollm2-mdc", "--steps", "0"], "train at least 1 step"),
        (["--only", "smollm2-mdc", "--init-from", str(tmp_path)], "no trained drafter there"),
        (["--init-from", shipped], "continues one drafter"),
        (["--only", "smollm2-mdc", "--only", "smollm2-eagle", "--init-from", shipped],
         "continues one drafter"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            script.main(argv)
        assert stopped.value.code == 2 and named in capsys.readouterr().err
