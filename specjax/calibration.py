"""Held-in calibration of acceptance profiles (specjax.acceptance): prompts from the training
side of the shared data (never MT-bench or the EAGLE question files), and the runs that write a
trained drafter's acceptance.json or a draft-model pair's cached profile.

Chat targets calibrate on the project's broad prompt generator (specjax.train.broad_prompts,
seed CALIBRATION_SEED, not a training seed) in the chat template; story targets on the first
words of TinyStories training paragraphs.
"""

from __future__ import annotations

from collections.abc import Callable

from specjax.acceptance import PROFILE_FILE, AcceptanceProfile, calibrate, write_profiles
from specjax.config import SamplingConfig
from specjax.paths import shared_dir

CALIBRATION_SEED = 9173
MODES = {"greedy": SamplingConfig(), "sampled": SamplingConfig(temperature=1.0)}


def held_in_prompts(kind: str, tokenizer, n: int = 8) -> tuple[list[list[int]], str]:
    """(token-id prompts, a description) for a "chat" or "story" target."""
    if kind == "chat":
        from specjax.train.broad_prompts import broad_prompts

        prompts = []
        for text in broad_prompts(n, seed=CALIBRATION_SEED):
            chat = tokenizer.apply_chat(
                [{"role": "user", "content": text}], add_generation_prompt=True
            )
            prompts.append(tokenizer.encode(chat, bos=False))
        return prompts, f"{n} broad_prompts (seed {CALIBRATION_SEED}), chat template"
    if kind == "story":
        text = (shared_dir() / "data" / "tinystories_train_head.txt").read_text()
        paras = [p.strip() for p in text.split("\n\n") if p.strip()][-n:]
        prompts = [tokenizer.encode(" ".join(p.split()[:8]), bos=True) for p in paras]
        return prompts, f"first 8 words of the last {n} paragraphs of tinystories_train_head.txt"
    raise ValueError(f"calibration prompts are for 'chat' or 'story' targets, got {kind!r}")


def calibrate_drafter(
    target,
    drafter,
    prompts,
    *,
    description: str,
    modes=tuple(MODES),
    max_new_tokens: int = 64,
    eos_id: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[AcceptanceProfile]:
    """Every probe of the drafter (specjax.choice.probes_for) in every mode."""
    from specjax.choice import probes_for

    profiles = []
    for mode in modes:
        for probe in probes_for(drafter):
            if progress is not None:
                progress(f"calibrating {mode}, probe {probe}")
            profiles.append(
                calibrate(
                    target,
                    drafter,
                    prompts,
                    probe=probe,
                    sampling=MODES[mode],
                    max_new_tokens=max_new_tokens,
                    eos_id=eos_id,
                    description=description,
                )  # fmt: skip
            )
    return profiles


def write_checkpoint_profiles(folder, profiles) -> None:
    """A trained drafter's profiles, next to its weights (read by load_drafter's drafter)."""
    from pathlib import Path

    write_profiles(Path(folder) / PROFILE_FILE, profiles)


def ensure_pair_profiles(target, drafter, prompts, *, description: str, eos_id=None) -> None:
    """Calibrate a drafter without a checkpoint profile on held-in prompts unless its pair
    profile is already cached (so SpecConfig.auto() never calibrates on evaluation prompts)."""
    from specjax.acceptance import read_profiles
    from specjax.choice import pair_profile_file

    if getattr(drafter, "checkpoint_dir", None) is not None:
        return
    for mode in MODES:
        path = pair_profile_file(target, drafter, mode)
        if not read_profiles(path):
            write_profiles(path, calibrate_drafter(
                target, drafter, prompts, description=description, modes=(mode,), eos_id=eos_id,
            ))  # fmt: skip
