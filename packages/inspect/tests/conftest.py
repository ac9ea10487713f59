"""Gates for the real providers: skip without them, fail when CI requires them."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

DOCKER_IMAGE = os.environ.get("CORRAL_DOCKER_IMAGE", "corral-test:latest")


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


def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False).returncode:
        return "the Docker daemon does not answer (run packages/docker/scripts/ci-setup.sh)"
    image = subprocess.run(
        ["docker", "image", "inspect", DOCKER_IMAGE], capture_output=True, timeout=30, check=False
    )
    if image.returncode:
        return f"image {DOCKER_IMAGE} missing (run packages/docker/scripts/ci-setup.sh)"
    return None


def require(kind: str) -> None:
    """Skip when ``kind`` cannot run here, or fail when CI says it must."""
    if kind == "local-sandbox":
        problem, var = _bwrap_problem(), "CORRAL_REQUIRE_BWRAP"
    elif kind == "docker":
        problem, var = _docker_problem(), "CORRAL_REQUIRE_DOCKER"
    else:
        return
    if problem is None:
        return
    if os.environ.get(var) == "1":
        pytest.fail(f"{var}=1 but {problem}")
    pytest.skip(problem)


def provider_config(kind: str) -> dict[str, object]:
    """The sandbox config the real suites use for ``kind``."""
    options: dict[str, object] = {"image": DOCKER_IMAGE} if kind == "docker" else {}
    return {"provider": kind, "options": options}
