"""Proof that the process rules bite: one realistic defect per rule, around a real module.

Each broken provider is local-bash with its ``process`` module wrapped by ONE
defect a process-module author could plausibly ship (a read that re-sends a
byte on resume, an expiry error naming the wrong cursor, a kill that leaves
the children running...). Each case runs the process rules through
``check_provider`` and asserts that the intended rules fail and that no
other rule fails that the unbroken module passes.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import corral.provider
from corral import OperationError, ProviderConfig, SessionRef, WorkspaceRef
from corral.provider import (
    CursorExpiredError,
    OpenedWorkspace,
    ProcessInfo,
    ProcessManager,
    ProcessRequest,
    StreamChunk,
    StreamName,
    TerminalSize,
)
from corral_conformance import ConformanceReport, check_provider

pytest.importorskip("corral_local_bash", reason="corral-local-bash is not installed")

PROCESS_RULES = ("process",)
_SMALL = 4096
"""Reads below this size are the ones the resume defects corrupt (the resume rules use them)."""


class _Forward:
    """A process module that forwards everything; each defect overrides one method."""

    leaks_on_close: ClassVar[bool] = False
    """The workspace's close forgets the process module (its processes keep running)."""

    def __init__(self, inner: ProcessManager) -> None:
        self.inner = inner

    async def start(self, request: ProcessRequest) -> ProcessInfo:
        return await self.inner.start(request)

    async def read(
        self,
        process_id: str,
        stream: StreamName = "stdout",
        *,
        cursor: int = 0,
        max_bytes: int = 65536,
        wait_s: float = 0.0,
    ) -> StreamChunk:
        return await self.inner.read(
            process_id, stream, cursor=cursor, max_bytes=max_bytes, wait_s=wait_s
        )

    async def write_stdin(self, process_id: str, data: bytes) -> None:
        await self.inner.write_stdin(process_id, data)

    async def close_stdin(self, process_id: str) -> None:
        await self.inner.close_stdin(process_id)

    async def wait(self, process_id: str, *, timeout_s: float) -> ProcessInfo:
        return await self.inner.wait(process_id, timeout_s=timeout_s)

    async def signal(self, process_id: str, signal: int) -> None:
        await self.inner.signal(process_id, signal)

    async def kill(self, process_id: str) -> ProcessInfo:
        return await self.inner.kill(process_id)

    async def resize(self, process_id: str, size: TerminalSize) -> None:
        await self.inner.resize(process_id, size)

    async def info(self, process_id: str) -> ProcessInfo:
        return await self.inner.info(process_id)

    async def list(self) -> Sequence[ProcessInfo]:
        return await self.inner.list()

    async def remove(self, process_id: str) -> None:
        await self.inner.remove(process_id)


class _DuplicatesOnResume(_Forward):
    """Resuming re-sends the last byte already delivered (an off-by-one in the window index)."""

    async def read(self, process_id: str, stream: StreamName = "stdout", **kw: Any) -> StreamChunk:
        cursor = kw.get("cursor", 0)
        if cursor == 0 or kw.get("max_bytes", 65536) >= _SMALL:
            return await super().read(process_id, stream, **kw)
        chunk = await super().read(process_id, stream, **{**kw, "cursor": cursor - 1})
        return attrs.evolve(chunk, cursor=cursor, next_cursor=cursor + len(chunk.data))


class _SkipsOnResume(_Forward):
    """next_cursor one past the bytes returned: a byte silently skipped per small read."""

    async def read(self, process_id: str, stream: StreamName = "stdout", **kw: Any) -> StreamChunk:
        chunk = await super().read(process_id, stream, **kw)
        if chunk.data and not chunk.ended and kw.get("max_bytes", 65536) < _SMALL:
            return attrs.evolve(chunk, next_cursor=chunk.next_cursor + 1)
        return chunk


class _WrongEarliest(_Forward):
    """The expiry error names the cursor the reader asked for, not the earliest available."""

    async def read(self, process_id: str, stream: StreamName = "stdout", **kw: Any) -> StreamChunk:
        try:
            return await super().read(process_id, stream, **kw)
        except CursorExpiredError:
            raise CursorExpiredError("expired", earliest=kw.get("cursor", 0) + 1) from None


