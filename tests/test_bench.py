"""The benchmark harness (specjax.bench): Spec-Bench reader, method specs, one tiny end-to-end
run that writes the table and plots, the command line, and the transformers peer (hf)."""

import dataclasses
import json
import math

import numpy as np
import pytest
from conftest import require
from flax import nnx

import specjax
from specjax import bench
from specjax.autotune import VerifyCosts
from specjax.config import TINY, AutoSpecConfig, TreeConfig
from specjax.paths import LLAMA2XS, STORIES260K


@pytest.fixture(scope="module")
def tiny_target():
    return bench.Target(name="tiny", model=specjax.Llama(TINY, rngs=nnx.Rngs(0)))


def tiny_prompts(n=2, max_new=8, seed=0):
    rng = np.random.default_rng(seed)
    prompts = tuple(
        bench.Prompt(str(i), "random", tuple(int(t) for t in rng.integers(1, TINY.vocab_size, 5)))
        for i in range(n)
    )
    return bench.PromptSet("random", prompts, max_new)


def test_read_spec_bench_any_file(tmp_path):
    """Ragged records as found in Spec-Bench / EAGLE / FastChat files: int or str ids, extra
    fields, several turns, a missing category, blank lines."""
    lines = [
        json.dumps({"question_id": 81, "category": "writing", "turns": ["a", "b"]}),
        "",
        json.dumps({"question_id": "q2", "category": "math", "turns": ["c"], "reference": ["x"]}),
        json.dumps({"turns": ["d"]}),
    ]
    path = tmp_path / "questions.jsonl"
    path.write_text("\n".join(lines) + "\n")
    qs = bench.read_spec_bench(path)
    assert [q.question_id for q in qs] == ["81", "q2", "4"]
    assert [q.category for q in qs] == ["writing", "math", ""]
    assert qs[0].turns == ("a", "b")


