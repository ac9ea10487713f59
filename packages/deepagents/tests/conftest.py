"""Fixtures for the corral-deepagents tests.

deepagents and LangChain's standard sandbox tests run on asyncio only
(``asyncio.TaskGroup``, ``asyncio.to_thread``), so these tests override the
repository's trio+asyncio ``anyio_backend``; the corral side of every call is
proven on trio by corral-core's tests, and a ``corral.sync`` session may run
its own loop on trio (tested here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """The frameworks' only backend."""
    return "asyncio"


def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run here, or None."""
    path = shutil.which("bwrap")
    if path is None:
        return "bubblewrap (bwrap) is not installed"
    probe = subprocess.run(
        [path, "--unshare-all", "--ro-bind", "/", "/", "--", "/bin/true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return "bwrap cannot create namespaces here"
    return None


def require_bwrap() -> None:
    """Skip without bubblewrap, or fail when CI requires it (CORRAL_REQUIRE_BWRAP=1).

    Called by class-scoped fixtures too, which run before any function-scoped gate.
    """
    problem = bwrap_problem()
    if problem is None:
        return
    if os.environ.get("CORRAL_REQUIRE_BWRAP") == "1":
        pytest.fail(f"CORRAL_REQUIRE_BWRAP=1 but {problem}")
    pytest.skip(problem)


@pytest.fixture(scope="session")
def bwrap_gate() -> Callable[[], None]:
    """:func:`require_bwrap`, for class-scoped fixtures (test modules cannot import conftest)."""
    return require_bwrap


@pytest.fixture(autouse=True)
def _require_bwrap(request: pytest.FixtureRequest) -> None:
    """Gate every test marked ``bwrap``."""
    if request.node.get_closest_marker("bwrap") is not None:
        require_bwrap()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the standard tests listed in their module's ``KNOWN_FAILURES`` strict xfail."""
    for item in items:
        known = getattr(getattr(item, "module", None), "KNOWN_FAILURES", None)
        name = getattr(item, "originalname", item.name)
        if item.cls is not None and known and name in known:
            reason, applies = known[name]
            only = getattr(item.module, "SANDBOX_ONLY", frozenset())
            if applies and (name not in only or item.cls.__name__ == "TestLocalSandbox"):
                item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
