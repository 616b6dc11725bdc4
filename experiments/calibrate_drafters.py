"""Acceptance profiles of the shipped drafters on held-in prompts (specjax.calibration: user turns
the target writes itself for SmolLM2, TinyStories training prefixes for stories260K): writes
each trained drafter's acceptance.json next to its weights with a summary in its CARD.md, and
calibrates the draft-model and self-draft pairs of the bench suites into the cost cache
($SPECJAX_CACHE, else ~/.cache/specjax). SpecConfig.auto() reads both.

    python experiments/calibrate_drafters.py                 # every shipped drafter and pair
    python experiments/calibrate_drafters.py --only stories260K
    python experiments/calibrate_drafters.py --drafter smollm2-eagle   # one drafter, no pairs

Greedy and temperature-1 profiles, every probe tree of specjax.choice (static (4,2,1,1,1,1,1,1);
dynamic 63 nodes, depth 8, top-4 and top-8), 16 SmolLM2 turns / 8 story prefixes x 64 new
tokens; the greedy dynamic probes of feature drafters (which add text chains: their tables by
answer length) x 256 new tokens. About 25 minutes on 2 CPU cores for everything. Training
(specjax.train.pipeline) runs the same calibration for a new drafter.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from specjax.calibration import (
        calibrate_drafter,
        calibration_prompts,
        ensure_pair_profiles,
        write_checkpoint_profiles,
    )
    from specjax.drafters import LMDrafter, load_drafter
    from specjax.io import load
    from specjax.paths import (
        LLAMA2XS,
        SMOLLM2,
        SMOLLM2_EAGLE,
        SMOLLM2_MDC,
        STORIES260K,
        STORIES260K_EAGLE,
        STORIES260K_MDC,
        repo_dir,
        shared_path,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["stories260K", "smollm2"], default=None)
    parser.add_argument("--drafter", action="append", default=None, metavar="NAME",
                        help="calibrate only this shipped drafter (checkpoints/NAME; repeatable); "
                             "the pairs are skipped")  # fmt: skip
    args = parser.parse_args(argv)

    def say(message):
        print(f"[calibrate] {message}", file=sys.stderr, flush=True)

    targets = {
        "stories260K": (STORIES260K, "story", (STORIES260K_EAGLE, STORIES260K_MDC),
                        (LLAMA2XS, "self:2")),
        "smollm2": (SMOLLM2, "chat", (SMOLLM2_EAGLE, SMOLLM2_MDC), ("self:8",)),
    }  # fmt: skip
    shipped = {Path(rel).name for _, _, feature, _ in targets.values() for rel in feature}
    unknown = sorted(set(args.drafter or ()) - shipped)
    if unknown:
        parser.error(f"--drafter {', '.join(unknown)}: not a shipped drafter "
                     f"(one of {', '.join(sorted(shipped))})")  # fmt: skip
    for name, (model_path, kind, feature, pairs) in targets.items():
        if args.only and name != args.only:
            continue
        if args.drafter:
            feature = tuple(rel for rel in feature if Path(rel).name in args.drafter)
            pairs = ()
            if not feature:
                continue
        target = load(shared_path(model_path))
        eos = None if kind == "story" else target.tokenizer.eos_id
        prompts, description = calibration_prompts(kind, target.model, target.tokenizer)
        for rel in feature:
            folder = repo_dir() / rel
            t0 = time.perf_counter()
            drafter = load_drafter(folder, target.model)
            profiles = calibrate_drafter(target.model, drafter, prompts, description=description,
                                         eos_id=eos, progress=say)  # fmt: skip
            write_checkpoint_profiles(folder, profiles)
            taus = ", ".join(f"{p.mode} {p.probe} tau {p.measured_tau:.2f}" for p in profiles)
            say(f"{folder.name}: {time.perf_counter() - t0:.0f}s, {taus}")
        for spec in pairs:
            if spec.startswith("self:"):
                drafter = LMDrafter.self_draft(int(spec.split(":")[1]))
            else:
                drafter = LMDrafter(load(shared_path(spec)).model)
            t0 = time.perf_counter()
            held_in = (prompts, description)
            ensure_pair_profiles(target.model, drafter, lambda held_in=held_in: held_in,
                                 eos_id=eos)  # fmt: skip
            say(f"{name} + {spec}: {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
