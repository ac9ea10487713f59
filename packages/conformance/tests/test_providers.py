"""The in-repo providers pass the whole suite, through the abstract classes."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.provider import Workspace, WorkspaceProvider
from corral_conformance import AbstractProviderTests, ProviderFixtures, ReferenceProvider


class QuickFixtures(ProviderFixtures):
    """A smaller hypothesis budget: these classes run on both backends, three times over."""

    @pytest.fixture
    def conformance_max_examples(self) -> int:
        return 12


class ReferenceFixtures(QuickFixtures):
    @pytest.fixture
    def provider(self) -> WorkspaceProvider:
        return ReferenceProvider()

    @pytest.fixture
    def provider_factory(self) -> Callable[[], WorkspaceProvider]:
        return ReferenceProvider


class TestReferenceProvider(AbstractProviderTests, ReferenceFixtures):
    pass


class InMemoryFixtures(QuickFixtures):
    @pytest.fixture
    def provider(self) -> WorkspaceProvider:
        memory = pytest.importorskip("corral_memory", reason="corral-memory is not installed")
        return memory.InMemoryProvider()  # type: ignore[no-any-return]

    @pytest.fixture
    def provider_factory(self, provider: WorkspaceProvider) -> Callable[[], WorkspaceProvider]:
        return type(provider)

    @pytest.fixture
    def provider_entry_point(self) -> tuple[str, dict[str, Any]]:
        return ("in-memory", {})


class TestInMemoryProvider(AbstractProviderTests, InMemoryFixtures):
    pass


class IsolateFixtures(QuickFixtures):
    @pytest.fixture
    def provider(self) -> WorkspaceProvider:
        isolate = pytest.importorskip("corral_isolate", reason="corral-isolate is not installed")
        return isolate.IsolateProvider()  # type: ignore[no-any-return]


class TestIsolateProvider(AbstractProviderTests, IsolateFixtures):
    pass


class LocalBashFixtures(QuickFixtures):
    @pytest.fixture
    def provider(self, tmp_path: Path) -> WorkspaceProvider:
        local_bash = pytest.importorskip(
            "corral_local_bash", reason="corral-local-bash is not installed"
        )
        return local_bash.LocalBashProvider(tmpdir_root=str(tmp_path))  # type: ignore[no-any-return]

    @pytest.fixture
    def provider_options_for_factory(self, tmp_path: Path) -> dict[str, Any]:
        """The keyword options every instance of this class's provider is built with."""
        return {"tmpdir_root": str(tmp_path)}

    @pytest.fixture
    def provider_factory(
        self, provider: WorkspaceProvider, provider_options_for_factory: dict[str, Any]
    ) -> Callable[[], WorkspaceProvider]:
        # A fresh instance with the same options, as a restarted process would build.
        cls = type(provider)
        return lambda: cls(**provider_options_for_factory)

    @pytest.fixture
    def provider_entry_point(
        self, provider: WorkspaceProvider, provider_options_for_factory: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        return (provider.provider_id, provider_options_for_factory)

    @pytest.fixture
    def workspace_host_dir(self) -> Callable[[Workspace], Path | None]:
        def host_dir(ws: Workspace) -> Path | None:
            details = ws.details() if hasattr(ws, "details") else {}
            root = details.get("root")
            return Path(root) if root is not None else None

        return host_dir


class TestLocalBashProvider(AbstractProviderTests, LocalBashFixtures):
    pass


def _require_or_skip(env: str, available: bool, why: str) -> None:
    """Skip where the backend is missing, but fail where CI says it must be there."""
    if available:
        return
    if os.environ.get(env) == "1":
        pytest.fail(f"{why}, and {env}=1 requires it")
    pytest.skip(why)


def _docker_ready(image: str | None = None) -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(
        ["docker", "image", "inspect", image or DOCKER_IMAGE],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


DOCKER_IMAGE = os.environ.get("CORRAL_DOCKER_IMAGE", "corral-test:latest")
# The code and script rules need python3 in the box: they run on the code image
# ci-setup.sh builds.
DOCKER_CODE_IMAGE = os.environ.get("CORRAL_DOCKER_CODE_IMAGE", "corral-python:bookworm")


class LocalSandboxFixtures(LocalBashFixtures):
    @pytest.fixture
    def provider(self, tmp_path: Path) -> WorkspaceProvider:
        _require_or_skip(
            "CORRAL_REQUIRE_BWRAP", shutil.which("bwrap") is not None, "bubblewrap is not installed"
        )
        from corral_local_sandbox import LocalSandboxProvider

        return LocalSandboxProvider(tmpdir_root=str(tmp_path))


@pytest.mark.bwrap
class TestLocalSandboxProvider(AbstractProviderTests, LocalSandboxFixtures):
    pass


class DockerFixtures(LocalBashFixtures):
    @pytest.fixture
    def provider(self, tmp_path: Path, request: pytest.FixtureRequest) -> WorkspaceProvider:
        code_rule = request.function.__qualname__.startswith(
            ("AbstractCodeTests.", "AbstractScriptTests.")
        )
        image = DOCKER_CODE_IMAGE if code_rule else DOCKER_IMAGE
        _require_or_skip(
            "CORRAL_REQUIRE_DOCKER",
            _docker_ready(image),
            f"no Docker engine with the {image} image (packages/docker/scripts/ci-setup.sh)",
        )
        from corral_docker import DockerProvider

        return DockerProvider(tmpdir_root=str(tmp_path), image=image, pull=False)

    @pytest.fixture
    def provider_options_for_factory(self, tmp_path: Path) -> dict[str, Any]:
        return {"tmpdir_root": str(tmp_path), "image": DOCKER_IMAGE, "pull": False}


@pytest.mark.docker
class TestDockerProvider(AbstractProviderTests, DockerFixtures):
    pass
