"""Rules 1 and 10: per-session statelessness and the workspace lifecycle."""

from __future__ import annotations

import functools
import secrets
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral import CommandRequest, OperationError, WorkspaceFailedError

from ._compare import Outcome, check_same, model_outcome
from ._harness import Harness, dump_tree
from ._model import FsModel
from ._strategies import contents, paths

__all__ = ["AbstractLifecycleTests", "AbstractSessionTests"]


def _shell_request(command: str) -> CommandRequest:
    return CommandRequest(command, timeout_s=30, allow_shell_syntax=True)


_fs_steps = st.lists(
    st.tuples(
        st.integers(0, 1),
        st.sampled_from(("write_file", "mkdir", "rm")),
        paths(max_depth=2),
        contents,
    ),
    max_size=12,
)


class AbstractSessionTests:
    """Rule 1 (C10): two sessions on one provider instance never see each other."""

    @pytest.mark.anyio
    async def test_sessions_do_not_share_files(self, conformance: Harness) -> None:
        """Files written in one session are invisible in another."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as a, h.session("fs") as b:
            assert a.workspace.fs is not None
            assert b.workspace.fs is not None
            assert a.workspace.id != b.workspace.id, "two sessions got the same workspace id"
            assert a.ref != b.ref, "two sessions got the same ref"
            await h.call(a.workspace.fs.write_file, "/only-a.txt", b"a")
            await h.call(b.workspace.fs.mkdir, "/only-b")
            assert await h.call(dump_tree, a.workspace.fs) == {"/only-a.txt": b"a"}
            assert await h.call(dump_tree, b.workspace.fs) == {"/only-b": None}

    @pytest.mark.anyio
    async def test_interleaved_sessions_stay_isolated(self, conformance: Harness) -> None:
        """Interleaved random operations on two sessions each match their own model."""
        h = conformance
        h.require("fs")

        @h.settings()
        @given(_fs_steps)
        def interleaved(steps: list[tuple[int, str, str, bytes]]) -> None:
            h.blocking(self._interleave, h, steps)

        await h.in_thread(interleaved)

    async def _interleave(self, h: Harness, steps: list[tuple[int, str, str, bytes]]) -> None:
        async with h.session("fs") as a, h.session("fs") as b:
            pairs = [(a.workspace.fs, FsModel()), (b.workspace.fs, FsModel())]
            for who, op, path, data in steps:
                fs, model = pairs[who]
                assert fs is not None
                args: tuple[Any, ...] = (path, data) if op == "write_file" else (path,)
                kwargs = {"parents": True} if op == "mkdir" else {}
                kwargs = {"recursive": True} if op == "rm" else kwargs
                want = model_outcome(functools.partial(getattr(model, op), *args, **kwargs))
                try:
                    got = Outcome(value=await h.call(getattr(fs, op), *args, **kwargs))
                except OperationError as exc:
                    got = Outcome(error=exc)
                check_same(f"session {'ab'[who]}: {op}{args!r}", got, want)
            for name, (fs, model) in zip("ab", pairs, strict=True):
                assert fs is not None
                seen = await h.call(dump_tree, fs)
                assert seen == model.dump(), (
                    f"session {name} sees {seen!r}, expected {model.dump()!r}"
                )

    @pytest.mark.anyio
    async def test_sessions_do_not_share_shell_state(self, conformance: Harness) -> None:
        """Files a command creates in one session are invisible to another's commands."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as a, h.session("shell") as b:
            assert a.workspace.shell is not None
            assert b.workspace.shell is not None
            marker = f"marker-{secrets.token_hex(4)}"
            made = await h.call(a.workspace.shell.run, _shell_request(f"echo x > {marker}"))
            assert made.exit_code == 0, f"could not create a file with the shell: {made!r}"
            seen = await h.call(b.workspace.shell.run, _shell_request("ls -a"))
            assert seen.exit_code == 0, f"ls failed: {seen!r}"
            assert marker not in seen.stdout, "session b sees a file session a's shell created"
            own = await h.call(a.workspace.shell.run, _shell_request("ls -a"))
            assert marker in own.stdout, "session a does not see its own file"

    @pytest.mark.anyio
    async def test_sessions_do_not_share_snapshots(self, conformance: Harness) -> None:
        """One session's snapshots cannot be listed, restored or deleted from another."""
        h = conformance
        h.require("snapshot")
        async with h.session("snapshot") as a, h.session("snapshot") as b:
            snap_a, snap_b = a.workspace.snapshot, b.workspace.snapshot
            assert snap_a is not None
            assert snap_b is not None
            info = await h.call(snap_a.snapshot, "from-a")
            listed = [s.snapshot_id for s in await h.call(snap_b.list)]
            assert info.snapshot_id not in listed, "session b lists session a's snapshot"
            for op in (snap_b.restore, snap_b.delete, snap_b.branch):
                with pytest.raises(OperationError):
                    await h.call(op, info.snapshot_id)
            still = [s.snapshot_id for s in await h.call(snap_a.list)]
            assert info.snapshot_id in still, "session b deleted session a's snapshot"

    @pytest.mark.anyio
    async def test_closing_one_session_leaves_the_other(self, conformance: Harness) -> None:
        """Closing a workspace does not disturb another session's workspace."""
        h = conformance
        async with h.session(declared=h.advertised) as b:
            a = await h.open(h.advertised)
            if a.workspace.fs is not None and b.workspace.fs is not None:
                await h.call(b.workspace.fs.write_file, "/kept.txt", b"kept")
            await h.call(a.workspace.close)
            await h.call(h.provider.resolve, b.ref)
            if b.workspace.fs is not None:
                assert await h.call(b.workspace.fs.read_file, "/kept.txt") == b"kept"


