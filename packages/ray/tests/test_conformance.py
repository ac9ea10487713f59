"""The conformance suite against ``ray`` wrapping local-bash and local-sandbox on the test cluster.

One provider configuration per inner kind (a fixed ``tmpdir_root``), so the
agents are started once per node and shared by every rule.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import pytest

from corral.provider import WorkspaceProvider
from corral_conformance import (
    AbstractCodeTests,
    AbstractLifecycleTests,
    AbstractProviderTests,
    AbstractRefTests,
    AbstractShellTests,
    ProviderFixtures,
)
from corral_ray import RayProvider
from corral_ray.testing import LocalCluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]


class RayFixtures(ProviderFixtures):
    inner = "local-bash"

    @pytest.fixture
    def anyio_backend(self) -> str:
        # The rules are the inner provider's, proven on both backends in its own
        # suite; the driver's trio bridging is proven by test_cluster.py.
        return "asyncio"

    @pytest.fixture
    def conformance_max_examples(self) -> int:
        return 8

    @pytest.fixture
    def ray_options(self, ray_cluster: LocalCluster) -> dict[str, Any]:
        return {
            "address": ray_cluster.address,
            "inner": self.inner,
            "inner_options": {"tmpdir_root": str(ray_cluster.root / self.inner)},
        }

    @pytest.fixture
    def provider(self, ray_options: dict[str, Any]) -> WorkspaceProvider:
        return RayProvider(**ray_options)

    @pytest.fixture
    def provider_factory(self, ray_options: dict[str, Any]) -> Callable[[], WorkspaceProvider]:
        return lambda: RayProvider(**ray_options)

    @pytest.fixture
    def provider_entry_point(self, ray_options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("ray", ray_options)


class TestRayOverLocalBash(AbstractProviderTests, RayFixtures):
    pass


class SandboxFixtures(RayFixtures):
    inner = "local-sandbox"

    @pytest.fixture
    def provider(self, ray_options: dict[str, Any]) -> WorkspaceProvider:
        if shutil.which("bwrap") is None:
            if os.environ.get("CORRAL_REQUIRE_BWRAP") == "1":
                pytest.fail("bubblewrap is not installed, and CORRAL_REQUIRE_BWRAP=1 requires it")
            pytest.skip("bubblewrap is not installed")
        return RayProvider(**ray_options)


@pytest.mark.bwrap
class TestRayOverLocalSandbox(
    AbstractLifecycleTests, AbstractCodeTests, AbstractShellTests, AbstractRefTests, SandboxFixtures
):
    """The rules where the sandbox differs from local-bash: commands, code, refs, lifecycle.

    The whole suite passed here too (with ``AbstractProviderTests`` as the
    base); CI runs this subset to keep the ray suite near two minutes on a
    2-core machine, the fs and session rules being the inner-independent
    proxy's, proven over local-bash above.
    """
