"""Writing the results: the table's columns and rows as markdown (with every greedy mismatch
explained), the tau / speedup / accepted-length plots, the json of every row, and the settings
named in each results header (`header_settings`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specjax.bench.harness import Row
from specjax.bench.hf_peer import hf_available, peer_description
from specjax.bench.methods import AR, HF_ASSISTED, HF_LOOKUP, SPEC

if TYPE_CHECKING:
    from specjax.bench.suites import Suite

COLUMNS = (
    "target",
    "dataset",
    "T",
    "method",
    "draft nodes",
    "tau (95% CI)",
    "tokens/s",
    "speedup vs AR (min-max)",
    "predicted (tau, speedup)",
    "vs HF generate",
    "vs HF spec",
    "compile s",
    "greedy = AR",
)


def _fmt(x: float, spec: str, suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:{spec}}{suffix}"


def format_row(r: Row) -> str:
    tau = "1.00" if r.kind == AR else f"{r.tau:.2f} ± {_fmt(r.tau_ci, '.2f')}"
    lo, hi = r.speedup_range
    equal = ""
    if not math.isnan(r.greedy_equal):
        n_equal = round(r.greedy_equal * r.n_prompts)
        equal = f"{r.greedy_equal:.0%} ({n_equal}/{r.n_prompts})"
    cells = (
        r.target,
        r.dataset,
        f"{r.temperature:g}",
        r.method,
        r.draft_nodes,
        tau,
        f"{r.tokens_per_s:.1f}",
        f"{r.speedup:.2f}x ({lo:.2f}-{hi:.2f})",
        "-"
        if math.isnan(r.predicted_speedup)
        else f"{r.predicted_tau:.2f}, {r.predicted_speedup:.2f}x",
        _fmt(r.vs_hf_generate, ".2f", "x"),
        _fmt(r.vs_hf_spec, ".2f", "x"),
        _fmt(r.compile_s, ".1f"),
        equal,
    )
    return "| " + " | ".join(cells) + " |"


BENCH_TITLE = (
    "Spec-Bench-style benchmark: specjax methods, autoregressive decoding and transformers"
)


def write_markdown(
    rows: Sequence[Row],
    header: str,
    path: str | Path,
    notes: Sequence[str] = (),
    title: str = BENCH_TITLE,
    costs: dict | None = None,
):
    """The results table with its header, definitions and the explanation of every mismatch;
    costs (target name -> specjax.autotune.VerifyCosts): a table of the measured t(N)."""
    lines = [
        f"# {title}",
        "",
        header,
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *(format_row(r) for r in rows),
        "",
        "tau: tokens emitted per target call, mean over prompts: specjax (generated - 1) / "
        "verification calls, transformers generated tokens / forward calls (its first call "
        "verifies as it prefills); the acceptance length the default call predicts (accepted + 1 "
        "a step) also counts a row's last path whole where max_new_tokens or EOS cut it, a "
        "little more than these. tokens/s: generated tokens (EOS included) / "
        "median wall time of the prompt set. speedup vs AR: throughput over specjax "
        "autoregressive decoding, paired per interleaved repetition in this process, median "
        "(min-max). predicted: the tau and speedup SpecConfig.auto() predicted for the tree "
        "it chose (draft nodes: that tree, dynamic(budget,depth,top-k) or branching(...); "
        "trees joined by / where calls of different contexts chose differently; the set's "
        "tau is the prompts' mean prediction, its speedup their token-weighted harmonic mean, "
        "the throughput ratio the predictions imply); "
        "draft nodes N -> m: a pre-verifier chose per step, budget N, mean draft nodes "
        "verified m. "
        "vs HF generate / vs HF spec: the same paired throughput ratio against "
        "transformers `generate` and against its speculative peer (assisted generation or "
        "prompt lookup, the suite's first listed: the settings name it where there are two) "
        "on the same weights. compile s: compile time of a specjax method "
        "(warm-up minus run time), excluded from the repetitions. greedy = AR: prompts whose "
        "T=0 output equals specjax autoregressive decoding token for token. On CPU, quote the "
        "ratios, not absolute speed.",
        "",
    ]
    if costs:
        lines += cost_table(costs)
    lines += compiles_in_runs(rows)
    predicted = [r for r in rows if not math.isnan(r.predicted_speedup)]
    if predicted:
        lines += [
            "## Predicted vs measured (SpecConfig.auto() rows)",
            "",
            "| target | dataset | T | method | chosen tree | tau predicted / measured | "
            "speedup predicted / measured | speedup error | fell back to plain steps | "
            "acceptance shift | tau per speculative step, later half: predicted / measured | "
            "speedup per prompt, later half, no fallback: predicted / measured (within 15%) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in predicted:
            err = r.predicted_speedup / r.speedup - 1
            lines.append(
                f"| {r.target} | {r.dataset} | {r.temperature:g} | {r.method} | {r.chosen_tree} "
                f"| {r.predicted_tau:.2f} / {r.tau:.2f} | {r.predicted_speedup:.2f}x / "
                f"{r.speedup:.2f}x | {err:+.0%} | {r.fallback or '-'} | {r.shift or '-'} "
                f"| {later_half_tau(r.per_prompt)} | {later_half_speedup(r.per_prompt)} |"
            )
        lines += [
            "",
            "fell back: the default call stops speculating when, after 8 steps, its tokens per "
            "call are below the chosen tree's break-even (step cost over a plain decoding "
            "step's) by more than one standard error, and decodes the rest plainly in the same "
            "loop; measured tau counts those plain steps (1 token each). acceptance shift: the "
            "factor by which the choice scaled the drafter's per-depth acceptance, fitted to the "
            "calls before (specjax.adaptation): prompts are decoded in order once, each choosing "
            "from the prompts before it, and the timed repetitions replay each prompt's choice. "
            "tau per speculative step, later half: over the second half of the prompts (those "
            "that chose with a shift fitted to at least half of the prompts), the tau predicted "
            "for each prompt's tree and the tokens per call of its speculative steps (plain "
            "steps after a fallback left out), both weighted by the prompts' speculative steps. "
            "speedup per prompt: over the same prompts, those that speculated to the end, the "
            "speedup predicted for each prompt's tree and the prompt's own measured speedup "
            "(its tokens per second over autoregressive decoding's on that prompt, paired per "
            "repetition), both averaged over those prompts, and how many of them were predicted "
            "within 15% of their measured speedup.",
            "",
        ]
    leveled = [r for r in rows if not math.isnan(r.intermediate_tau)]
    if leveled:
        lines += [
            "## Tokens per call at each level (early-exit rows)",
            "",
            "intermediate: tokens per call of the verify exit (HiSpec: per round of draft and "
            "intermediate verification; exit verify: the exit's accepted path + 1 per step); "
            "full: tokens per call of the layers above it (the table's tau).",
            "",
            "| target | dataset | T | method | intermediate tau | full tau |",
            "|---|---|---|---|---|---|",
        ]
        for r in leveled:
            lines.append(
                f"| {r.target} | {r.dataset} | {r.temperature:g} | {r.method} | "
                f"{r.intermediate_tau:.2f} | {r.tau:.2f} |"
            )
        lines.append("")
    mismatches = [(r, m) for r in rows for m in r.mismatches]
    lines.append("## Greedy mismatches")
    lines.append("")
    if mismatches:
        lines += [f"- {r.target} / {r.dataset} / {r.method}: {m}" for r, m in mismatches]
    else:
        lines.append("None: every greedy output equals specjax autoregressive decoding.")
    if notes:
        lines += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    Path(path).write_text("\n".join(lines) + "\n")


# Compile seconds inside a timed repetition worth a line in the report.
COMPILE_NOTE_S = 0.5


def compiles_in_runs(rows: Sequence[Row]) -> list[str]:
    """A section naming the rows whose timed repetitions compiled (their times include it)."""
    hit = [r for r in rows if max(r.compile_in_runs_s, default=0.0) > COMPILE_NOTE_S]
    if not hit:
        return []
    lines = [
        "## Compiles inside timed repetitions",
        "",
        "These rows compiled a program after their warm-up (seconds per repetition); their "
        "times and speedups include it.",
        "",
    ]
    for r in hit:
        spent = ", ".join(f"{s:.1f}" for s in r.compile_in_runs_s)
        lines.append(f"- {r.dataset} T={r.temperature:g} {r.method}: {spent} s")
    return lines + [""]


def later_half(per_prompt: Sequence[dict]) -> Sequence[dict]:
    """The second half of an auto row's prompts: those that chose with an acceptance shift
    fitted to at least half of the prompts (specjax.adaptation)."""
    return per_prompt[len(per_prompt) // 2 :]


def later_half_tau(per_prompt: Sequence[dict]) -> str:
    """'predicted / measured' tau per speculative step over the second half of an auto row's
    prompts (runner.prompt_choice records), weighted by each prompt's speculative steps; '-'
    where those prompts took no speculative step (or none were recorded)."""
    later = [p for p in later_half(per_prompt) if p["speculative_calls"] > 0]
    calls = sum(p["speculative_calls"] for p in later)
    if not calls:
        return "-"
    predicted = sum(p["predicted_tau"] * p["speculative_calls"] for p in later) / calls
    measured = sum(p["speculative_tau"] * p["speculative_calls"] for p in later) / calls
    return f"{predicted:.2f} / {measured:.2f}"


def later_half_speedup(per_prompt: Sequence[dict]) -> str:
    """'predicted / measured (k/n within 15%)' speedup over the second half of an auto row's
    prompts that speculated to the end (no fallback): the mean of each prompt's predicted and of
    its own measured speedup (harness._prompt_speedups), and how many prompts' predictions lie
    within 15% of their measurement; '-' where no such prompt was recorded."""
    later = [
        p
        for p in later_half(per_prompt)
        if "speedup" in p and p["speculative_calls"] > 0 and p["plain_calls"] == 0
    ]
    if not later:
        return "-"
    predicted = [p["predicted_speedup"] for p in later]
    measured = [p["speedup"] for p in later]
    within = sum(abs(a / b - 1) <= 0.15 for a, b in zip(predicted, measured, strict=True))
    return (
        f"{np.mean(predicted):.2f}x / {np.mean(measured):.2f}x ({within}/{len(later)} within 15%)"
    )


def cost_table(costs: dict) -> list[str]:
    """Markdown lines: t(N) in ms and relative to t(1), a row per N, a column per target."""
    nodes = sorted({n for c in costs.values() for n in c.nodes})
    lines = [
        "## Target cost per verification, t(N) (specjax.autotune, batch 1)",
        "",
        "What SpecConfig.auto() chose from: one target forward over N tree nodes at "
        "the context it measures at, ms (and / t(1)), at the node counts it times; see the "
        "_tverify plot.",
        "",
        "| N | " + " | ".join(costs) + " |",
        "|---|" + "---|" * len(costs),
    ]
    for n in nodes:
        cells = [
            f"{c.t_verify(n) * 1e3:.2f} ({c.relative(n):.2f}x)" if n in c.nodes else "-"
            for c in costs.values()
        ]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _groups(rows: Sequence[Row]) -> dict[tuple, list[Row]]:
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.target, r.dataset, r.temperature), []).append(r)
    return groups


def write_plots(rows: Sequence[Row], stem: str | Path, costs: dict | None = None) -> list[Path]:
    """Three figures next to the table: {stem}_tau.png (tau per method), {stem}_speedup.png
    (speedup over specjax AR, min-max bars) and {stem}_accepted.png (fraction of target calls
    that accepted n draft tokens, per speculative specjax method); with SpecConfig.auto() rows
    {stem}_predicted.png (predicted vs measured speedup); with costs {stem}_tverify.png (each
    target's t(N) / t(1)). Returns the paths written (none when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    stem = Path(stem)
    groups = _groups(rows)
    titles = [f"{t} / {d} / T={temp:g}" for t, d, temp in groups]
    paths = []

    def bar_figure(name: str, value, err, ylabel: str, hline: float | None):
        fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.2), squeeze=False)
        for ax, title, group in zip(axes[0], titles, groups.values(), strict=True):
            x = np.arange(len(group))
            ax.bar(x, [value(r) for r in group], yerr=np.array([err(r) for r in group]).T)
            if hline is not None:
                ax.axhline(hline, color="k", lw=0.8)
            ax.set_xticks(x, [r.method for r in group], rotation=70, ha="right", fontsize=7)
            ax.set_title(title, fontsize=8)
        axes[0][0].set_ylabel(ylabel)
        fig.tight_layout()
        path = stem.with_name(f"{stem.name}_{name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    bar_figure(
        "tau",
        lambda r: r.tau,
        lambda r: (r.tau_ci, r.tau_ci),
        "tau (tokens per target call)",
        1.0,
    )
    bar_figure(
        "speedup",
        lambda r: r.speedup,
        lambda r: (r.speedup - r.speedup_range[0], r.speedup_range[1] - r.speedup),
        "throughput / specjax autoregressive",
        1.0,
    )
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.6), squeeze=False)
    for ax, title, group in zip(axes[0], titles, groups.values(), strict=True):
        spec_rows = [r for r in group if r.accepted_hist]
        width = 0.8 / max(len(spec_rows), 1)
        for i, r in enumerate(spec_rows):
            h = np.asarray(r.accepted_hist, np.float64)
            offset = (i - (len(spec_rows) - 1) / 2) * width  # bars centred on their count
            ax.bar(np.arange(h.size) + offset, h / max(h.sum(), 1), width, label=r.method)
        ax.set_xlabel("draft tokens accepted per target call")
        ax.set_title(title, fontsize=8)
        if spec_rows:
            ax.legend(fontsize=6)
    axes[0][0].set_ylabel("fraction of target calls")
    fig.tight_layout()
    path = stem.with_name(f"{stem.name}_accepted.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    predicted = [r for r in rows if not math.isnan(r.predicted_speedup)]
    if predicted:
        fig, ax = plt.subplots(figsize=(4.6, 4.2))
        for r in predicted:
            lo, hi = r.speedup_range
            ax.errorbar(r.predicted_speedup, r.speedup, yerr=[[r.speedup - lo], [hi - r.speedup]],
                        fmt="o", label=f"{r.target} T={r.temperature:g} {r.method}")  # fmt: skip
        top = max(max(r.predicted_speedup, r.speedup_range[1]) for r in predicted) * 1.1
        ax.plot([0, top], [0, top], "k--", lw=0.8)
        ax.set_xlabel("predicted speedup (SpecConfig.auto())")
        ax.set_ylabel("measured speedup vs specjax AR")
        ax.legend(fontsize=5)
        fig.tight_layout()
        paths.append(stem.with_name(f"{stem.name}_predicted.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    if costs:
        fig, ax = plt.subplots(figsize=(4.6, 3.8))
        for name, c in costs.items():
            ax.plot(c.nodes, [c.relative(n) for n in c.nodes], "o-", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tree nodes N verified in one target call")
        ax.set_ylabel("t(N) / t(1)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(stem.with_name(f"{stem.name}_tverify.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def write_json(rows: Sequence[Row], settings: dict, path: str | Path):
    """Every row with its raw repetition times, and the settings, for later analysis."""

    def clean(x):  # json has no nan
        if isinstance(x, float) and math.isnan(x):
            return None
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    data = {
        "settings": settings,
        "rows": [{k: clean(v) for k, v in dataclasses.asdict(r).items()} for r in rows],
    }
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def header_settings(
    suites: Sequence[Suite],
    *,
    temperatures: Sequence[float],
    reps: int,
    hf: bool,
    command: str,
    prompts: Sequence[str] = (),
) -> dict[str, str]:
    """The settings named in every results file (after device_header's backend, device kind,
    host and jax version): dtype, batch, tree budgets, temperatures, repetitions, peer, load."""
    budgets = sorted(
        {
            f"{m.name}: {m.draft_nodes}"
            for s in suites
            for m in s.methods
            if m.kind == SPEC or (hf and m.kind in (HF_ASSISTED, HF_LOOKUP))
        }
    )
    settings = {
        "dtype": "float32 (specjax and transformers)",
        "batch": "1 (each prompt decoded alone; transformers' assisted generation takes batch 1)",
        "temperatures": ", ".join(f"{t:g}" for t in temperatures)
        + " (T=0 greedy; T>0 samples with top-k and top-p off)",
        "tree budget (draft tokens per target call)": "; ".join(budgets) or "-",
        "repetitions": f"{reps} interleaved (median, min-max), after a compile/warm-up call and a "
        "second warm-up pass once every method had its first",
    }
    if prompts:
        settings["prompts"] = "; ".join(prompts)
    settings["transformers peer"] = peer_description() if hf and hf_available() else "not run"
    # _rows compares with a suite's first speculative peer: name it where there are several.
    peers = {s.name: [m.name for m in s.methods if m.kind in (HF_ASSISTED, HF_LOOKUP)]
             for s in suites}  # fmt: skip
    if hf and any(len(p) > 1 for p in peers.values()):
        settings["vs HF spec"] = "; ".join(f"{k}: {p[0]}" for k, p in peers.items() if p)
    host = f"{os.cpu_count()} cores"
    if hasattr(os, "getloadavg"):  # other processes skew CPU timings: say how busy it was
        host += f", 1-minute load average {os.getloadavg()[0]:.2f} at start"
    settings["host load"] = host
    settings["python"] = f"{platform.python_version()}"
    settings["command"] = command
    return settings