class _LenientEnd(_Forward):
    """A cursor past an ended stream's end reads as an empty, ended chunk."""

    async def read(self, process_id: str, stream: StreamName = "stdout", **kw: Any) -> StreamChunk:
        try:
            return await super().read(process_id, stream, **kw)
        except OperationError as exc:
            cursor = kw.get("cursor", 0)
            if exc.code != "invalid_argument" or cursor < 0:
                raise
            return StreamChunk(b"", cursor, cursor, True)


class _KillLeavesChildren(_Forward):
    """kill reports the process killed but only signals the leader's process group."""

    async def kill(self, process_id: str) -> ProcessInfo:
        info = await self.inner.info(process_id)
        if info.state != "running":
            return info
        return attrs.evolve(info, state="killed")


class _RaisesForMissingPrograms(_Forward):
    """A program that cannot be found is an exception, not exit code 127."""

    async def start(self, request: ProcessRequest) -> ProcessInfo:
        info = await self.inner.start(request)
        info = await self.inner.wait(info.process_id, timeout_s=0.5)
        if info.exit_code == 127:
            raise OperationError("command not found", code="not_found")
        return info


class _SwappedSize(_Forward):
    """Columns and rows swapped on the way to the terminal."""

    async def start(self, request: ProcessRequest) -> ProcessInfo:
        size = request.terminal
        if size is not None:
            request = attrs.evolve(request, terminal=TerminalSize(cols=size.rows, rows=size.cols))
            info = await self.inner.start(request)
            return attrs.evolve(info, terminal=size)
        return await self.inner.start(request)


class _StaleAfterClose(_Forward):
    """After the workspace closed, list() answers from memory instead of saying closed."""

    async def list(self) -> Sequence[ProcessInfo]:
        try:
            return await self.inner.list()
        except OperationError as exc:
            if exc.code != "closed":
                raise
            return []


class _SharedAcrossWorkspaces(_Forward):
    """One process table for the whole provider: ids of other workspaces resolve here too."""

    live: ClassVar[weakref.WeakSet[_SharedAcrossWorkspaces]] = weakref.WeakSet()

    def __init__(self, inner: ProcessManager) -> None:
        super().__init__(inner)
        self.live.add(self)

    async def info(self, process_id: str) -> ProcessInfo:
        try:
            return await self.inner.info(process_id)
        except OperationError as exc:
            if exc.code != "not_found":
                raise
        for other in [m for m in self.live if m is not self]:
            try:
                return await other.inner.info(process_id)
            except OperationError:
                continue
        raise OperationError("no such process", code="not_found")

    async def list(self) -> Sequence[ProcessInfo]:
        out = list(await self.inner.list())
        for other in [m for m in self.live if m is not self]:
            try:
                out += await other.inner.list()
            except OperationError:
                continue
        return out


class _LeavesThemRunning(_Forward):
    """Closing the workspace does not stop its processes (the module is never released)."""

    leaks_on_close = True


_LEAKED: list[Any] = []
"""Workspaces whose close was skipped by a defect; the test closes them for real."""


class _OwnTimeoutWording(_Forward):
    """A timeout reads as killed with a reason of its own wording: streamed results miss it."""

    @staticmethod
    def _reworded(info: ProcessInfo) -> ProcessInfo:
        return attrs.evolve(info, reason="timed out") if info.reason == "timeout" else info

    async def info(self, process_id: str) -> ProcessInfo:
        return self._reworded(await self.inner.info(process_id))

    async def wait(self, process_id: str, *, timeout_s: float) -> ProcessInfo:
        return self._reworded(await self.inner.wait(process_id, timeout_s=timeout_s))

    async def kill(self, process_id: str) -> ProcessInfo:
        return self._reworded(await self.inner.kill(process_id))

    async def list(self) -> Sequence[ProcessInfo]:
        return [self._reworded(i) for i in await self.inner.list()]


def _local_bash() -> Any:
    from corral_local_bash import LocalBashProvider

    class WithProcesses(LocalBashProvider):
        # Until local-bash advertises the module it already builds.
        capabilities = frozenset(LocalBashProvider.capabilities | {"process"})

    return WithProcesses()


