"""Opening a real provider that cannot run raises at open with the provider's advice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import corral
from corral import WorkspaceFailedError

from ._real_providers import provider_options, require

pytestmark = pytest.mark.anyio


async def test_local_sandbox_without_bubblewrap(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceFailedError) as info:
        async with corral.open_workspace(
            "local-sandbox",
            {"fs": True, "shell": True},
            provider_options={"tmpdir_root": str(tmp_path), "bwrap_path": "/nonexistent/bwrap"},
        ):
            pytest.fail("opened without bubblewrap")
    assert "bubblewrap" in info.value.message
    assert "install" in info.value.message


async def test_docker_without_a_daemon(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceFailedError) as info:
        async with corral.open_workspace(
            "docker",
            {"fs": True, "shell": True},
            provider_options={
                "tmpdir_root": str(tmp_path),
                "base_url": f"unix://{tmp_path}/no.sock",
            },
        ):
            pytest.fail("opened without a daemon")
    assert "cannot reach the Docker daemon" in info.value.message
    assert "start dockerd" in info.value.message


async def test_docker_over_ssh_without_paramiko_says_which_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "paramiko", None)  # import paramiko -> ImportError
    with pytest.raises(WorkspaceFailedError) as info:
        async with corral.open_workspace(
            "docker",
            {"fs": True},
            provider_options={"base_url": "ssh://nobody@127.0.0.1:9"},
        ):
            pytest.fail("opened without paramiko")
    assert "pip install 'corral-docker[ssh]'" in info.value.message
    assert "start dockerd" not in info.value.message


async def test_docker_names_the_missing_image(tmp_path: Path) -> None:
    require("docker")
    options = provider_options("docker", tmp_path)
    options["image"] = "corral-test-missing:never-built"
    with pytest.raises(WorkspaceFailedError) as info:
        async with corral.open_workspace("docker", {"fs": True}, provider_options=options):
            pytest.fail("opened without its image")
    assert "corral-test-missing:never-built" in info.value.message
    assert "pulling is off" in info.value.message
    assert "could not be pulled" in info.value.message


def test_docker_pull_errors_are_classified_not_echoed() -> None:
    from corral_docker._sdk import _pull_reason

    class ApiError(Exception):
        def __init__(self, status: int) -> None:
            super().__init__("registry says: <untrusted text>")
            self.status_code = status

    assert "docker login" in _pull_reason(ApiError(401))
    assert "no such repository" in _pull_reason(ApiError(404))
    assert "untrusted" not in _pull_reason(ApiError(500))


def test_the_docker_probe_reports_an_unreachable_daemon(tmp_path: Path) -> None:
    from corral_docker._sdk import daemon_problem

    problem = daemon_problem(f"unix://{tmp_path}/no.sock")
    assert problem is not None
    assert "start dockerd" in problem
    if require("docker") is None:
        assert daemon_problem() is None
