"""Shared test fixtures: where the golden vectors live."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
VECTORS = Path(REPO_ROOT.parent / "shared" / "vectors").resolve()


@pytest.fixture(scope="session")
def vectors() -> Path:
    """The golden vectors from TiCDC's repositories, read in place (never copied into this repo)."""
    assert VECTORS.is_dir(), f"expected the shared vectors at {VECTORS}"
    return VECTORS
