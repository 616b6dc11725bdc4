"""Where the shared reference models and data live: $SPECJAX_SHARED, else ../shared beside the
repository root (the layout of a development checkout)."""

from __future__ import annotations

import os
from pathlib import Path

STORIES260K = "models/stories260K/stories260K.bin"
STORIES_TOKENIZER = "models/stories260K/tok512.bin"
LLAMA2XS = "models/llama2xs-279K/model.bin"
SMOLLM2 = "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"


# Drafters trained for the reference targets (experiments/train_drafters.py), in the repository.
SMOLLM2_MDC = "checkpoints/smollm2-mdc"
SMOLLM2_EAGLE = "checkpoints/smollm2-eagle"
STORIES260K_MDC = "checkpoints/stories260K-mdc"
STORIES260K_EAGLE = "checkpoints/stories260K-eagle"
# Exit heads for HiSpec (experiments/train_exit_heads.py).
SMOLLM2_HISPEC = "checkpoints/smollm2-hispec"
STORIES260K_HISPEC = "checkpoints/stories260K-hispec"
# n-gram tables of the target's own continuations (experiments/train_ngram_drafter.py).
STORIES260K_NGRAM = "checkpoints/stories260K-ngram"
SMOLLM2_NGRAM = "checkpoints/smollm2-ngram"


def repo_dir() -> Path:
    """The repository root (checkpoints/ and experiments/ live there)."""
    return Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    env = os.environ.get("SPECJAX_SHARED")
    if env:
        return Path(env)
    return repo_dir().parent / "shared"


def shared_path(relative: str) -> Path:
    """A file under the shared folder, with an error that says how to point at it if missing."""
    path = shared_dir() / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: set SPECJAX_SHARED to the folder that holds models/ and data/"
        )
    return path


def cache_dir() -> Path:
    """Where specjax keeps what it measures and builds (costs, compiled programs, the CPU
    kernel): $SPECJAX_CACHE, else ~/.cache/specjax."""
    env = os.environ.get("SPECJAX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specjax"
