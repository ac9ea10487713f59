"""The workspace lifecycle: close is idempotent, final, and releases the data."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import corral
import corral.capability
from corral import OperationError, WorkspaceFailedError
from corral._errors import ERROR_CODES
from corral.provider import CommandRequest, Workspace

from ._harness import Harness
from ._rules import define, rule

__all__ = ["AbstractLifecycleTests", "module_calls"]

R_IDEMPOTENT = define(
    "lifecycle.close.idempotent",
    "Workspace.close",
    "close() releases the workspace and its data. Idempotent: closing twice, or twice at "
    "once, is harmless.",
)
R_CLOSED = define(
    "lifecycle.close.final",
    "Workspace.close; corral._errors (code 'closed')",
    "After close, every method of every populated module fails with OperationError(code='closed').",
)
R_RESOLVE_GONE = define(
    "lifecycle.close.resolve_gone",
    "WorkspaceProvider.resolve ('its workspace is gone'); core README ('never opens a fresh, "
    "empty workspace')",
    "Resolving the ref of a closed workspace, in the same or a fresh provider instance, is a "
    "WorkspaceFailedError, never a fresh empty workspace or another exception.",
)
R_DATA_GONE = define(
    "lifecycle.close.data_released",
    "Workspace.close ('Release the workspace and its data')",
    "After close the workspace's data is gone from every host location that held it.",
)
R_OTHERS = define(
    "lifecycle.close.isolated",
    "WorkspaceProvider (no per-session state); Workspace.close",
    "Closing one session's workspace leaves every other session's workspace, its files and its "
    "ref intact.",
)
R_CODES = define(
    "errors.operation.codes",
    "corral._errors.OperationError",
    "Module methods report failures as OperationError with a code from ErrorCode.",
)


_ENGINE = corral.RegexModuleEngine()


def _shell_request(command: str) -> CommandRequest:
    return CommandRequest(command, timeout_s=30, allow_shell_syntax=True)


def module_calls(ws: Workspace) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    """One call of every method of every populated built-in module."""
    calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
    fs, shell, snap, code = ws.fs, ws.shell, ws.snapshot, ws.code
    if fs is not None:
        calls += [
            ("fs.read_file", lambda: fs.read_file("/kept.txt")),
            ("fs.write_file", lambda: fs.write_file("/x", b"x")),
            ("fs.edit_file", lambda: fs.edit_file("/kept.txt", "kept", "lost")),
            ("fs.ls", lambda: fs.ls("/")),
            ("fs.glob", lambda: fs.glob("*")),
            (
                "fs.grep",
                lambda: fs.grep(_ENGINE.compile("kept"), corral.capability.GrepOptions(path="/")),
            ),
            ("fs.stat", lambda: fs.stat("/kept.txt")),
            ("fs.mkdir", lambda: fs.mkdir("/d")),
            ("fs.rm", lambda: fs.rm("/kept.txt")),
        ]
    if shell is not None:
        calls.append(("shell.run", lambda: shell.run(_shell_request("true"))))
    if snap is not None:
        calls += [
            ("snapshot.snapshot", lambda: snap.snapshot("after-close")),
            ("snapshot.list", snap.list),
            ("snapshot.restore", lambda: snap.restore("s")),
            ("snapshot.delete", lambda: snap.delete("s")),
            ("snapshot.branch", lambda: snap.branch("s")),
        ]
    if code is not None:
        lang = sorted(code.languages)[0] if code.languages else "python"
        calls += [
            ("code.run_code", lambda: code.run_code(lang, "1", timeout_s=10)),
            ("code.create_context", lambda: code.create_context(lang)),
        ]
    return calls


def _check_closed(exc: OperationError, what: str) -> None:
    assert exc.code in ERROR_CODES, f"{what}: code {exc.code!r} is not an ErrorCode"
    assert exc.code == "closed", f"{what}: code {exc.code!r}, expected 'closed'"


class AbstractLifecycleTests:
    """Close is idempotent and final, and it releases the data."""

    @rule(R_IDEMPOTENT)
    @pytest.mark.anyio
    async def test_close_is_idempotent(self, conformance: Harness) -> None:
        """Closing twice, and concurrently, is harmless."""
        h = conformance
        opened = await h.open(h.advertised)
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.call, opened.workspace.close)
            tg.start_soon(h.call, opened.workspace.close)
        await h.call(opened.workspace.close)

    @rule(R_CLOSED, R_CODES)
    @pytest.mark.anyio
    async def test_operations_after_close_fail_cleanly(self, conformance: Harness) -> None:
        """Every method of every module refuses work after close with code ``closed``."""
        h = conformance
        opened = await h.open(h.advertised)
        ws = opened.workspace
        if ws.fs is not None:
            await h.call(ws.fs.write_file, "/kept.txt", b"kept")
        await h.call(ws.close)
        for what, call in module_calls(ws):
            try:
                await h.call(call)
            except OperationError as exc:
                _check_closed(exc, f"{what} after close")
                continue
            except Exception as exc:
                raise AssertionError(
                    f"{what} after close raised {type(exc).__name__}, not "
                    "OperationError(code='closed')"
                ) from exc
            raise AssertionError(f"{what} after close succeeded")

    @rule(R_RESOLVE_GONE)
    @pytest.mark.anyio
    async def test_resolve_after_close_reports_gone(self, conformance: Harness) -> None:
        """A closed workspace cannot be resolved back, not even by a fresh instance."""
        h = conformance
        providers = [("this provider", h.provider)]
        if h.factory is not None:
            providers.append(("a fresh provider instance", h.factory()))
        for declared in (h.advertised, None):
            opened = await h.open(declared)
            if opened.workspace.fs is not None:
                await h.call(opened.workspace.fs.write_file, "/doomed.txt", b"x")
            await h.call(opened.workspace.close)
            for who, provider in providers:
                try:
                    await h.resolve(opened.ref, provider=provider)
                except WorkspaceFailedError:
                    continue
                except Exception as exc:
                    raise AssertionError(
                        f"resolve of a closed workspace by {who} raised {type(exc).__name__}, "
                        "not WorkspaceFailedError"
                    ) from exc
                raise AssertionError(
                    f"{who} resolved the ref of a closed workspace instead of refusing it"
                )

    @rule(R_DATA_GONE)
    @pytest.mark.anyio
    async def test_close_releases_the_data(self, conformance: Harness) -> None:
        """Nothing reads the data back after close, and its host paths are gone.

        A second handle, resolved before close, must not read the file back
        (any refusal will do), and the paths ``workspace_data_paths`` names
        must no longer exist.
        """
        h = conformance
        opened = await h.open(h.advertised)
        ws = opened.workspace
        other: Workspace | None = None
        try:
            if ws.fs is not None:
                await h.call(ws.fs.write_file, "/data/kept.txt", b"kept")
                other = await h.resolve(opened.ref)
            if ws.snapshot is not None:
                await h.call(ws.snapshot.snapshot, "before-close")
            where = [Path(p) for p in h.data_paths(ws)]
        finally:
            await h.call(ws.close)
        if other is not None and other.fs is not None:
            try:
                back = await h.call(other.fs.read_file, "/data/kept.txt")
            except (OperationError, corral.WorkspaceError):
                back = None
            await h.release()
            assert back != b"kept", "a handle resolved before close still reads the data"
        if not where:
            if other is None:
                pytest.skip("no fs and no inspectable data location (workspace_data_paths)")
            return
        left = [p for p in where if p.exists() or p.is_symlink()]
        assert not left, f"{len(left)} of the workspace's data paths survive close"

    @rule(R_OTHERS)
    @pytest.mark.anyio
    async def test_closing_one_session_leaves_the_other(self, conformance: Harness) -> None:
        """Closing a workspace does not disturb another session's workspace."""
        h = conformance
        async with h.session(declared=h.advertised) as b:
            a = await h.open(h.advertised)
            if b.workspace.fs is not None:
                await h.call(b.workspace.fs.write_file, "/kept.txt", b"kept")
            if a.workspace.fs is not None:
                await h.call(a.workspace.fs.write_file, "/kept.txt", b"gone")
            await h.call(a.workspace.close)
            # The live handle first: resolving while it lives may legitimately
            # replace its backing resource (a container), evicting the live one.
            for how in ("live", "resolved"):
                ws = b.workspace if how == "live" else await h.resolve(b.ref)
                if ws.fs is not None:
                    got = await h.call(ws.fs.read_file, "/kept.txt")
                    assert got == b"kept", f"the other session's {how} workspace lost its file"
                if ws.shell is not None:
                    run = await h.call(ws.shell.run, _shell_request("true"))
                    assert run.exit_code == 0, f"the other session's {how} shell broke: {run!r}"
                if ws.snapshot is not None:
                    await h.call(ws.snapshot.list)
