"""Does hierarchical (HSD) verification accept more than token-wise speculative sampling?

stories260K drafted by llama2xs-279K at temperature 1, chain drafts of length 4 and 6: the mean
tokens emitted per target call (tau = accepted + 1) for the two rules on the same prompts,
with 95% confidence intervals of each mean and of the paired per-prompt difference.
Writes experiments/results/hsd.md.

    python experiments/hsd_acceptance.py [--prompts 100] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import numpy as np

import specjax
from specjax.benchmark import device_header, mean_ci
from specjax.config import SamplingConfig, SpecConfig, TreeConfig
from specjax.datasets import tinystories_prompts
from specjax.paths import LLAMA2XS, STORIES260K, shared_path

RESULTS = Path(__file__).resolve().parent / "results"


def per_prompt_tau(target, drafter, prompts, rule, k, max_new, seeds):
    """tau of every (prompt, seed) row, decoded as one batch per seed."""
    taus = []
    for seed in range(seeds):
        keys = jax.random.split(jax.random.key(1000 + seed), len(prompts))
        out = specjax.speculative_generate(
            target,
            drafter,
            prompts,
            max_new_tokens=max_new,
            config=SpecConfig(tree=TreeConfig.chain(k), rule=rule),
            sampling=SamplingConfig(temperature=1.0),
            key=keys,
        )
        taus.append(np.asarray(out.stats["tau"]))
    return np.stack(taus, axis=1).mean(axis=1)  # [prompts]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    target = specjax.load(shared_path(STORIES260K))
    drafter = specjax.LMDrafter(specjax.load(shared_path(LLAMA2XS)).model)
    prompts = tinystories_prompts(target.tokenizer, args.prompts)
    lines = [
        "# HSD vs token-wise speculative sampling (stories260K + llama2xs-279K, T = 1)",
        "",
        device_header(
            prompts=f"{args.prompts} TinyStories dev prefixes x {args.seeds} seeds",
            new_tokens=args.max_new_tokens,
            batch=args.prompts,
            command="python experiments/hsd_acceptance.py",
        ),
        "",
        "| chain k | rule | tau (95% CI) | HSD - token-wise per prompt (95% CI) |",
        "|---|---|---|---|",
    ]
    for k in (4, 6):
        tok = per_prompt_tau(
            target.model, drafter, prompts, "chain", k, args.max_new_tokens, args.seeds
        )
        hsd = per_prompt_tau(
            target.model, drafter, prompts, "hsd", k, args.max_new_tokens, args.seeds
        )
        (m_t, c_t), (m_h, c_h) = mean_ci(tok), mean_ci(hsd)
        d, c_d = mean_ci(hsd - tok)
        lines.append(f"| {k} | token-wise | {m_t:.3f} ± {c_t:.3f} | |")
        lines.append(
            f"| {k} | HSD | {m_h:.3f} ± {c_h:.3f} | {d:+.3f} ± {c_d:.3f} ({100 * d / m_t:+.1f}%) |"
        )
        print(lines[-2], lines[-1], sep="\n", flush=True)
    lines += [
        "",
        "tau: tokens emitted per target call (accepted + 1), averaged per prompt over "
        "seeds; intervals are normal-approximation 95% CIs over prompts.",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "hsd.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
