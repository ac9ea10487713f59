"""Fixtures of the local-bash tests: providers rooted in a per-test temporary directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral_local_bash import LocalBashProvider


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The tmpdir_root every provider of one test shares."""
    return tmp_path / "root"


@pytest.fixture
def make_provider(root: Path) -> Callable[..., LocalBashProvider]:
    """Build providers as separate processes would: same options, no shared state."""

    def make(**options: Any) -> LocalBashProvider:
        return LocalBashProvider(tmpdir_root=root, **options)

    return make


@pytest.fixture
def provider(make_provider: Callable[..., LocalBashProvider]) -> LocalBashProvider:
    """One provider instance."""
    return make_provider()
