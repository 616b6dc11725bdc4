"""Pair two drafters' per-prompt taus from two drafter_tau.py runs, prompt by prompt.

    python experiments/pair_tau.py \
        --a experiments/results/drafter_tau_mdc6p4_clean.json:mdc6p4c_self1500/smollm2-mdc \
        --a experiments/results/drafter_tau_mdc6p4_clean_tasks.json:mdc6p4c_self1500/smollm2-mdc \
        --b experiments/results/drafter_tau_mdc_matched.json:smollm2-mdc \
        --b experiments/results/drafter_tau_tasks.json:smollm2-mdc \
        --sets mt_bench qa sum gsm8k --skip-resembled --out experiments/results/X.md

Why: drafter_tau.py pairs a new drafter with a baseline run only where the two decoded the same
number of prompts; runs of the same settings on the same machine that decoded different numbers
share a prefix (specjax.datasets.select_questions takes the first n of one round-robin order), so
their common prompts pair exactly. Each file's json keeps one list of taus per "set|T|drafter" in
that order. Nothing is decoded here; all files must come from one machine and one set of
settings, which a .json records where it was written after they were kept (checked) and its .md
header names otherwise (read it).

Per set: both drafters' mean tau on the common prompts and their paired difference (95% Student-t
interval over prompts); with --skip-resembled also on the first turns (MT-bench's) that no training
template was written after (specjax.train.evaluation_like.RESEMBLED); and over all sets together.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drafter_tau import resembled_mask  # noqa: E402

from specjax.benchmark import mean_ci  # noqa: E402


def parse_source(text: str) -> tuple[Path, str]:
    """FILE.json:DRAFTER -> (path, drafter name as the json's keys spell it)."""
    path, sep, name = text.partition(".json:")
    if not sep or not name:
        raise SystemExit(f"expected FILE.json:DRAFTER, got {text!r}")
    return Path(path + ".json"), name


def load_taus(sources, sets, temperature: float) -> dict[str, np.ndarray]:
    """{set: per-prompt taus} of one drafter, each set from the first (path, name) source whose
    .json holds it (one run decodes MT-bench, another the task sets); a clear error naming the
    files' drafters where no source holds a set."""
    data = {}
    for path, _ in sources:
        if not path.is_file():
            raise SystemExit(f"{path}: no such file (drafter_tau.py writes it beside its .md)")
        data[path] = json.loads(path.read_text())
    taus = {}
    for set_name in sets:
        keys = [(path, f"{set_name}|{temperature:g}|{name}") for path, name in sources]
        found = [data[path][key] for path, key in keys if key in data[path]]
        if not found:
            held = sorted({k for d in data.values() for k in d if k.count("|") == 2})
            raise SystemExit(
                f"no taus for {' or '.join(k for _, k in keys)} in "
                f"{', '.join(str(p) for p, _ in sources)}; they hold {', '.join(held)}"
            )
        taus[set_name] = np.asarray(found[0], np.float64)
    return taus


def check_same_run_conditions(files) -> None:
    """Refuse runs that record different settings or machines (older files record neither):
    greedy taus pair only between runs of one machine and one set of settings."""
    loaded = {path: json.loads(path.read_text()) for path in files}
    for key in ("settings", "machine"):
        seen = {json.dumps(d[key], sort_keys=True): p for p, d in loaded.items() if key in d}
        if len(seen) > 1:
            raise SystemExit(
                f"{' and '.join(str(p) for p in seen.values())} record different {key}: "
                f"{' vs '.join(seen)}; their taus do not pair"
            )


def pair_lines(a_name, b_name, a_taus, b_taus, skip_resembled: bool) -> list[str]:
    """Markdown table rows: per set (and per set's unresembled prompts), then all sets."""
    rows, all_a, all_b, dropped = [], [], [], False

    def row(label, x, y):
        d, half = mean_ci(x - y)
        rows.append(
            f"| {label} | {len(x)} | {x.mean():.3f} | {y.mean():.3f} | {d:+.3f} ± {half:.3f} |"
        )

    for set_name in a_taus:
        n = min(len(a_taus[set_name]), len(b_taus[set_name]))
        x, y = a_taus[set_name][:n], b_taus[set_name][:n]
        row(set_name, x, y)
        if skip_resembled:
            keep = ~resembled_mask(set_name, n)
            if not keep.all():
                row(f"{set_name}, unresembled turns", x[keep], y[keep])
                x, y, dropped = x[keep], y[keep], True
        all_a.append(x)
        all_b.append(y)
    if len(a_taus) > 1:
        row("all sets" + (", unresembled turns" if dropped else ""),
            np.concatenate(all_a), np.concatenate(all_b))  # fmt: skip
    return [
        f"| prompts | n | tau, {a_name} | tau, {b_name} | paired difference (95% CI) |",
        "|---|---|---|---|---|",
        *rows,
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--a", required=True, action="append", help="FILE.json:DRAFTER, the candidate (repeat "
        "for runs of other sets: each set is read from the first file that holds it)"
    )  # fmt: skip
    parser.add_argument(
        "--b", required=True, action="append", help="FILE.json:DRAFTER, the drafter paired with"
    )  # fmt: skip
    parser.add_argument("--sets", nargs="+", default=["mt_bench"])
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--skip-resembled",
        action="store_true",
        help="also pair only the turns no training template was written after",
    )
    parser.add_argument("--out", type=Path, help="markdown file (default: print)")
    args = parser.parse_args(argv)

    a_sources, b_sources = [parse_source(t) for t in args.a], [parse_source(t) for t in args.b]
    a_taus = load_taus(a_sources, args.sets, args.temperature)
    b_taus = load_taus(b_sources, args.sets, args.temperature)
    check_same_run_conditions({path for path, _ in a_sources + b_sources})
    a_name, b_name = a_sources[0][1], b_sources[0][1]
    lines = [
        "# Paired taus of two drafter_tau.py runs",
        "",
        f"- command: `python experiments/pair_tau.py {' '.join(argv or sys.argv[1:])}`",
        f"- {a_name} from {', '.join(str(p) for p, _ in a_sources)}; {b_name} from "
        f"{', '.join(str(p) for p, _ in b_sources)}; T={args.temperature:g}; the prompts "
        "both runs decoded (a common prefix of each set's round-robin order)",
        "",
        *pair_lines(a_name, b_name, a_taus, b_taus, args.skip_resembled),
        "",
    ]
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
