"""The shipped suite: every abstract class, bound to the run's :class:`Target`.

Collected only when named explicitly (the pytest plugin, ``check_provider``
and ``corral conformance`` do so); its name keeps it out of ordinary runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from corral import WorkspaceRef
from corral.provider import Workspace, WorkspaceProvider

from ._fixtures import ProviderFixtures
from ._suites import AbstractProviderTests
from ._target import TARGET_KEY, Target


def _target(config: pytest.Config) -> Target:
    target = config.stash.get(TARGET_KEY, None)
    if target is None:
        pytest.skip("no provider selected (pass --corral-provider=KIND)")
    return target


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every async rule on the backends the run asked for."""
    target = metafunc.config.stash.get(TARGET_KEY, None)
    if target is not None and "anyio_backend" in metafunc.fixturenames:
        metafunc.parametrize("anyio_backend", target.backends, scope="module")


class TestConformance(AbstractProviderTests, ProviderFixtures):
    """The whole suite against the selected provider."""

    @pytest.fixture
    def provider(self, request: pytest.FixtureRequest) -> WorkspaceProvider:
        return _target(request.config).factory()

    @pytest.fixture
    def provider_options(self, request: pytest.FixtureRequest) -> Mapping[str, Any]:
        return _target(request.config).options

    @pytest.fixture
    def workspace_host_dir(
        self, request: pytest.FixtureRequest
    ) -> Callable[[Workspace], Path | None]:
        return _target(request.config).host_dir

    @pytest.fixture
    def downgrade_ref(
        self, request: pytest.FixtureRequest
    ) -> Callable[[WorkspaceRef], WorkspaceRef]:
        return _target(request.config).downgrade_ref

    @pytest.fixture
    def provider_factory(
        self, request: pytest.FixtureRequest
    ) -> Callable[[], WorkspaceProvider] | None:
        return _target(request.config).factory

    @pytest.fixture
    def provider_entry_point(
        self, request: pytest.FixtureRequest
    ) -> tuple[str, Mapping[str, Any]] | None:
        target = _target(request.config)
        return None if target.kind is None else (target.kind, dict(target.factory_options))

    @pytest.fixture
    def workspace_data_paths(
        self,
        request: pytest.FixtureRequest,
        workspace_host_dir: Callable[[Workspace], Path | None],
    ) -> Callable[[Workspace], Sequence[Path]]:
        target = _target(request.config)
        if target.data_paths is not None:
            return target.data_paths

        def paths(ws: Workspace) -> Sequence[Path]:
            where = workspace_host_dir(ws)
            return [where] if where is not None else []

        return paths

    def test_spec_matches_provider(
        self, request: pytest.FixtureRequest, provider: WorkspaceProvider
    ) -> None:
        """The plugin's ProviderSpec advertises what the provider instance does."""
        spec = _target(request.config).spec_capabilities
        if spec is None:
            pytest.skip("the provider was given directly, not through a plugin")
        assert frozenset(provider.capabilities) == spec, (
            f"ProviderSpec advertises {sorted(spec)}, the provider {sorted(provider.capabilities)}"
        )
