"""Per-session statelessness: sessions, provider instances and processes never mix."""

from __future__ import annotations

import functools
import json
import secrets
import sys
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given
from hypothesis import strategies as st

import corral
import corral.provider
from corral import OperationError
from corral.provider import CommandRequest, WorkspaceProvider

from ._compare import Outcome, check_same, model_outcome
from ._harness import Harness, dump_tree
from ._model import FsModel
from ._rules import define, rule
from ._strategies import contents, paths
from ._tests_refs import populated

__all__ = ["AbstractSessionTests"]

_SOURCE = "WorkspaceProvider ('holds no per-session state'); spec 'Per-session state contract'"
R_FILES = define(
    "sessions.files",
    _SOURCE,
    "A session-A write is never a session-B read: files one session makes are invisible in "
    "another, also under interleaved operations, and two sessions get distinct workspace ids "
    "and refs.",
)
R_SHELL_FILES = define(
    "sessions.shell_files",
    _SOURCE,
    "Files one session's commands create are invisible to another's.",
)
R_ENV = define(
    "sessions.environment",
    f"{_SOURCE}; CommandRequest.env",
    "Environment set by one command (export) or given to one request is visible to no later "
    "command, of that session or another.",
)
R_CWD = define(
    "sessions.cwd",
    f"{_SOURCE}; CommandRequest.cwd",
    "A command that changes directory changes it for no later command, of that session or "
    "another: every command without cwd starts at the workspace root.",
)
R_SNAPSHOTS = define(
    "sessions.snapshots",
    _SOURCE,
    "One session's snapshots cannot be listed, restored, branched or deleted from another.",
)
R_FRESH = define(
    "sessions.fresh_instance",
    "spec 'The lifecycle' (resolve after a runtime boundary); WorkspaceProvider",
    "A ref resolves in a fresh provider instance (as after a process restart) to the same "
    "workspace: same id, same modules, same files, and writes through either are seen by the "
    "other.",
)
R_PROCESS = define(
    "sessions.other_process",
    "spec 'The lifecycle' (executor restart); WorkspaceProvider.resolve",
    "A ref resolved in another OS process either re-attaches the same workspace (its files) or "
    "fails with WorkspaceFailedError; never an empty workspace or a crash.",
)
R_CONCURRENT = define(
    "sessions.concurrent",
    "spec 'The same provider instance services every session'",
    "Two sessions on one provider instance run concurrently without seeing or disturbing each "
    "other.",
)
R_STATELESS = define(
    "sessions.provider_stateless",
    _SOURCE,
    "The provider instance holds no per-session state: opening sessions does not grow what "
    "the provider object holds.",
)


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
    """Two sessions, provider instances or processes never see each other's state."""

    @rule(R_FILES)
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

    @rule(R_FILES)
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

    @rule(R_SHELL_FILES)
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

    @rule(R_SNAPSHOTS)
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
                with pytest.raises(OperationError) as caught:
                    await h.call(op, info.snapshot_id)
                assert caught.value.code == "not_found", (
                    f"session b's {op.__name__} of session a's snapshot: code "
                    f"{caught.value.code!r}, expected 'not_found' (to b it does not exist)"
                )
            still = [s.snapshot_id for s in await h.call(snap_a.list)]
            assert info.snapshot_id in still, "session b deleted session a's snapshot"

    @rule(R_ENV)
    @pytest.mark.anyio
    async def test_sessions_do_not_share_environment(self, conformance: Harness) -> None:
        """``export`` and ``CommandRequest.env`` last for one command only."""
        h = conformance
        h.require("shell")
        var, given_var = (
            f"CORRAL_LEAK_{secrets.token_hex(3)}",
            f"CORRAL_GIVEN_{secrets.token_hex(3)}",
        )
        probe = f'echo "[${{{var}-unset}}][${{{given_var}-unset}}]"'
        async with h.session("shell") as a, h.session("shell") as b:
            sa, sb = a.workspace.shell, b.workspace.shell
            assert sa is not None
            assert sb is not None
            set_it = await h.call(sa.run, _shell_request(f"export {var}=exported; echo ok"))
            assert set_it.exit_code == 0, f"export failed: {set_it!r}"
            env_run = await h.call(
                sa.run,
                CommandRequest(
                    f'echo "[${{{given_var}-unset}}]"',
                    timeout_s=30,
                    allow_shell_syntax=True,
                    env={given_var: "given"},
                ),
            )
            assert env_run.stdout.strip() == "[given]", (
                f"env given to the request is not visible to it: {env_run.stdout!r}"
            )
            for who, shell in (("the same session", sa), ("another session", sb)):
                seen = await h.call(shell.run, _shell_request(probe))
                assert seen.stdout.strip() == "[unset][unset]", (
                    f"environment of an earlier command leaks into {who}: {seen.stdout.strip()!r}"
                )

    @rule(R_CWD)
    @pytest.mark.anyio
    async def test_sessions_do_not_share_cwd(self, conformance: Harness) -> None:
        """``cd`` and ``CommandRequest.cwd`` change the directory of one command only."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as a, h.session("shell") as b:
            sa, sb = a.workspace.shell, b.workspace.shell
            assert sa is not None
            assert sb is not None
            home_a = (await h.call(sa.run, _shell_request("pwd"))).stdout
            home_b = (await h.call(sb.run, _shell_request("pwd"))).stdout
            moved = await h.call(sa.run, _shell_request("mkdir -p sub && cd sub && pwd"))
            assert moved.exit_code == 0, f"mkdir/cd failed: {moved!r}"
            assert moved.stdout != home_a, "cd did not change the directory"
            there = await h.call(
                sa.run, CommandRequest("pwd", timeout_s=30, allow_shell_syntax=True, cwd="/sub")
            )
            assert there.exit_code == 0, f"a command with cwd=/sub failed: {there!r}"
            after_a = (await h.call(sa.run, _shell_request("pwd"))).stdout
            after_b = (await h.call(sb.run, _shell_request("pwd"))).stdout
            assert after_a == home_a, "a later command of the same session starts in the old cwd"
            assert after_b == home_b, "another session's command starts in a changed cwd"

    @rule(R_FRESH)
    @pytest.mark.anyio
    async def test_ref_resolves_in_a_fresh_provider_instance(self, conformance: Harness) -> None:
        """Resolve works in a new provider instance, both ways, as after a restart."""
        h = conformance
        if h.factory is None:
            pytest.skip("no provider factory (override the provider_factory fixture)")
        fresh = h.factory()
        for opener, resolver, names in (
            (h.provider, fresh, "old->new"),
            (fresh, h.provider, "new->old"),
        ):
            session = corral.SessionRef(f"conformance-{secrets.token_hex(6)}")
            opened = await h.call(opener.open, h.config(), session, None)
            try:
                ws = opened.workspace
                if ws.fs is not None:
                    await h.call(ws.fs.write_file, "/restart.txt", b"before")
                again = await h.resolve(
                    corral.ref_from_json(corral.ref_to_json(opened.ref)), provider=resolver
                )
                assert again.id == ws.id, f"{names}: resolve gave another workspace id"
                assert populated(h, again) == populated(h, ws), (
                    f"{names}: resolve populated {sorted(populated(h, again))}, open "
                    f"{sorted(populated(h, ws))}"
                )
                if ws.fs is not None and again.fs is not None:
                    got = await h.call(again.fs.read_file, "/restart.txt")
                    assert got == b"before", f"{names}: the resolved workspace lost its files"
                    await h.call(again.fs.write_file, "/after.txt", b"after")
                    assert await h.call(ws.fs.read_file, "/after.txt") == b"after", (
                        f"{names}: a write through the resolved workspace is not seen"
                    )
                if ws.snapshot is not None and again.snapshot is not None:
                    info = await h.call(ws.snapshot.snapshot, "before-restart")
                    listed = [s.snapshot_id for s in await h.call(again.snapshot.list)]
                    assert info.snapshot_id in listed, f"{names}: snapshots lost across instances"
            finally:
                await h.call(opened.workspace.close)
                await h.release()

    @rule(R_PROCESS)
    @pytest.mark.anyio
    async def test_ref_resolves_in_another_process(self, conformance: Harness) -> None:
        """Another process, loading the provider by its entry point, resolves the ref cleanly."""
        h = conformance
        if h.entry_point is None:
            pytest.skip("the provider was given directly, not loaded through a plugin")
        kind, options = h.entry_point
        async with h.session(declared=h.advertised) as opened:
            fs = opened.workspace.fs
            if fs is not None:
                await h.call(fs.write_file, "/from-parent.txt", b"parent")
            job = json.dumps(
                {"kind": kind, "options": dict(options), "ref": corral.ref_to_json(opened.ref)}
            )
            with anyio.fail_after(h.op_timeout_s * 2):
                run = await anyio.run_process(
                    [sys.executable, "-c", _CHILD], input=job.encode(), check=False
                )
            lines = run.stdout.decode(errors="replace").strip().splitlines()
            assert run.returncode == 0, (
                f"the child process crashed (exit {run.returncode}): "
                f"{run.stderr.decode(errors='replace')[-1500:]}"
            )
            assert lines, "the child process printed nothing"
            out = json.loads(lines[-1])
            assert out["outcome"] in ("failed", "resolved"), (
                f"resolve in another process raised {out.get('error')}, not WorkspaceFailedError"
            )
            if out["outcome"] == "failed":
                return
            assert out["id"] == opened.workspace.id, "another process resolved another workspace id"
            if fs is not None:
                assert out.get("content") == "parent", (
                    "another process resolved the ref to a workspace without its files"
                )
                assert await h.call(fs.read_file, "/from-child.txt") == b"child", (
                    "a write from another process is not seen by the live workspace"
                )

    @rule(R_CONCURRENT)
    @pytest.mark.anyio
    async def test_sessions_run_concurrently(self, conformance: Harness) -> None:
        """Two sessions driven at once, from one provider instance, stay apart."""
        h = conformance
        async with h.session(declared=h.advertised) as a, h.session(declared=h.advertised) as b:
            errors: list[str] = []

            async def drive(name: str, ws: corral.provider.Workspace) -> None:
                for i in range(6):
                    data = f"{name}{i}".encode()
                    if ws.fs is not None:
                        await h.call(ws.fs.write_file, f"/{name}/f{i}.txt", data)
                        got = await h.call(ws.fs.read_file, f"/{name}/f{i}.txt")
                        if got != data:
                            errors.append(f"session {name} read {got!r} back, wrote {data!r}")
                    if ws.shell is not None and i % 3 == 0:
                        run = await h.call(
                            ws.shell.run, _shell_request(f"echo {name}{i} > s{i}; cat s{i}")
                        )
                        if run.stdout.strip() != f"{name}{i}":
                            errors.append(f"session {name}'s shell saw {run.stdout.strip()!r}")
                    await anyio.lowlevel.checkpoint()

            async with anyio.create_task_group() as tg:
                tg.start_soon(drive, "a", a.workspace)
                tg.start_soon(drive, "b", b.workspace)
            assert not errors, "; ".join(errors)
            for name, other, ws in (("a", "b", a.workspace), ("b", "a", b.workspace)):
                if ws.fs is not None:
                    tree = await h.call(dump_tree, ws.fs)
                    assert not any(p.startswith(f"/{other}") for p in tree), (
                        f"session {name} sees session {other}'s files after concurrent work"
                    )
                    assert len([p for p in tree if p.startswith(f"/{name}/")]) == 6, (
                        f"session {name} lost files written concurrently"
                    )

    @rule(R_STATELESS)
    @pytest.mark.anyio
    async def test_provider_holds_no_session_state(self, conformance: Harness) -> None:
        """What the provider object holds does not grow with open sessions."""
        h = conformance
        async with h.session(declared=h.advertised):
            pass  # warm up lazy, process-wide setup
        before = _footprint(h.provider)
        opened = [await h.open(h.advertised) for _ in range(4)]
        try:
            during = _footprint(h.provider)
        finally:
            for o in opened:
                await h.call(o.workspace.close)
        after = _footprint(h.provider)
        assert during == before, (
            f"the provider object grew by {during - before} entries while 4 sessions were open: "
            "per-session state lives on the provider instance"
        )
        assert after == before, (
            f"the provider object holds {after - before} more entries after 4 sessions closed"
        )


_CHILD = """
import json, sys, anyio, corral
job = json.loads(sys.stdin.read())
async def main():
    provider = corral.load_plugins().provider(job["kind"]).create(job["options"])
    try:
        ws = await provider.resolve(corral.ref_from_json(job["ref"]))
    except corral.WorkspaceFailedError:
        return {"outcome": "failed"}
    except Exception as exc:
        return {"outcome": "crashed", "error": type(exc).__name__}
    out = {"outcome": "resolved", "id": ws.id}
    if ws.fs is not None:
        try:
            out["content"] = (await ws.fs.read_file("/from-parent.txt")).decode()
        except corral.OperationError as exc:
            out["content"] = None
        await ws.fs.write_file("/from-child.txt", b"child")
    return out
print(json.dumps(anyio.run(main)))
"""


def _footprint(provider: WorkspaceProvider) -> int:
    """Entries in the containers a provider instance reaches (two levels deep)."""
    seen: set[int] = set()

    def size(obj: Any, depth: int) -> int:
        if id(obj) in seen or depth > 2:
            return 0
        seen.add(id(obj))
        total = 0
        if isinstance(obj, dict | list | set | frozenset | tuple):
            total += len(obj)
            items = obj.values() if isinstance(obj, dict) else obj
            return total + sum(size(v, depth + 1) for v in list(items)[:1000])
        attrs_ = getattr(obj, "__dict__", None)
        if isinstance(attrs_, dict) and not isinstance(obj, type):
            total += sum(size(v, depth + 1) for v in list(attrs_.values()))
        for slot in getattr(type(obj), "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                total += size(getattr(obj, slot), depth + 1)
        return total

    return size(provider, 0)
