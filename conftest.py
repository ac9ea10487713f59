"""Repository-wide test configuration: every async test runs on trio and asyncio."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Parametrise ``@pytest.mark.anyio`` tests over both backends."""
    return str(request.param)
