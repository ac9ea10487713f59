"""Real providers for core's cross-provider tests, gated like their own suites.

bubblewrap and Docker tests skip where those are missing, and fail instead
under ``CORRAL_REQUIRE_BWRAP=1`` / ``CORRAL_REQUIRE_DOCKER=1`` (as in CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

KINDS = ("in-memory", "local-bash", "local-sandbox", "docker")
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
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        return "the Docker daemon does not answer"
    image = subprocess.run(
        ["docker", "image", "inspect", DOCKER_IMAGE], capture_output=True, check=False
    )
    return None if image.returncode == 0 else f"image {DOCKER_IMAGE} missing"


def require(kind: str) -> None:
    """Skip (or fail when CI requires it) when ``kind`` cannot run here."""
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


def provider_options(kind: str, tmp_path: Path) -> dict[str, Any]:
    """Factory options that keep each provider's state under ``tmp_path``."""
    if kind == "in-memory":
        return {}
    options: dict[str, Any] = {"tmpdir_root": str(tmp_path)}
    if kind == "docker":
        options.update(image=DOCKER_IMAGE, pull=False)
    return options