class AbstractLifecycleTests:
    """Rule 10: close is idempotent and final."""

    @pytest.mark.anyio
    async def test_close_is_idempotent(self, conformance: Harness) -> None:
        """Closing twice, and concurrently, is harmless."""
        h = conformance
        opened = await h.open(h.advertised)
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.call, opened.workspace.close)
            tg.start_soon(h.call, opened.workspace.close)
        await h.call(opened.workspace.close)

    @pytest.mark.anyio
    async def test_operations_after_close_fail_cleanly(self, conformance: Harness) -> None:
        """Every module refuses work after close with ``OperationError(code="closed")``."""
        h = conformance
        opened = await h.open(h.advertised)
        ws = opened.workspace
        await h.call(ws.close)
        calls: list[tuple[str, Any]] = []
        fs, shell, snap = ws.fs, ws.shell, ws.snapshot
        if fs is not None:
            calls += [
                ("fs.read_file", lambda: fs.read_file("/x")),
                ("fs.write_file", lambda: fs.write_file("/x", b"x")),
                ("fs.ls", lambda: fs.ls("/")),
            ]
        if shell is not None:
            calls.append(("shell.run", lambda: shell.run(_shell_request("true"))))
        if snap is not None:
            calls += [("snapshot.snapshot", snap.snapshot), ("snapshot.list", snap.list)]
        for what, call in calls:
            with pytest.raises(OperationError) as caught:
                await h.call(call)
            assert caught.value.code == "closed", (
                f"{what} after close: code {caught.value.code!r}, expected 'closed'"
            )

    @pytest.mark.anyio
    async def test_resolve_after_close_reports_gone(self, conformance: Harness) -> None:
        """A closed workspace cannot be resolved back as an empty one."""
        h = conformance
        opened = await h.open(h.advertised)
        if opened.workspace.fs is not None:
            await h.call(opened.workspace.fs.write_file, "/doomed.txt", b"x")
        await h.call(opened.workspace.close)
        with pytest.raises(WorkspaceFailedError):
            await h.call(h.provider.resolve, opened.ref)
