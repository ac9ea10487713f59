"""Shared fixtures: real bubblewrap workspaces, gated by the ``bwrap`` marker."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

import corral
import corral.provider
from corral_local_sandbox import LocalSandboxProvider


def _bwrap_problem() -> str | None:
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
        return f"bwrap cannot create namespaces here: {probe.stderr.strip()}"
    return None


@pytest.fixture(autouse=True)
def _require_bwrap(request: pytest.FixtureRequest) -> None:
    """Skip ``bwrap`` tests without bubblewrap, or fail when CI requires it."""
    if request.node.get_closest_marker("bwrap") is None:
        return
    problem = _bwrap_problem()
    if problem is None:
        return
    if os.environ.get("CORRAL_REQUIRE_BWRAP") == "1":
        pytest.fail(f"CORRAL_REQUIRE_BWRAP=1 but {problem}")
    pytest.skip(problem)


OpenWs = Callable[..., AbstractAsyncContextManager[corral.provider.Workspace]]


@pytest.fixture
def open_ws(tmp_path: Any) -> OpenWs:
    """``async with open_ws(**provider_options) as ws`` -- a real sandboxed workspace."""

    @asynccontextmanager
    async def opener(**options: Any) -> AsyncIterator[corral.provider.Workspace]:
        options.setdefault("tmpdir_root", str(tmp_path))
        provider = LocalSandboxProvider(**options)
        opened = await provider.open(
            corral.ProviderConfig("local-sandbox"), corral.SessionRef("test")
        )
        try:
            yield opened.workspace
        finally:
            await opened.workspace.close()

    return opener


async def run(
    ws: corral.provider.Workspace, command: str, *, timeout_s: float = 20.0, **kw: Any
) -> corral.ExecResult:
    """Run a shell-syntax command in ``ws``."""
    assert ws.shell is not None
    request = corral.provider.CommandRequest(
        command, allow_shell_syntax=True, timeout_s=timeout_s, **kw
    )
    return await ws.shell.run(request)


@pytest.fixture
def sh() -> Callable[..., Any]:
    """The :func:`run` helper, as a fixture (tests cannot import conftest)."""
    return run
