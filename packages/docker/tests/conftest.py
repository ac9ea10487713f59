"""Shared fixtures: the recording fake engine, and gates for the real engine and sshd."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import urllib.parse
from collections.abc import Callable

import pytest

from corral_docker import FakeDockerEngine
from corral_docker._options import code_image

TEST_IMAGE = os.environ.get("CORRAL_DOCKER_IMAGE", "corral-test:latest")
SETUP_SCRIPT = pathlib.Path(__file__).parents[1] / "scripts" / "ci-setup.sh"
_DEFAULT_SSH_URL = "ssh://root@127.0.0.1:2222"
SSH_URL = os.environ.get("CORRAL_DOCKER_SSH_URL", _DEFAULT_SSH_URL)


def _unavailable(require_var: str, what: str, reason: str) -> None:
    if os.environ.get(require_var) == "1":
        pytest.fail(f"{what} is required ({require_var}=1) but unavailable: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    info = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
    if info.returncode != 0:
        return "the Docker daemon does not answer (run packages/docker/scripts/ci-setup.sh)"
    image = subprocess.run(
        ["docker", "image", "inspect", TEST_IMAGE], capture_output=True, timeout=30, check=False
    )
    if image.returncode != 0:
        return f"image {TEST_IMAGE} missing (run packages/docker/scripts/ci-setup.sh)"
    return None


@pytest.fixture(scope="session")
def docker_ready() -> None:
    """Skip (or fail under CORRAL_REQUIRE_DOCKER=1) when no daemon or image."""
    problem = _docker_problem()
    if problem is not None:
        _unavailable("CORRAL_REQUIRE_DOCKER", "a Docker engine", problem)


@pytest.fixture(scope="session")
def python_image(docker_ready: None) -> str:
    """The code image (python3, matplotlib, numpy, node) ci-setup.sh builds.

    Skip (or fail under CORRAL_REQUIRE_DOCKER=1) when it is missing.
    """
    image = code_image()
    present = subprocess.run(
        ["docker", "image", "inspect", image], capture_output=True, timeout=30, check=False
    )
    if present.returncode != 0:
        reason = f"image {image} missing (run packages/docker/scripts/ci-setup.sh)"
        _unavailable("CORRAL_REQUIRE_DOCKER", f"the code image {image}", reason)
    return image


def _ssh_works() -> bool:
    # Probe the endpoint the tests will use (CORRAL_DOCKER_SSH_URL), not a fixed one.
    url = urllib.parse.urlsplit(SSH_URL)
    host, port = url.hostname or "127.0.0.1", url.port or 22
    try:
        with socket.create_connection((host, port), timeout=2):
            pass
    except OSError:
        return False
    probe = subprocess.run(
        [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            "-p",
            str(port),
            f"{url.username}@{host}" if url.username else host,
            "docker",
            "info",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


@pytest.fixture(scope="session")
def ssh_ready(docker_ready: None) -> str:
    """An ``ssh://`` Docker URL; starts sshd with the CI script's logic when needed."""
    default = SSH_URL == _DEFAULT_SSH_URL  # the CI script starts only that one
    if default and not _ssh_works() and os.geteuid() == 0 and shutil.which("sshd") is not None:
        subprocess.run(
            ["sh", str(SETUP_SCRIPT), "--ssh"], capture_output=True, timeout=300, check=False
        )
    if not _ssh_works():
        _unavailable(
            "CORRAL_REQUIRE_SSH",
            "an ssh endpoint for the Docker engine",
            f"{SSH_URL} does not reach a Docker engine (ci-setup.sh --ssh starts the default)",
        )
    return SSH_URL


@pytest.fixture
def fake() -> FakeDockerEngine:
    """A recording engine with the test image present."""
    return FakeDockerEngine(images=["corral-test:latest", "debian:bookworm-slim"])


@pytest.fixture
def tmp_root(tmp_path: pathlib.Path) -> str:
    """A tmpdir_root for one test."""
    root = tmp_path / "root"
    root.mkdir()
    return str(root)


def _docker_ps(label: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label={label}", "--format", "{{.ID}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if line]


@pytest.fixture
def docker_ps() -> Callable[[str], list[str]]:
    """Ids of containers (running or not) carrying a label (``key`` or ``key=value``)."""
    return _docker_ps


@pytest.fixture(scope="session")
def image() -> str:
    """The locally built test image."""
    return TEST_IMAGE