@pytest.mark.parametrize(
    "bad, message",
    [("{not json", "not a JSON object"), ('{"turns": []}', "non-empty list"), ("", "no questions")],
)
def test_read_spec_bench_errors_name_the_line(tmp_path, bad, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(bad + "\n")
    with pytest.raises(ValueError, match=message):
        bench.read_spec_bench(path)


@pytest.mark.parametrize("name", list(bench.SPEC_BENCH_FILES))
def test_shared_spec_bench_files_load(shared_dir, name):
    require(shared_dir / "data" / bench.SPEC_BENCH_FILES[name])
    qs = bench.read_spec_bench(bench.SPEC_BENCH_FILES[name])
    assert len(qs) >= 79 and all(q.turns and q.turns[0] for q in qs)


def test_select_questions_round_robin_over_categories():
    qs = [bench.Question(str(i), "ab"[i >= 3], ("t",)) for i in range(5)]  # a a a b b
    assert [q.question_id for q in bench.select_questions(qs, 4)] == ["0", "3", "1", "4"]
    assert len(bench.select_questions(qs, 10)) == 5


@pytest.mark.parametrize(
    "flags, expected",
    [("fpu avx avx2 avx512f avx512bw", "AMD EPYC (AVX-512)"), ("fpu avx avx2", "AMD EPYC (AVX2)"),
     ("fpu sse2", "AMD EPYC"), ("avx2 avx512f amx_tile amx_bf16", "AMD EPYC (AVX-512, AMX)")],
)  # fmt: skip
def test_cpu_model_names_the_widest_vector_instructions(tmp_path, flags, expected):
    from specjax.benchmark import cpu_model

    info = tmp_path / "cpuinfo"
    core = f"model name\t: AMD EPYC\nflags\t\t: {flags}\n\n"
    info.write_text(core + core)  # one block per core: read once
    assert cpu_model(str(info)) == expected


def test_cpu_model_numbers_a_name_without_a_model_number(tmp_path):
    from specjax.benchmark import cpu_model

    info = tmp_path / "cpuinfo"
    core = "cpu family\t: {f}\nmodel\t\t: {m}\nmodel name\t: {name}\nflags\t\t: avx2\n\n"
    info.write_text(core.format(f=25, m=17, name="AMD EPYC") * 2)
    assert cpu_model(str(info)) == "AMD EPYC family 25 model 17 (AVX2)"
    xeon = "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    info.write_text(core.format(f=6, m=143, name=xeon))
    assert cpu_model(str(info)) == f"{xeon} (AVX2)"


def test_hispec_rows_state_what_a_full_target_call_judges():
    """HiSpec's chain of k drafts k tokens a round; a full-target call judges up to buffer + k
    (the checkpoint's buffer, or a :bufferN switch)."""
    from specjax.bench.methods import SPEC, Method
    from specjax.paths import repo_dir

    heads = repo_dir() / "checkpoints" / "stories260K-hispec"
    if not heads.exists():
        pytest.skip(f"{heads} is not in this checkout")
    chain = TreeConfig.chain(3)
    assert Method(kind=SPEC, drafter=f"{heads}:buffer4", tree=chain).draft_nodes == (
        "3 a round, <=7 a full call"
    )
    assert Method(kind=SPEC, drafter="self:2", tree=chain).draft_nodes == "3"


def test_mean_ci_is_a_student_t_interval():
    """The prompt sets are small: the interval uses t, not the normal quantile (table values of
    t at 0.975 for 1, 2, 7 and 79 degrees of freedom)."""
    from specjax.benchmark import mean_ci, t_quantile

    for df, table in ((1, 12.706), (2, 4.303), (7, 2.365), (79, 1.990)):
        assert t_quantile(0.975, df) == pytest.approx(table, abs=2e-3)
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    mean, half = mean_ci(values)
    assert mean == 4.5 and half == pytest.approx(2.365 * np.std(values, ddof=1) / 8**0.5, rel=1e-3)
    assert math.isnan(mean_ci([3.0])[1])


def test_parse_method():
    m = bench.parse_method("self:8@6,2,3")
    assert (m.kind, m.drafter, m.tree, m.rule) == (
        "spec",
        "self:8",
        TreeConfig(branching=(3, 1)),
        "auto",
    )
    assert m.name == "self-draft 8L tree (3,1)" and m.draft_nodes == "6"
    hsd = bench.parse_method(f"{LLAMA2XS}@4,4,1@hsd")
    assert hsd.tree == TreeConfig.chain(4) and hsd.name == "llama2xs-279K chain 4, hsd"
    assert bench.parse_method("self:2").tree == TreeConfig.chain(4)
    auto = bench.parse_method("self:2@auto")
    assert auto.auto and auto.name == "self-draft 2L auto" and auto.draft_nodes == "auto"
    assert isinstance(auto.config, AutoSpecConfig) and auto.config.allow_autoregressive
    forced = bench.parse_method("self:2@auto-tree")
    assert forced.name == "self-draft 2L auto-tree" and not forced.config.allow_autoregressive
    assert auto.config.fallback and forced.config.fallback
    whole = bench.parse_method("self:2@auto-tree-nostop")
    assert whole.name == "self-draft 2L auto-tree-nostop" and not whole.config.fallback
    assert not whole.config.allow_autoregressive
    assert not bench.parse_method("self:2@auto-nostop").config.fallback
    assert auto.config.adapt is True
    fixed = bench.parse_method("self:2@auto-tree-nostop-noadapt")
    assert fixed.name == "self-draft 2L auto-tree-nostop-noadapt" and fixed.config.adapt is False
    assert not fixed.config.fallback and not fixed.config.allow_autoregressive
    for bad in ("self:2@auto-nostop-tree", "self:2@auto-fast", "self:2@auto-nostop-nostop"):
        with pytest.raises(ValueError, match="auto"):
            bench.parse_method(bad)
    assert bench.parse_method("hf-pld:5").lookup_tokens == 5
    assert bench.parse_method("hf-assisted:x/model.bin").kind == bench.HF_ASSISTED
    assert bench.parse_method("ar").kind == bench.AR
    with pytest.raises(ValueError, match="needs a chain"):
        bench.parse_method("self:2@6,2,3@hsd")
    hispec = bench.Method(kind=bench.SPEC, drafter="self:2", tree=TreeConfig.chain(4),
                          exit_heads="checkpoints/smollm2-hispec")  # fmt: skip
    assert hispec.name == "self-draft 2L chain 4 + exit verify (smollm2-hispec)"
    with pytest.raises(ValueError, match="exit_heads needs a SPEC method with an explicit tree"):
        bench.Method(kind=bench.SPEC, drafter="self:2", auto=True, exit_heads="x")


@pytest.mark.slow  # ~18 s: keeps the default run under 12 minutes on 2 cores
def test_bench_tiny_model_table_and_plots(tiny_target, tmp_path):
    methods = [bench.parse_method("self:1@2,2,1")]  # the AR baseline is added by bench()
    from specjax import decode, speculative

    decode._generate.clear_cache()  # so every method's first call compiles
    speculative._speculative.clear_cache()
    rows = bench.bench(
        tiny_target, [tiny_prompts()], methods, temperatures=(0.0, 1.0), reps=1, hf=False,
        log=lambda _: None,
    )  # fmt: skip
    assert [(r.temperature, r.kind) for r in rows] == [
        (0.0, "ar"),
        (0.0, "spec"),
        (1.0, "ar"),
        (1.0, "spec"),
    ]
    greedy_spec = rows[1]
    assert greedy_spec.greedy_equal == 1.0 and not greedy_spec.mismatches
    assert greedy_spec.n_tokens == 2 * 8 and len(greedy_spec.accepted_hist) == 3
    # Each of the 2 prompts emits 7 tokens after the prefill's first, n_accepted + 1 per step
    # (the last step may overshoot the budget by at most the path length - 1).
    emitted = sum((i + 1) * h for i, h in enumerate(greedy_spec.accepted_hist))
    assert 2 * 7 <= emitted <= 2 * (7 + 2), greedy_spec.accepted_hist
    assert greedy_spec.tau == pytest.approx(emitted / sum(greedy_spec.accepted_hist), rel=0.3)
    assert rows[0].speedup == 1.0 and math.isnan(rows[3].greedy_equal)
    # Every row timed its compile and its runs (their sizes are not tested: timing varies).
    assert all(r.compile_s > 0 and min(r.runs_s) > 0 and r.tokens_per_s > 0 for r in rows), rows
    # ... and each prompt in each repetition, adding up to the repetition's time.
    for r in rows:
        assert [len(t) for t in r.prompt_s] == [1, 1], r.prompt_s
        assert sum(t[0] for t in r.prompt_s) == pytest.approx(r.runs_s[0], rel=0.1)
        assert len(r.compile_in_runs_s) == 1, r.compile_in_runs_s
    # A row whose timed repetitions compiled is named in the report, the others are not.
    compiled = dataclasses.replace(rows[1], compile_in_runs_s=[3.0])
    assert bench.compiles_in_runs(rows[:1]) == []
    section = "\n".join(bench.compiles_in_runs([rows[0], compiled]))
    assert compiled.method in section and "3.0 s" in section and rows[0].method not in section

    out = tmp_path / "bench.md"
    bench.write_markdown(rows, bench.device_header(dtype="float32"), out)
    text = out.read_text()
    assert "| " + " | ".join(bench.COLUMNS) + " |" in text
    assert "backend:" in text and "None: every greedy output equals" in text
    assert text.count("| tiny | random |") == 4
    plots = bench.write_plots(rows, tmp_path / "bench")
    assert {p.name for p in plots} == {"bench_tau.png", "bench_speedup.png", "bench_accepted.png"}
    assert all(p.stat().st_size > 0 for p in plots)
    bench.write_json(rows, {"x": 1}, tmp_path / "bench.json")
    assert len(json.loads((tmp_path / "bench.json").read_text())["rows"]) == 4

    # SpecConfig.auto() rows get a predicted-vs-measured section, costs a t(N) table and plot.
    auto_row = dataclasses.replace(
        rows[1], chosen_tree="dynamic(3,2,4)", predicted_tau=2.0, predicted_speedup=1.5
    )
    costs = {"tiny": VerifyCosts(key="k", nodes=(1, 8), seconds=(0.001, 0.002))}
    bench.write_markdown([rows[0], auto_row], "header", out, costs=costs)
    text = out.read_text()
    assert "## Predicted vs measured" in text and "dynamic(3,2,4)" in text
    assert "| 1 | 1.00 (1.00x) |" in text and "| 8 | 2.00 (2.00x) |" in text
    plots = bench.write_plots([rows[0], auto_row], tmp_path / "auto", costs=costs)
    assert {"auto_predicted.png", "auto_tverify.png"} <= {p.name for p in plots}


def test_auto_rows_record_each_prompts_speculative_tau():
    """Each prompt of an auto row keeps its choice and its tau over speculative steps alone (a
    fallback's plain steps, one token each in bin 0 of the histogram, left out), and the report
    weighs the later half of the prompts by their speculative steps."""
    from specjax.bench.report import later_half_tau
    from specjax.bench.runner import _combined_choice

    def stats(hist, calls, plain, predicted, shift, speedup=1.2):
        return ({"tree": "dynamic(3,2,4)", "acceptance_shift": shift, "predicted_tau": predicted,
                 "predicted_speedup": speedup, "accepted_hist": np.array([hist]),
                 "target_calls": np.array([calls]), "plain_steps": np.array([plain])},
                sum(hist) * 2)  # (stats, generated tokens)  # fmt: skip

    # 2 plain steps + 4 speculative ones accepting 0, 1, 1, 2: 8 tokens in 4 calls.
    first = stats([3, 2, 1], calls=6, plain=2, predicted=3.0, shift=1.0)
    # No fallback: 2 steps accepting 2 each: 6 tokens in 2 calls.
    second = stats([0, 0, 2], calls=2, plain=0, predicted=2.5, shift=0.9)
    # Decoded plainly from the start: no speculative step.
    third = stats([5, 0, 0], calls=5, plain=5, predicted=2.0, shift=0.8)
    choice = _combined_choice([first, second, third])
    taus = [p["speculative_tau"] for p in choice["per_prompt"]]
    assert taus[:2] == [2.0, 3.0] and np.isnan(taus[2])
    assert [p["speculative_calls"] for p in choice["per_prompt"]] == [4, 2, 0]
    assert choice["shift"] == "1.00 -> 0.80"
    # The later half (prompts 2 and 3): only the second has speculative steps.
    assert later_half_tau(choice["per_prompt"]) == "2.50 / 3.00"
    assert later_half_tau(choice["per_prompt"][2:]) == "-"
    # Weighted by speculative steps: (2.5 * 2 + 3.0 * 4) / 6 predicted, (3 * 2 + 2 * 4) / 6
    # measured.
    one, two, _ = choice["per_prompt"]
    assert later_half_tau([one, two, two, one]) == "2.83 / 2.33"
    # The set's predicted speedup: the prompts' predictions weighted as throughput is, by their
    # tokens (12 at 2.0x and 4 at 1.0x: 16 / (6 + 4)), not their plain mean (1.5x).
    long, short = stats([6], 6, 0, 2.0, 1.0, 2.0), stats([2], 2, 0, 1.0, 1.0, 1.0)
    assert _combined_choice([long, short])["predicted_speedup"] == pytest.approx(1.6)


def test_auto_rows_time_each_prompt_against_autoregressive_decoding():
    """Each prompt's speedup is its own tokens/s over autoregressive decoding's on that prompt,
    paired per repetition (median); the report compares it with the prompt's prediction over
    the later half of the prompts that speculated to the end."""
    from specjax.bench.harness import _prompt_speedups
    from specjax.bench.prompts import PromptSet
    from specjax.bench.report import later_half_speedup
    from specjax.bench.runner import Decoded, Runner

    prompts = PromptSet(name="p", prompts=[], max_new_tokens=8)
    spec, ar = Runner(prompts), Runner(prompts)
    spec.prompt_s = [[1.0, 2.0, 1.0], [0.5, 0.5, 0.5]]
    ar.prompt_s = [[2.0, 2.0, 3.0], [1.0, 1.0, 1.0]]
    # Prompt 1 at T=1: 6 tokens against autoregressive decoding's 4.
    out = Decoded(tokens=[np.zeros(4), np.zeros(6)], tau=[1.0, 1.0])
    ar_out = Decoded(tokens=[np.zeros(4), np.zeros(4)], tau=[1.0, 1.0])
    # Ratios per repetition: prompt 0 [2, 1, 3] -> 2; prompt 1 [3, 3, 3] -> 3.
    assert _prompt_speedups(spec, ar, out, ar_out) == [2.0, 3.0]

    def prompt(predicted, measured, plain=0, calls=5):
        return {"predicted_speedup": predicted, "speedup": measured, "plain_calls": plain,
                "speculative_calls": calls}  # fmt: skip

    # The first half is left out, as are a fallback and a prompt that never speculated.
    rows = [*[prompt(9.0, 1.0)] * 4, prompt(1.1, 1.0), prompt(1.5, 1.0),
            prompt(1.0, 1.0, plain=3), prompt(1.0, 1.0, calls=0)]  # fmt: skip
    assert later_half_speedup(rows) == "1.30x / 1.00x (1/2 within 15%)"
    assert later_half_speedup(rows[:2] + rows[6:]) == "-"


def test_adapting_default_warms_every_prompt_and_replays_its_shift(tiny_target, monkeypatch):
    """The bench's adapting default: the warm-up decodes every prompt in order, each choosing
    with what the prompts before it measured, and the timed runs replay each prompt's shift
    (so no run adapts on prompts already seen, nor compiles a new tree while timed); a default
    that does not adapt warms every prompt as well."""
    from specjax.bench.runner import SpecjaxRunner

    seen = []

    def fake(model, drafter, prompts, *, config, **kwargs):
        seen.append(config.adapt)
        shift = 1.0 - 0.1 * (len(seen) - 1) if config.adapt is True else config.adapt
        return specjax.GenerateOutput(
            tokens=np.zeros((1, 8), np.int32), lengths=np.array([8]),
            stats={"acceptance_shift": shift},
        )  # fmt: skip

    monkeypatch.setattr(specjax, "speculative_generate", fake)
    from specjax import adaptation

    adaptation._CALLS["learned by another row"] = (None, None, [])
    prompts = tiny_prompts(n=3)
    adapting = SpecjaxRunner(tiny_target, bench.parse_method("self:1@auto"), "drafter", prompts,
                             specjax.SamplingConfig())  # fmt: skip
    assert adapting.warm_indices() == [0, 1, 2]
    adapting()  # warm-up
    adapting()  # a timed run
    assert seen == [True, True, True, 1.0, 0.9, 0.8]
    assert not adaptation._CALLS  # an adapting row starts from what it learns itself
    seen.clear()
    fixed = SpecjaxRunner(tiny_target, bench.parse_method("self:1@auto-noadapt"), "drafter",
                          prompts, specjax.SamplingConfig())  # fmt: skip
    # A default call that does not adapt still chooses per prompt (its cost context follows
    # the prompt's cache length): every prompt is warmed too. A fixed tree: one prompt a width.
    assert fixed.warm_indices() == [0, 1, 2]
    fixed()
    fixed()
    assert seen == [False] * 6
    tree = SpecjaxRunner(tiny_target, bench.parse_method("self:1"), "drafter", prompts,
                         specjax.SamplingConfig())  # fmt: skip
    assert tree.warm_indices() == [0]
    # HiSpec's default call times itself once per kind of call and does not adapt: nothing to
    # replay, and its three levels (auto-tree) report no acceptance shift.
    from specjax.hispec import HiSpec

    def levels_out(model, drafter, prompts, *, config, **kwargs):
        seen.append(config.adapt)
        return specjax.GenerateOutput(
            tokens=np.zeros((1, 8), np.int32), lengths=np.array([8]),
            stats={"intermediate_calls": np.array([3])},
        )  # fmt: skip

    monkeypatch.setattr(specjax, "speculative_generate", levels_out)
    seen.clear()
    levels = SpecjaxRunner(tiny_target, bench.parse_method("self:1@auto-tree"),
                           object.__new__(HiSpec), prompts, specjax.SamplingConfig())  # fmt: skip
    assert not levels.replays_shifts
    # Its row names the settings it ran (its outputs report no choice).
    object.__setattr__(levels.drafter, "draft_len", 3)  # (an nnx object never initialised)
    object.__setattr__(levels.drafter, "buffer", 4)
    assert levels.forced_settings == "hispec(draft_len=3,buffer=4)"
    assert fixed.forced_settings is None
    levels()
    levels()
    assert seen == [True] * 6


def test_explain_mismatch_points_at_the_first_difference(tiny_target):
    prompt = tiny_prompts(1).prompts[0]
    ref = np.array([3, 4, 5, 6])
    text = bench.explain_mismatch(tiny_target, prompt, ref, np.array([3, 4, 9, 6]))
    assert "first differs at generated token 2: AR 5, this method 9" in text
    assert "nats" in text


@pytest.mark.slow
def test_cli_bench_stories_quick(shared_dir, tmp_path, capsys):
    require(shared_dir / STORIES260K)
    from specjax.cli import main

    out = tmp_path / "bench.md"
    argv = ["bench", "--targets", "stories260K", "--quick", "--no-hf", "--temperatures", "0"]
    argv += ["--methods", "ar", f"{LLAMA2XS}@4,4,1", "--out", str(out)]
    assert main(argv) == 0
    text = (tmp_path / "bench_quick.md").read_text()
    assert "| stories260K | tinystories | 0 | llama2xs-279K chain 4 | 4 |" in text
    assert "100% (2/2)" in text and "transformers peer: not run" in text
    for name in ("tau", "speedup", "accepted"):
        assert (tmp_path / f"bench_quick_{name}.png").exists()
    capsys.readouterr()
    assert main(["bench", "--device-info", "--no-hf"]) == 0
    assert "- backend:" in capsys.readouterr().out


def test_cli_demo_stories_times_both_sides(shared_dir, capsys):
    """`specjax demo --pair stories` decodes both ways, reports medians of --rounds runs and
    that the outputs are identical (greedy)."""
    require(shared_dir / STORIES260K)
    require(shared_dir / LLAMA2XS)
    from specjax.cli import main

    argv = ["demo", "--pair", "stories", "--tree", "4,4,1", "--max-new-tokens", "12"]
    assert main([*argv, "--rounds", "2"]) == 0
    err = capsys.readouterr().err
    assert "median of 2 runs each: autoregressive" in err
    assert "identical to autoregressive output: True" in err
    with pytest.raises(SystemExit, match="--rounds must be at least 1, got 0"):
        main([*argv, "--rounds", "0"])
    # Flags that would do nothing are refused, before any model loads.
    with pytest.raises(SystemExit, match="--pair stories drafts with llama2xs-279K"):
        main([*argv, "--drafter", "mdc"])
    with pytest.raises(SystemExit, match="--tree needs --drafter"):
        main(["generate", "--model", "nowhere.bin", "--prompt", "x", "--tree", "4,4,1"])


def test_unknown_dataset_and_target_are_errors():
    with pytest.raises(ValueError, match="unknown dataset"):
        bench.Dataset.named("nope", 1, 1)
    from specjax.cli import main

    assert main(["bench", "--targets", "nope", "--device-info"]) == 2


@pytest.mark.hf
@pytest.mark.slow
def test_transformers_peer_tiny(tiny_target):
    """transformers generate and prompt lookup on the exported tiny model: greedy outputs equal
    specjax autoregressive decoding (or the mismatch is a near-tie), tau counted, ratios set."""
    pytest.importorskip("transformers")
    methods = [bench.Method(kind=bench.HF_GENERATE), bench.Method(kind=bench.HF_LOOKUP)]
    rows = bench.bench(
        tiny_target, [tiny_prompts()], methods, temperatures=(0.0, 1.0), reps=1,
        log=lambda _: None,
    )  # fmt: skip
    by = {(r.temperature, r.method): r for r in rows}
    gen, pld = by[(0.0, "HF generate")], by[(0.0, "HF prompt lookup (10)")]
    for r in (gen, pld):
        assert r.greedy_equal == 1.0 or all("near-tie" in m for m in r.mismatches), r.mismatches
        assert r.n_tokens == 16 and math.isnan(r.compile_s)
    assert gen.tau == pytest.approx(1.0) and gen.vs_hf_generate == pytest.approx(1.0)
    assert by[(1.0, "HF generate")].n_tokens == 16
    assert not math.isnan(by[(0.0, "specjax autoregressive")].vs_hf_spec)


@pytest.mark.slow
@pytest.mark.hf
def test_transformers_assisted_peer_stories(shared_dir):
    """Assisted generation with llama2xs-279K for stories260K, same weights as specjax."""
    pytest.importorskip("transformers")
    require(shared_dir / STORIES260K)
    suite = bench.load_suites()["stories260K"]
    target, _ = suite.load()
    prompts = dataclasses.replace(suite.datasets[0], n_prompts=2, max_new_tokens=8)
    methods = [bench.Method(kind=bench.HF_ASSISTED, drafter=LLAMA2XS)]
    rows = bench.bench(
        target, [prompts.load(target.tokenizer)], methods, temperatures=(0.0,), reps=1,
        log=lambda _: None,
    )  # fmt: skip
    assisted = rows[1]
    assert assisted.method == "HF assisted (llama2xs-279K)" and assisted.n_tokens == 16
    assert assisted.greedy_equal == 1.0 or all("near-tie" in m for m in assisted.mismatches)
    assert assisted.tau > 1.0


def test_time_interleaved_settles_every_method_after_all_first_calls():
    """A method with settle() gets it after every method's first call and before any timed run
    (a later warm-up may make an earlier method compile again); its time counts as compile.
    Each repetition starts one method later (a, b, c, then b, c, a)."""
    from specjax.benchmark import time_interleaved

    calls = []

    class Method:
        def __init__(self, name):
            self.name = name

        def __call__(self):
            calls.append(self.name)

        def settle(self):
            calls.append(self.name + ".settle")

    timings = time_interleaved({"a": Method("a"), "b": Method("b"), "c": lambda: None}, reps=2)
    assert calls == ["a", "b", "a.settle", "b.settle", "a", "b", "b", "a"], calls
    assert all(len(t.runs_s) == 2 for t in timings.values())


def test_held_in_calibration_leaves_hispec_to_its_own_probe(monkeypatch):
    """The bench calibrates an acceptance profile for every default-call drafter before timing,
    except HiSpec, whose default call times itself against plain decoding (hispec_choice) and
    has no profile (calibrating one failed on its missing tree attributes)."""
    import types

    from specjax import calibration
    from specjax.bench import harness
    from specjax.hispec import HiSpec

    hispec, feature_drafter = object.__new__(HiSpec), object()
    calibrated = []
    monkeypatch.setattr(calibration, "calibration_prompts", lambda *a: ())
    monkeypatch.setattr(
        calibration, "ensure_pair_profiles", lambda _model, d, *a, **k: calibrated.append(d)
    )
    methods = [
        bench.Method(kind=bench.SPEC, drafter="exits", auto=True),
        bench.Method(kind=bench.SPEC, drafter="features", auto=True),
    ]
    target = types.SimpleNamespace(model=None, tokenizer=None, eos_id=None)
    drafters = {"exits": hispec, "features": feature_drafter}
    harness._calibrate_held_in(target, methods, drafters, "chat", log=lambda _: None)
    assert calibrated == [feature_drafter]
