"""Shared test fixtures: the shared models/data folder ($SPECJAX_SHARED, default ../shared)."""

from pathlib import Path

import pytest

from specjax.paths import shared_dir as _shared_dir


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    path = _shared_dir()
    if not path.exists():
        pytest.skip(f"shared folder {path} not found (set SPECJAX_SHARED)")
    return path


def require(path: Path) -> Path:
    """Skip the calling test when a shared file is missing."""
    if not Path(path).exists():
        pytest.skip(f"{path} missing")
    return Path(path)
