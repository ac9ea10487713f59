"""Fixtures for the corral-openai-agents tests.

The Agents SDK runs only on asyncio (its runner creates asyncio tasks), so
these tests override the repository's trio+asyncio ``anyio_backend``: the
adapter's own code is backend-neutral, and the corral side of every call is
proven on trio by corral-core's tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agents import set_tracing_disabled


@pytest.fixture
def anyio_backend() -> str:
    """The SDK's only backend."""
    return "asyncio"


@pytest.fixture(autouse=True)
def _offline() -> Iterator[None]:
    """No trace export: the tests never reach the network."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)
