"""The fixtures a provider author supplies, fsspec-style.

Subclass :class:`ProviderFixtures`, override ``provider`` (and optionally
the others), and mix the result into the abstract test classes::

    class MyFixtures(ProviderFixtures):
        @pytest.fixture
        def provider(self):
            return MyProvider()

    class TestMyFs(AbstractFsTests, MyFixtures):
        pass
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from corral import WorkspaceRef
from corral.provider import Workspace, WorkspaceProvider

from ._harness import DEFAULT_MAX_EXAMPLES, Harness, _same_ref

__all__ = ["ProviderFixtures"]


class ProviderFixtures:
    """Fixtures the abstract test classes need; ``provider`` must be overridden."""

    @pytest.fixture
    def provider(self) -> WorkspaceProvider:
        """The provider under test. Override it.

        Raises:
            NotImplementedError: Always, until a subclass overrides it.
        """
        raise NotImplementedError(
            "override the 'provider' fixture in your ProviderFixtures subclass"
        )

    @pytest.fixture
    def provider_options(self) -> Mapping[str, Any]:
        """``ProviderConfig.options`` passed to every ``open`` (none by default)."""
        return {}

    @pytest.fixture
    def workspace_host_dir(self) -> Callable[[Workspace], Path | None]:
        """Maps a workspace to its directory on this host, for the canary tests.

        Providers whose files live in a host directory should return it, so
        the path-containment rules can plant canaries beside it. The default
        returns None (a second session's file is the only canary).
        """
        return lambda _ws: None

    @pytest.fixture
    def provider_factory(self) -> Callable[[], WorkspaceProvider] | None:
        """Builds a fresh, equivalent provider instance, as after a process restart.

        Enables the rule that a ref resolves in another provider instance
        (the provider holds no per-session state). The default None skips it.
        """
        return None

    @pytest.fixture
    def provider_entry_point(self) -> tuple[str, Mapping[str, Any]] | None:
        """``(kind, factory options)`` to load the provider in another OS process.

        Enables the rule that a ref resolves cleanly in another process; the
        provider must then be installed as a corral plugin. Default None skips it.
        """
        return None

    @pytest.fixture
    def workspace_data_paths(
        self, workspace_host_dir: Callable[[Workspace], Path | None]
    ) -> Callable[[Workspace], Sequence[Path]]:
        """Maps an open workspace to the host paths that hold its data.

        The lifecycle rules check that they are gone after ``close`` (close
        releases the workspace *and its data*). The default is the
        workspace's host directory, when ``workspace_host_dir`` knows it.
        """

        def paths(ws: Workspace) -> Sequence[Path]:
            where = workspace_host_dir(ws)
            return [where] if where is not None else []

        return paths

    @pytest.fixture
    def downgrade_ref(self) -> Callable[[WorkspaceRef], WorkspaceRef]:
        """Turns a current ref into a valid ref of the previous version N-1.

        The default only restamps ``schema_version``; override it when the
        N-1 payload has a different shape.
        """
        return _same_ref

    @pytest.fixture
    def conformance_max_examples(self, request: pytest.FixtureRequest) -> int:
        """Hypothesis examples per property: ``--corral-max-examples``, or 30."""
        value = request.config.getoption("corral_max_examples", None)
        return int(value) if value else DEFAULT_MAX_EXAMPLES

    @pytest.fixture
    def conformance(
        self,
        request: pytest.FixtureRequest,
        *,
        conformance_max_examples: int,
        provider: WorkspaceProvider,
        provider_options: Mapping[str, Any],
        workspace_host_dir: Callable[[Workspace], Path | None],
        downgrade_ref: Callable[[WorkspaceRef], WorkspaceRef],
        provider_factory: Callable[[], WorkspaceProvider] | None,
        provider_entry_point: tuple[str, Mapping[str, Any]] | None,
        workspace_data_paths: Callable[[Workspace], Sequence[Path]],
    ) -> Harness:
        """The harness every abstract test drives the provider through."""
        return Harness(
            provider=provider,
            options=dict(provider_options),
            host_dir=workspace_host_dir,
            downgrade_ref=downgrade_ref,
            max_examples=conformance_max_examples,
            shrink=not request.config.getoption("corral_no_shrink", False),
            factory=provider_factory,
            entry_point=provider_entry_point,
            data_paths=workspace_data_paths,
        )
