"""Fixtures for the corral-pydantic-ai tests.

pydantic-ai's agent graph runs only on asyncio (it creates asyncio tasks),
so these tests override the repository's trio+asyncio ``anyio_backend``: the
adapter's own code is backend-neutral, and the corral side of every call is
proven on trio by corral-core's tests.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """The framework's only backend."""
    return "asyncio"
