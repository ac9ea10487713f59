"""What every conformance test uses: the provider under test and how to drive it."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import anyio
import anyio.from_thread
import attrs
import hypothesis
import pytest

import corral
import corral.provider
from corral import ProviderConfig, SessionRef, WorkspaceRef
from corral.provider import OpenedWorkspace, Workspace

from ._defaults import DEFAULT_MAX_EXAMPLES

__all__ = ["DEFAULT_MAX_EXAMPLES", "Harness", "dump_tree"]


_log = logging.getLogger("corral.conformance")

P = ParamSpec("P")
T = TypeVar("T")


def _no_host_dir(_ws: Workspace) -> Path | None:
    return None


def _no_data_paths(_ws: Workspace) -> Sequence[Path]:
    return ()


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true")


def _same_ref(ref: WorkspaceRef) -> WorkspaceRef:
    return attrs.evolve(ref, schema_version=ref.schema_version - 1 if ref.schema_version else None)


@attrs.frozen
class Harness:
    """The provider under test plus the knobs the fixtures set.

    Attributes:
        provider: The provider instance (one per test; sessions share it).
        options: ``ProviderConfig.options`` for every open.
        host_dir: Returns a workspace's directory on this host, or None.
        downgrade_ref: Turns a current ref into a valid ref of version N-1.
        max_examples: Hypothesis budget per property.
        shrink: Let hypothesis shrink a failing example (slower, clearer).
        op_timeout_s: A provider call slower than this fails the test.
        factory: Builds another, fresh provider instance (as after a process
            restart), or None when only the one instance is known.
        entry_point: ``(kind, factory options)`` that load the provider in
            another process through its plugin, or None (a provider given
            directly cannot be loaded elsewhere).
        data_paths: Host paths that hold a workspace's data (checked gone
            after close); empty when the provider has none to inspect.
    """

    provider: corral.provider.WorkspaceProvider
    options: Mapping[str, Any] = attrs.field(factory=dict)
    host_dir: Callable[[Workspace], Path | None] = _no_host_dir
    downgrade_ref: Callable[[WorkspaceRef], WorkspaceRef] = _same_ref
    max_examples: int = DEFAULT_MAX_EXAMPLES
    shrink: bool = True
    op_timeout_s: float = 60.0
    factory: Callable[[], corral.provider.WorkspaceProvider] | None = None
    entry_point: tuple[str, Mapping[str, Any]] | None = None
    data_paths: Callable[[Workspace], Sequence[Path]] = _no_data_paths
    _handles: list[Workspace] = attrs.field(factory=list, init=False, repr=False)

    @property
    def kind(self) -> str:
        """The provider id, used as ``ProviderConfig.kind``."""
        return self.provider.provider_id

    @property
    def advertised(self) -> frozenset[str]:
        """Capabilities the provider says it can populate."""
        return frozenset(self.provider.capabilities)

    def require(self, *capabilities: str) -> None:
        """Skip the calling test unless every capability is advertised."""
        missing = [c for c in capabilities if c not in self.advertised]
        if missing:
            pytest.skip(f"provider {self.kind} does not advertise {', '.join(missing)}")

    def config(self, **extra: Any) -> ProviderConfig:
        """The provider config, with extra options merged in."""
        return ProviderConfig(self.kind, {**self.options, **extra})

    async def call(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Await a provider call, failing the test if it hangs."""
        with anyio.fail_after(self.op_timeout_s):
            return await fn(*args, **kwargs)

    async def open(
        self,
        declared: frozenset[str] | None,
        *,
        session_id: str | None = None,
        agent_id: str | None = None,
        config: ProviderConfig | None = None,
    ) -> OpenedWorkspace:
        """Open a workspace for a fresh (or given) session."""
        session = SessionRef(session_id or f"conformance-{secrets.token_hex(6)}", agent_id)
        return await self.call(self.provider.open, config or self.config(), session, declared)

    async def resolve(
        self, ref: WorkspaceRef, *, provider: corral.provider.WorkspaceProvider | None = None
    ) -> Workspace:
        """Resolve a ref (by this or another provider) and remember the handle.

        Every resolve may allocate (docker starts a container); :meth:`release`
        closes the remembered handles so a run leaks nothing.
        """
        ws = await self.call((provider or self.provider).resolve, ref)
        self._handles.append(ws)
        return ws

    async def release(self) -> None:
        """Close every handle :meth:`resolve` returned, ignoring their errors.

        They are second handles on workspaces the test closes itself; how a
        second close of one workspace fails is not what these rules check.
        """
        with anyio.CancelScope(shield=True):
            while self._handles:
                handle = self._handles.pop()
                try:
                    with anyio.fail_after(self.op_timeout_s):
                        await handle.close()
                except Exception:  # cleanup only; see the docstring
                    _log.debug("conformance: closing a resolved handle failed", exc_info=True)

    @asynccontextmanager
    async def session(
        self, *capabilities: str, declared: frozenset[str] | None = None
    ) -> AsyncIterator[OpenedWorkspace]:
        """Open a workspace declaring ``capabilities`` and close it afterwards."""
        want = frozenset(capabilities) if declared is None else declared
        opened = await self.open(want)
        try:
            for name in want:
                assert opened.workspace.module(name) is not None, (
                    f"{self.kind}: declared {name!r} but the opened workspace lacks that module"
                )
            yield opened
        finally:
            with anyio.CancelScope(shield=True):
                await self.call(opened.workspace.close)
                await self.release()

    def settings(self, **overrides: Any) -> hypothesis.settings:
        """Hypothesis settings with the suite's budget and no example database.

        Under ``CI=true`` the draws are derandomised, as the repository's
        conftest does, so a CI verdict never depends on a lucky draw (the
        shipped suite runs without that conftest).
        """
        base: dict[str, Any] = {
            "derandomize": _ci(),
            "max_examples": self.max_examples,
            "deadline": None,
            "database": None,
            "suppress_health_check": [
                hypothesis.HealthCheck.too_slow,
                hypothesis.HealthCheck.filter_too_much,
                hypothesis.HealthCheck.data_too_large,
            ],
        }
        if not self.shrink:
            base["phases"] = [
                hypothesis.Phase.explicit,
                hypothesis.Phase.reuse,
                hypothesis.Phase.generate,
            ]
        base.update(overrides)
        return hypothesis.settings(**base)

    def blocking(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """From a worker thread (a hypothesis body), run one provider call on the loop."""

        async def run() -> T:
            return await self.call(fn, *args, **kwargs)

        return anyio.from_thread.run(run)

    async def in_thread(self, body: Callable[[], None]) -> None:
        """Run a synchronous hypothesis body in a worker thread.

        Hypothesis drives synchronous functions; providers are async. The body
        runs in a thread and reaches the event loop through :meth:`blocking`.
        """
        await anyio.to_thread.run_sync(body)


async def dump_tree(fs: corral.provider.FileSystem, path: str = "/") -> dict[str, bytes | None]:
    """Every path under ``path``: file contents, or None for a directory."""
    out: dict[str, bytes | None] = {}
    for entry in await fs.ls(path):
        if entry.type == "dir":
            out[entry.path] = None
            out.update(await dump_tree(fs, entry.path))
        elif entry.type == "file":
            out[entry.path] = await fs.read_file(entry.path)
    return out
