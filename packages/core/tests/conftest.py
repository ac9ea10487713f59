"""Fixtures for core's unit tests: a small, scriptable fake provider.

The fake is deliberately structural (it implements only what the registry
and the tool layer call) and records every call, so tests can assert that
bad arguments never reach it and that retries happen exactly as often as
they should. Real providers are tested in their own packages and through
the conformance suite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest

import corral
import corral.capability
import corral.provider
from corral import (
    ExecResult,
    FileEntry,
    FileStat,
    GrepMatch,
    GrepResult,
    OperationError,
    ProviderConfig,
    SessionRef,
    WorkspaceEvictedError,
    WorkspaceFailedError,
    WorkspaceRef,
)
from corral.capability import GrepOptions
from corral.provider import ModularWorkspace, OpenedWorkspace


class FakeFs:
    """A flat dict of files; enough semantics for the tool layer's tests."""

    def __init__(self, calls: list[str], files: dict[str, bytes]) -> None:
        self.calls = calls
        self.files = files
        self.evict_next = 0

    def _hit(self, op: str) -> None:
        self.calls.append(op)
        if self.evict_next > 0:
            self.evict_next -= 1
            raise WorkspaceEvictedError("backing store went away", provider_id="fake")

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        self._hit("read_file")
        if path not in self.files:
            raise OperationError(f"{path} not found", code="not_found")
        if max_bytes is not None and len(self.files[path]) > max_bytes:
            raise OperationError(f"{path} is too large", code="too_large")
        return self.files[path]

    async def write_file(self, path: str, data: bytes) -> None:
        self._hit("write_file")
        self.files[path] = data

    async def edit_file(self, path: str, old: str, new: str, *, replace_all: bool = False) -> int:
        self._hit("edit_file")
        text = (await self.read_file(path)).decode()
        count = text.count(old)
        if count == 0:
            raise OperationError("old_text not found", code="no_match")
        if count > 1 and not replace_all:
            raise OperationError("old_text is not unique", code="not_unique")
        self.files[path] = text.replace(old, new).encode()
        return count

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        self._hit("ls")
        return [
            FileEntry(p.rsplit("/", 1)[1], p, "file", len(d)) for p, d in sorted(self.files.items())
        ]

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        self._hit("glob")
        return [p for p in sorted(self.files) if corral.provider.glob_match(pattern, p.lstrip("/"))]

    async def grep(self, matcher: corral.capability.Matcher, options: GrepOptions) -> GrepResult:
        self._hit("grep")
        found = [
            GrepMatch(p, n, line)
            for p, d in sorted(self.files.items())
            for n, line in matcher.search_lines(d.decode(), options.max_results)
        ]
        return GrepResult(matches=tuple(found[: options.max_results]))

    async def stat(self, path: str) -> FileStat:
        self._hit("stat")
        if path == "/":
            return FileStat("/", "dir", 0)
        if path not in self.files:
            raise OperationError(f"{path} not found", code="not_found")
        return FileStat(path, "file", len(self.files[path]))

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        self._hit("mkdir")

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        self._hit("rm")
        self.files.pop(path)


class FakeShell:
    """Echoes the request back so tests can see what the tool layer built."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.requests: list[corral.provider.CommandRequest] = []

    async def run(self, request: corral.provider.CommandRequest) -> ExecResult:
        self.calls.append("run")
        self.requests.append(request)
        return ExecResult(exit_code=0, stdout=request.command, duration_ms=1.0)


class FakeProvider:
    """A scriptable provider.

    Attributes:
        fail_transient: How many opens fail with a transient error first.
        fail_permanent: Every open fails permanently.
        advertise: Capabilities put on the ref (default: what was built).
        hang_close: close() never returns.
    """

    provider_id = "fake"
    schema_version = 2

    def __init__(self, capabilities: Sequence[str] = ("fs", "shell", "snapshot")) -> None:
        self.capabilities = frozenset(capabilities)
        self.calls: list[str] = []
        self.stores: dict[str, dict[str, bytes]] = {}
        self.workspaces: dict[str, ModularWorkspace] = {}
        self.fail_transient = 0
        self.fail_permanent = False
        self.advertise: frozenset[str] | None = None
        self.hang_close = False
        self.opens = 0
        self.resolves = 0
        self.last_fs: FakeFs | None = None
        self.last_shell: FakeShell | None = None

    def _build(self, ws_id: str) -> ModularWorkspace:
        files = self.stores.setdefault(ws_id, {})
        fs = FakeFs(self.calls, files) if "fs" in self.capabilities else None
        shell = FakeShell(self.calls) if "shell" in self.capabilities else None
        self.last_fs, self.last_shell = fs, shell

        async def on_close() -> None:
            self.calls.append("close")
            if self.hang_close:
                await anyio.sleep_forever()
            self.stores.pop(ws_id, None)

        ws = ModularWorkspace(ws_id, fs=fs, shell=shell, on_close=on_close)
        self.workspaces[ws_id] = ws
        return ws

    async def open(
        self, config: ProviderConfig, session: SessionRef, declared: frozenset[str] | None = None
    ) -> OpenedWorkspace:
        self.opens += 1
        if self.fail_permanent:
            raise WorkspaceFailedError("backend refused", provider_id="fake")
        if self.fail_transient > 0:
            self.fail_transient -= 1
            raise WorkspaceFailedError("backend busy", provider_id="fake", transient=True)
        ws_id = f"ws-{session.session_id}-{self.opens}"
        ws = self._build(ws_id)
        caps = self.advertise if self.advertise is not None else self.capabilities
        ref = WorkspaceRef("fake", {"id": ws_id}, caps, self.schema_version)
        return OpenedWorkspace(ws, ref)

    async def resolve(self, ref: WorkspaceRef) -> ModularWorkspace:
        self.resolves += 1
        corral.provider.check_ref(ref, provider_id="fake", current=self.schema_version)
        ws_id = ref.payload.get("id")
        if not isinstance(ws_id, str) or ws_id not in self.stores:
            raise WorkspaceFailedError("workspace is gone", provider_id="fake")
        return self._build(ws_id)


@pytest.fixture
def provider() -> FakeProvider:
    """A fresh fake provider."""
    return FakeProvider()


@pytest.fixture
def make_config() -> Any:
    """Build a config for the fake provider from a capability mapping."""

    def make(capabilities: dict[str, Any] | None = None) -> corral.WorkspaceConfig:
        return corral.WorkspaceConfig(
            ProviderConfig("fake"), capabilities if capabilities is not None else {"fs": True}
        )

    return make


@pytest.fixture
def plugins() -> corral.PluginSet:
    """Core's built-in capabilities only (no entry points)."""
    return corral.load_plugins(entrypoints=False)
