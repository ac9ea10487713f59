"""The link/mode round trip (stop -> materialize) on local-sandbox (bwrap) and docker (busybox).

The service runs in-process over the real provider; the tree is made and
checked with the box's own shell. local-sandbox's protected paths refuse a
link or a mode at restore: that costs the path its metadata (logged), never
the version. These tests fail, not skip, under ``CORRAL_REQUIRE_BWRAP=1`` /
``CORRAL_REQUIRE_DOCKER=1``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.provider import CommandRequest
from corral_server import WorkspaceService
from server_support import TREE_SETUP, make_service

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# Plus a link whose target reads like an option.
SETUP = TREE_SETUP + "ln -s -- -n dash-target\n"

CHECK = (
    "stat -c '%n %a %F' bin/tool plain.txt private private/deep/key"
    " && for l in bin/alias bin/up host-file host-dir dangling dash-target;"
    ' do readlink -- "$l"; done && sh bin/alias x && cat bin/up'
)

EXPECTED = [
    "bin/tool 755 regular file",
    "plain.txt 640 regular file",
    "private 700 directory",
    "private/deep/key 600 regular file",
    "tool",
    "../plain.txt",
    "/etc/passwd",
    "../../../../../../../../etc",
    "does/not/exist",
    "-n",
    "ran-x",
    "hello",
]

SANDBOX = {"capabilities": ["fs", "shell"]}


def _require(var: str, what: str, problem: str | None) -> None:
    if problem is None:
        return
    if os.environ.get(var) == "1":
        pytest.fail(f"{var}=1 but {what} is unavailable: {problem}")
    pytest.skip(f"{what} is unavailable: {problem}")


def _bwrap_problem() -> str | None:
    path = shutil.which("bwrap")
    if path is None:
        return "bubblewrap (bwrap) is not installed"
    probe = subprocess.run(
        [path, "--unshare-all", "--ro-bind", "/", "/", "--", "/bin/true"],
        capture_output=True,
        check=False,
    )
    return None if probe.returncode == 0 else "bwrap cannot create namespaces here"


def _docker_problem(image: str) -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        return "the Docker daemon does not answer"
    inspect = ["docker", "image", "inspect", image]
    if subprocess.run(inspect, capture_output=True, check=False).returncode != 0:
        return f"image {image} missing (run packages/docker/scripts/ci-setup.sh)"
    return None


async def _sh(service: WorkspaceService, ws: str, command: str) -> str:
    shell = service._live[ws].workspace.shell
    assert shell is not None
    result = await shell.run(
        CommandRequest(command=command, allow_shell_syntax=True, timeout_s=60.0)
    )
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


async def _round_trip(service: WorkspaceService, provider_id: str) -> tuple[str, str]:
    """Make the tree, stop (a version), check it from the version, materialise and check."""
    await service.store.migrate()
    project, _ = await service.create_project("p1")
    ws = (await service.create(project, {"sandbox": {"provider": provider_id, **SANDBOX}})).id
    await service.connect(project, ws)
    await _sh(service, ws, SETUP)
    stopped = await service.stop(project, ws)
    assert stopped["version_id"] is not None
    for path, kind, mode in (
        ("bin/tool", "file", 0o755),
        ("plain.txt", "file", 0o640),
        ("private", "dir", 0o700),
        ("private/deep/key", "file", 0o600),
    ):
        st = await service.stat(project, ws, path)
        assert (st["type"], st["mode"]) == (kind, mode), path
    for link in ("bin/alias", "bin/up", "host-file", "host-dir", "dangling", "dash-target"):
        assert (await service.stat(project, ws, link))["type"] == "symlink", link
    await service.connect(project, ws)
    assert (await _sh(service, ws, CHECK)).splitlines() == EXPECTED
    return project, ws


async def test_round_trip_on_local_sandbox(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _require("CORRAL_REQUIRE_BWRAP", "bubblewrap", _bwrap_problem())
    from corral_local_sandbox import LocalSandboxProvider

    boxes = tmp_path / "boxes"
    boxes.mkdir()
    provider = LocalSandboxProvider(tmpdir_root=str(boxes))
    service = make_service(tmp_path, provider, validate_open=False, idle_stop_s=None)
    try:
        project, ws = await _round_trip(service, "local-sandbox")
        # Protected paths: the box may not hold a file, link or mode there. Put
        # them in from the host side (the box quarantines them when it notices).
        root = next(p.parent for p in boxes.rglob("plain.txt") if p.is_file())
        os.symlink("plain.txt", root / ".envrc")
        (root / ".bashrc").write_text("echo hi\n")
        os.chmod(root / ".bashrc", 0o600)
        caplog.clear()
        await service.stop(project, ws)
        names = {e["name"] for e in await service.ls(project, ws, "/")}
        assert ".envrc" not in names  # the box cannot read it as a link: left out
        assert "left out" in caplog.text
        assert (await service.stat(project, ws, ".bashrc"))["mode"] == 0o600
        # A version holding a protected path still restores: that path is refused, logged.
        caplog.clear()
        await service.connect(project, ws)
        assert "refused 1 paths" in caplog.text
        assert (await _sh(service, ws, CHECK)).splitlines() == EXPECTED
        await service.stop(project, ws)
    finally:
        await service.aclose(stop_live=True)
        await service.store.aclose()


async def test_round_trip_on_docker_busybox(tmp_path: Path) -> None:
    image = os.environ.get("CORRAL_DOCKER_IMAGE", "corral-test:latest")
    _require("CORRAL_REQUIRE_DOCKER", "a Docker engine", _docker_problem(image))
    from corral_docker import DockerProvider

    boxes = tmp_path / "boxes"
    boxes.mkdir()
    provider: Any = DockerProvider(image=image, pull=False, tmpdir_root=str(boxes))
    service = make_service(tmp_path, provider, validate_open=False, idle_stop_s=None)
    try:
        project, ws = await _round_trip(service, "docker")
        await service.stop(project, ws)
    finally:
        await service.aclose(stop_live=True)
        await service.store.aclose()
