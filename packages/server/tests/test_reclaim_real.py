"""Reclaiming what a crashed ``open`` made, on the real providers (see ``_reclaim``).

A box is opened for a session and dropped without closing (as a SIGKILL
after ``open`` would); ``reclaim_session`` must remove its directory and,
on docker, its container -- and nothing of another session. These fail,
not skip, under ``CORRAL_REQUIRE_BWRAP=1`` / ``CORRAL_REQUIRE_DOCKER=1``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.provider import ProviderConfig, SessionRef
from corral_server._reclaim import reclaim_session
from test_version_tree_real import _bwrap_problem, _docker_problem, _require

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _dirs(boxes: Path) -> set[str]:
    return {p.name for p in boxes.glob("*/ws-*")}


async def _leak_and_reclaim(provider: Any, kind: str, boxes: Path) -> None:
    kept = await provider.open(ProviderConfig(kind), SessionRef("ws-other"), frozenset({"fs"}))
    # A session whose id extends the crashed one's: its names share the prefix.
    longer = await provider.open(
        ProviderConfig(kind), SessionRef("ws-crashed-2"), frozenset({"fs"})
    )
    try:
        for _ in range(2):  # two crashed opens of the same session
            await provider.open(ProviderConfig(kind), SessionRef("ws-crashed"), frozenset({"fs"}))
        assert len(_dirs(boxes)) == 4
        assert await reclaim_session(provider, "ws-crashed") == 2
        assert len(_dirs(boxes)) == 2
        assert await reclaim_session(provider, "ws-crashed") == 0
        for other in (kept, longer):  # the other sessions' boxes still work
            assert (await other.workspace.fs.ls("/")) == []
    finally:
        await kept.workspace.close()
        await longer.workspace.close()


async def test_reclaim_on_local_sandbox(tmp_path: Path) -> None:
    _require("CORRAL_REQUIRE_BWRAP", "bubblewrap", _bwrap_problem())
    from corral_local_sandbox import LocalSandboxProvider

    await _leak_and_reclaim(
        LocalSandboxProvider(tmpdir_root=str(tmp_path)), "local-sandbox", tmp_path
    )


async def test_reclaim_on_docker_removes_the_containers(tmp_path: Path) -> None:
    image = os.environ.get("CORRAL_DOCKER_IMAGE", "corral-test:latest")
    _require("CORRAL_REQUIRE_DOCKER", "a Docker engine", _docker_problem(image))
    from corral_docker import LABEL_WORKSPACE, DockerProvider

    def containers(name: str) -> list[str]:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label={LABEL_WORKSPACE}={name}"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.split()

    provider = DockerProvider(image=image, pull=False, tmpdir_root=str(tmp_path))
    crashed = SessionRef("ws-crashed")
    await provider.open(ProviderConfig("docker"), crashed, frozenset({"fs", "shell"}))
    (name,) = _dirs(tmp_path)
    assert containers(name)
    assert await reclaim_session(provider, "ws-crashed") == 1
    assert not containers(name)
    assert not _dirs(tmp_path)
