"""The experiment scripts' bookkeeping around long runs: the resumable chains
(experiments/card_chain.py) run again a stage whose input was redone; drafter_tau.py refuses a
baseline from another machine or with other prompts before anything is decoded; drafters.py
refuses a candidate drafter its rows could not name; pair_tau.py pairs two runs' common prompts.
No model is loaded."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from specjax.paths import repo_dir

EXPERIMENTS = repo_dir() / "experiments"


@pytest.fixture
def experiments(monkeypatch):
    """Imports experiments' scripts as when they run (they import their siblings)."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    import card_chain
    import drafter_tau

    return card_chain, drafter_tau


def test_drafters_names_only_real_candidates(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    import drafters

    from specjax.paths import SMOLLM2_MDC

    shipped = str(repo_dir() / SMOLLM2_MDC)
    assert drafters.check_candidates({SMOLLM2_MDC: shipped + "/"}) == {}  # the shipped one
    candidate = tmp_path / "run" / "smollm2-mdc"
    with pytest.raises(SystemExit, match="holds no trained drafter"):
        drafters.check_candidates({SMOLLM2_MDC: str(candidate)})
    candidate.mkdir(parents=True)
    (candidate / "drafter.json").write_text("{}")
    assert drafters.check_candidates({SMOLLM2_MDC: str(candidate)}) == {SMOLLM2_MDC: str(candidate)}
    renamed = tmp_path / "mdc-v2"
    candidate.rename(renamed)
    with pytest.raises(SystemExit, match="must be a folder named smollm2-mdc"):
        drafters.check_candidates({SMOLLM2_MDC: str(renamed)})


def test_pairing_reads_committed_taus_only_on_their_machine(experiments):
    card_chain, _ = experiments
    taus = f"{card_chain.EAGLE_TAUS}.json"
    recorded = json.loads((repo_dir() / taus).read_text())["machine"]
    assert card_chain.eagle_pairing(taus, recorded) == [
        "--baseline",
        taus,
        "--baseline-name",
        card_chain.EAGLE_NAME,
    ]
    elsewhere = card_chain.eagle_pairing(taus, recorded.replace("cores", "cores, other"))
    assert elsewhere == ["--drafter", card_chain.SHIPPED_EAGLE]
    stages = card_chain.card_stages(
        "smollm2-mdc", "runs/x", [], tau_prefix="runs/x_tau", machine="another machine"
    )
    taus_stages = [command for name, command, _ in stages if name.startswith("tau")]
    assert len(taus_stages) == 2
    for command in taus_stages:
        assert "--baseline" not in command
        assert command[command.index("--drafter") + 1] == "runs/x_self1500/smollm2-mdc"
        assert command.count("--drafter") == 2  # the candidate, then the shipped eagle


def test_run_stages_reruns_what_an_earlier_stage_invalidated(experiments, tmp_path, capsys):
    card_chain, _ = experiments
    outs = [tmp_path / f"{i}.txt" for i in range(3)]

    def stages():
        return [
            (f"s{i}", ["-c", f"open({str(out)!r}, 'w').write('x')"], out)
            for i, out in enumerate(outs)
        ]

    card_chain.run_stages(stages(), tag="t")
    an_hour_ago = time.time() - 3600  # well clear of the file system's clock granularity
    for i, out in enumerate(outs):
        os.utime(out, (an_hour_ago + i, an_hour_ago + i))
    first = [out.stat().st_mtime_ns for out in outs]
    capsys.readouterr()
    card_chain.run_stages(stages(), tag="t")  # everything done: nothing runs
    assert [out.stat().st_mtime_ns for out in outs] == first
    assert capsys.readouterr().out.count(": done (") == 3
    outs[0].unlink()  # the first stage redone: the two after it are stale
    card_chain.run_stages(stages(), tag="t", dry_run=True)
    printed = capsys.readouterr().out
    assert printed.count(": done (") == 0 and "s0: " in printed
    card_chain.run_stages(stages(), tag="t")
    assert all(a < b.stat().st_mtime_ns for a, b in zip(first[1:], outs[1:], strict=True))
    with pytest.raises(SystemExit, match="finished without writing"):
        card_chain.run_stages([("quiet", ["-c", "pass"], tmp_path / "never")], tag="t")


SETTINGS = {"max_new_tokens": 128, "tree": "t", "batch": 8, "pre_verifier": False}


def test_baseline_checks_refuse_unpairable_files(experiments, capsys):
    _, drafter_tau = experiments
    baseline = {"settings": SETTINGS, "machine": "here", "mt_bench|0|eagle": [2.0, 3.0]}

    def check(b, names=("eagle",), sets=("mt_bench",), machine="here", settings=SETTINGS):
        drafter_tau.check_baseline(b, "b.json", settings, names, sets, [0.0], machine)

    check(baseline)  # pairable
    with pytest.raises(SystemExit, match="was run with"):
        check(baseline, settings={**SETTINGS, "batch": 4})
    with pytest.raises(SystemExit, match=r"no taus for qa\|0\|eagle.*its drafters: eagle"):
        check(baseline, sets=("mt_bench", "qa"))
    with pytest.raises(SystemExit, match=r"no taus for mt_bench\|0\|mdc"):
        check(baseline, names=("mdc",))
    with pytest.raises(SystemExit, match="decoded on there; this is here"):
        check({**baseline, "machine": "there"})
    capsys.readouterr()
    check({k: v for k, v in baseline.items() if k != "machine"})
    assert "records no machine" in capsys.readouterr().err

    prompts = [[1, 2, 3], [4, 5]]
    digest = drafter_tau.prompt_digest(prompts)
    assert digest != drafter_tau.prompt_digest([[1, 2, 3], [4, 6]])
    assert digest != drafter_tau.prompt_digest(prompts[::-1])
    drafter_tau.check_prompts({"prompts|mt_bench": digest}, "b.json", {"mt_bench": digest})
    drafter_tau.check_prompts({}, "b.json", {"mt_bench": digest})  # older files: not recorded
    with pytest.raises(SystemExit, match="other mt_bench prompts"):
        drafter_tau.check_prompts({"prompts|mt_bench": "0" * 16}, "b.json", {"mt_bench": digest})


def test_baseline_name_without_baseline_is_refused(experiments):
    _, drafter_tau = experiments
    with pytest.raises(SystemExit, match="--baseline-name names a drafter"):
        drafter_tau.main(["--baseline-name", "smollm2-eagle", "--sets", "mt_bench"])


def test_pair_tau_pairs_the_common_prompts(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    import pair_tau

    a, a_tasks, b = tmp_path / "a.json", tmp_path / "a_tasks.json", tmp_path / "b.json"
    a.write_text(json.dumps({"qa|0|new": [3.0, 2.0, 4.0], "machine": "m1"}))
    a_tasks.write_text(json.dumps({"sum|0|new": [1.0, 1.0], "machine": "m1"}))
    b.write_text(json.dumps({"qa|0|old": [2.0, 2.0], "sum|0|old": [1.5, 1.5]}))
    sources = [pair_tau.parse_source(f"{a}:new"), pair_tau.parse_source(f"{a_tasks}:new")]
    a_taus = pair_tau.load_taus(sources, ["qa", "sum"], 0.0)
    b_taus = pair_tau.load_taus([pair_tau.parse_source(f"{b}:old")], ["qa", "sum"], 0.0)
    # qa: the longer run's third prompt has no partner; the first two differ by +1 and 0.
    # sum: -0.5 twice. All four pooled by prompt: (1 + 0 - 0.5 - 0.5) / 4 = 0.
    rows = pair_tau.pair_lines("new", "old", a_taus, b_taus, skip_resembled=False)[2:]
    assert rows[0].startswith("| qa | 2 | 2.500 | 2.000 | +0.500 ± ")
    assert rows[1].startswith("| sum | 2 | 1.000 | 1.500 | -0.500 ± ")
    assert rows[2].startswith("| all sets | 4 | 1.750 | 1.750 | +0.000 ± ")
    with pytest.raises(SystemExit, match=re.escape("no taus for qa|0|old")):
        pair_tau.load_taus([(a, "old")], ["qa"], 0.0)
    with pytest.raises(SystemExit, match="FILE.json:DRAFTER"):
        pair_tau.parse_source(str(a))
    pair_tau.check_same_run_conditions([a, a_tasks, b])  # b records no machine
    b.write_text(json.dumps({"qa|0|old": [2.0, 2.0], "machine": "m2"}))
    with pytest.raises(SystemExit, match="different machine"):
        pair_tau.check_same_run_conditions([a, b])


def test_eagle_longer_rerun_under_another_name_keeps_the_first_runs_files(experiments):
    import eagle_longer

    first = eagle_longer.stages()
    rerun = eagle_longer.stages(name="eagle19200r")
    assert [name for name, _, _ in first] == [name for name, _, _ in rerun]
    assert first[-2][2] == repo_dir() / "experiments/results/drafter_tau_eagle19200.json"
    assert rerun[-2][2] == repo_dir() / "experiments/results/drafter_tau_eagle19200r.json"
    assert not {done for _, _, done in first} & {done for _, _, done in rerun}
    scratch = rerun[0][1]
    assert scratch[scratch.index("--out") + 1] == "runs/eagle19200r_scratch"
    assert scratch[scratch.index("--steps") + 1] == "19200"