class _BrokenProcessProvider:
    """local-bash with its process module wrapped; everything else forwarded."""

    def __init__(self, defect: type[_Forward]) -> None:
        self._inner = _local_bash()
        self._defect = defect

    provider_id = property(lambda self: self._inner.provider_id)
    capabilities = property(lambda self: self._inner.capabilities)
    schema_version = property(lambda self: self._inner.schema_version)

    def _wrap(self, ws: Any) -> corral.provider.ModularWorkspace:
        inner = ws.module("process")
        extra = {"process": self._defect(inner)} if inner is not None else {}

        async def leak() -> None:
            _LEAKED.append(ws)

        return corral.provider.ModularWorkspace(
            ws.id,
            fs=ws.fs,
            shell=ws.shell,
            extra_modules=extra,
            on_close=leak if self._defect.leaks_on_close else ws.close,
            details=ws.details,
        )

    async def open(
        self, config: ProviderConfig, session: SessionRef, declared: frozenset[str] | None = None
    ) -> OpenedWorkspace:
        opened = await self._inner.open(config, session, declared)
        return OpenedWorkspace(workspace=self._wrap(opened.workspace), ref=opened.ref)

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        return self._wrap(await self._inner.resolve(ref))


async def _close_leaked() -> None:
    while _LEAKED:
        await _LEAKED.pop().close()


@functools.cache
def _honest() -> ConformanceReport:
    return check_provider(
        lambda: _BrokenProcessProvider(_Forward), rules=PROCESS_RULES, max_examples=10
    )


_CASES: list[tuple[type[_Forward], tuple[str, ...]]] = [
    (_DuplicatesOnResume, ("process_cursor_reads_are_exact", "process_live_reads_lose_nothing")),
    (_SkipsOnResume, ("process_cursor_reads_are_exact", "process_live_reads_lose_nothing")),
    (_WrongEarliest, ("process_expired_cursor_names_the_earliest",)),
    (_LenientEnd, ("process_reads_past_the_end_are_invalid",)),
    (_KillLeavesChildren, ("process_kill_kills_the_tree",)),
    (_RaisesForMissingPrograms, ("process_exit_codes",)),
    (_SwappedSize, ("process_terminal_echo_and_size",)),
    (_StaleAfterClose, ("process_module_is_closed_after_close",)),
    (_SharedAcrossWorkspaces, ("process_handles_stay_in_their_workspace",)),
    (_OwnTimeoutWording, ("process_timeout_kills_it",)),
    (
        _LeavesThemRunning,
        ("process_closing_the_workspace_kills_them", "process_module_is_closed_after_close"),
    ),
]


@pytest.mark.parametrize(("defect", "intended"), _CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_process_defect_fails_its_rule(defect: type[_Forward], intended: tuple[str, ...]) -> None:
    try:
        report = check_provider(
            lambda: _BrokenProcessProvider(defect),
            rules=PROCESS_RULES,
            shrink=False,
            max_examples=10,
        )
    finally:
        anyio.run(_close_leaked)
    for name in intended:
        result = report.result(name)
        assert result.status == "fail", f"{name} did not catch the defect: {result}"
        assert result.reason, f"{name} failed without a reason"
    failed = {r.rule for r in report.failed}
    already = {r.rule for r in _honest().failed}
    extra = failed - set(intended) - already
    assert not extra, f"expected exactly {sorted(intended)} to fail, also failed: {sorted(extra)}"


def test_the_unbroken_module_passes_every_process_rule() -> None:
    report = _honest()
    assert report.ok, [f"{r.rule}: {r.reason}" for r in report.failed]
    ran = {r.rule for r in report.results if r.status == "pass"}
    assert {name for _, names in _CASES for name in names} <= ran, sorted(ran)


def test_the_wrapper_forwards_faithfully() -> None:
    """The honest wrapper is the module: a start through it is visible to the inner one."""

    async def body() -> None:
        provider = _BrokenProcessProvider(_Forward)
        opened = await provider.open(
            ProviderConfig(provider.provider_id), SessionRef("bites"), frozenset({"process"})
        )
        try:
            manager = opened.workspace.module("process")
            assert isinstance(manager, _Forward)
            info = await manager.start(ProcessRequest("true"))
            assert info.process_id in [p.process_id for p in await manager.inner.list()]
        finally:
            await opened.workspace.close()

    anyio.run(body)
