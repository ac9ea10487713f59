"""Under CORRAL_REQUIRE_RAY=1 (CI) a cluster that cannot start fails the suite; else it skips."""

from __future__ import annotations

import pytest

from .conftest import _unavailable


def test_required_ray_fails_instead_of_skipping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_REQUIRE_RAY", "1")
    with pytest.raises(pytest.fail.Exception, match="CORRAL_REQUIRE_RAY=1"):
        _unavailable("ray start failed")


def test_optional_ray_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_REQUIRE_RAY", raising=False)
    with pytest.raises(pytest.skip.Exception):
        _unavailable("ray start failed")
