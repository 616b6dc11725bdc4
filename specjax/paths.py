"""Where the shared reference models and data live: $SPECJAX_SHARED, else ../shared beside the
repository root (the layout of a development checkout)."""

from __future__ import annotations

import os
from pathlib import Path

STORIES260K = "models/stories260K/stories260K.bin"
STORIES_TOKENIZER = "models/stories260K/tok512.bin"
LLAMA2XS = "models/llama2xs-279K/model.bin"
SMOLLM2 = "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"


def shared_dir() -> Path:
    env = os.environ.get("SPECJAX_SHARED")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared"


def shared_path(relative: str) -> Path:
    """A file under the shared folder, with an error that says how to point at it if missing."""
    path = shared_dir() / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: set SPECJAX_SHARED to the folder that holds models/ and data/"
        )
    return path
