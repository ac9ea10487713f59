"""Snapshots under bubblewrap keep a change journal, and it stays exact (real sandbox).

The journal is offered here because the sandbox makes its blind spots
checkable: a command cannot hard-link a workspace file to a name outside
the workspace (``EXDEV``), and every command runs in the workspace's cgroup,
whose members are checked for writable shared mappings (whose writes leave
no event). Both are exercised from inside the sandbox.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import corral
from corral.provider import ProcessManager, ProcessRequest
from corral_local_sandbox import LocalSandboxProvider
from corral_posix import TmpdirSnapshotter, _snapshots, _versions

pytestmark = [pytest.mark.bwrap, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the journal is thread-side work: one backend is enough here


class _Provider(LocalSandboxProvider):
    capabilities = LocalSandboxProvider.capabilities | {"process"}


def _fresh_scan(root: str) -> dict[str, tuple[str, int, str]]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        m, _ = _versions.scan(fd, None, None, _versions.Caps(), time.time_ns())
    finally:
        os.close(fd)
    return {m.path(i): (m.kind[i], m.mode[i], m.data[i]) for i in range(len(m))}


def _version(snap: TmpdirSnapshotter, snapshot_id: str) -> dict[str, tuple[str, int, str]]:
    m = snap._manifest(snapshot_id)[0]
    return {m.path(i): (m.kind[i], m.mode[i], m.data[i]) for i in range(len(m))}


async def _run(ws: Any, command: str) -> corral.ExecResult:
    return await ws.shell.run(  # type: ignore[no-any-return]
        corral.provider.CommandRequest(command, allow_shell_syntax=True, timeout_s=30)
    )


async def test_commands_changes_are_recorded_through_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[str] = []
    real_scan, real_apply = _snapshots.scan_changes, _snapshots.apply_changes

    def scan_changes(*a: Any, **k: Any) -> Any:
        out = real_scan(*a, **k)
        used.append("scan")
        return out

    def apply_changes(*a: Any, **k: Any) -> Any:
        out = real_apply(*a, **k)
        used.append("apply")
        return out

    monkeypatch.setattr(_snapshots, "scan_changes", scan_changes)
    monkeypatch.setattr(_snapshots, "apply_changes", apply_changes)
    provider = _Provider(tmpdir_root=str(tmp_path))
    opened = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("j"))
    ws = opened.workspace
    try:
        snap = ws.snapshot
        assert isinstance(snap, TmpdirSnapshotter)
        root = ws.details()["root"]
        made = await _run(ws, "for d in a b c; do mkdir -p $d/deep; echo $d > $d/f; done")
        assert made.exit_code == 0
        base = await snap.snapshot("base")
        steps = [
            "echo changed > b/f",
            "rm -r c; mkdir -p e/x/y && echo new > e/x/y/z",
            "chmod 600 a/f; ln -s ../a b/link; mv a/f a/g",
            "truncate -s 0 b/f; echo >> a/g",
        ]
        for command in steps:
            assert (await _run(ws, command)).exit_code == 0
            info = await snap.snapshot()
            assert _version(snap, info.snapshot_id) == _fresh_scan(root), command
        await snap.restore(base.snapshot_id)
        assert _fresh_scan(root) == _version(snap, base.snapshot_id)
        assert used.count("scan") == len(steps)
        assert used.count("apply") == 1
        # A command cannot give a workspace file a name outside the workspace.
        linked = await _run(ws, "ln a/f /tmp/outside && echo linked; ln a/f $HOME/x; echo done")
        assert "linked" not in linked.stdout
        assert "done" in linked.stdout
    finally:
        await ws.close()


async def test_a_background_process_writing_through_a_mapping_is_not_missed(
    tmp_path: Path,
) -> None:
    provider = _Provider(tmpdir_root=str(tmp_path))
    opened = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("m"))
    ws = opened.workspace
    try:
        snap = ws.snapshot
        pm = ws.module("process")
        assert isinstance(snap, TmpdirSnapshotter)
        assert isinstance(pm, ProcessManager)
        root = ws.details()["root"]
        assert (await _run(ws, "mkdir d && head -c 4096 /dev/zero > d/mapped")).exit_code == 0
        time.sleep(_versions.RACY_NS / 1e9 * 1.5)
        await snap.snapshot()
        program = (
            "import mmap, os, time\n"
            "fd = os.open('d/mapped', os.O_RDWR)\n"
            "m = mmap.mmap(fd, 4096, mmap.MAP_SHARED)\n"
            "os.close(fd)\n"
            "time.sleep(1.1)\n"
            "m[:5] = b'hello'\n"
            "print('written', flush=True)\n"
            "time.sleep(60)\n"
        )
        assert ws.fs is not None
        await ws.fs.write_file("w.py", program.encode())
        time.sleep(_versions.RACY_NS / 1e9 * 1.5)
        await snap.snapshot()
        started = await pm.start(ProcessRequest("python3 w.py"))
        seen, cursor = b"", 0
        while b"written" not in seen:
            chunk = await pm.read(started.process_id, "stdout", cursor=cursor, wait_s=10)
            seen, cursor = seen + chunk.data, chunk.next_cursor
            assert not chunk.ended, seen
        info = await snap.snapshot()
        recorded = _version(snap, info.snapshot_id)
        assert recorded == _fresh_scan(root)
        data = await snap.read_file_at(info.snapshot_id, "/d/mapped")
        assert data[:5] == b"hello"
        await pm.kill(started.process_id)
    finally:
        await ws.close()


def _sibling(name: str) -> ModuleType:
    """Import a test module beside this one (``--import-mode=importlib`` puts none on the path)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_corral_sandbox_journal_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_protect_races = _sibling("test_protect_races")
_process_races = _sibling("test_process_races")
canary = _protect_races.canary  # the fixture: a host directory no command may reach

# Runs inside the sandbox: exchanges the versioned directory "d" with a symlink
# to the host's canary (renameat2 RENAME_EXCHANGE, so "d" is never absent) and
# writes into whatever "d" is, while the host snapshots and restores.
_EXCHANGER = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
end = time.time() + {seconds}
n = 0
while time.time() < end:
    try:
        if not os.path.lexists("l"):
            os.symlink({target!r}, "l")
        libc.renameat2(-100, b"l", -100, b"d", 2)
        n += 1
        if not os.path.islink("d"):
            with open("d/f%d" % (n % 5), "w") as fh:
                fh.write("written by the race %d" % n)
        time.sleep(0.001)
        libc.renameat2(-100, b"l", -100, b"d", 2)
    except OSError:
        time.sleep(0.001)
print("swapped", n, flush=True)
"""


async def test_versions_race_a_directory_swapped_for_a_symlink_from_inside(
    tmp_path: Path, canary: Path
) -> None:
    base = tmp_path / "base"
    provider = _Provider(tmpdir_root=str(base))
    opened = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("r"))
    ws = opened.workspace
    snap, pm, fs = ws.snapshot, ws.module("process"), ws.fs
    assert isinstance(snap, TmpdirSnapshotter)
    assert isinstance(pm, ProcessManager)
    assert fs is not None
    root = str(ws.details()["root"])
    before = _process_races._outside(tmp_path, base)
    rounds = refused = 0
    try:
        for i in range(5):
            await fs.write_file(f"d/f{i}", b"versioned\n")
        script = _EXCHANGER.format(
            seconds=_protect_races.TOGGLE_SECONDS, target=os.path.relpath(canary, root)
        )
        await fs.write_file("x.py", script.encode())  # in the version: restores keep it
        first = await snap.snapshot("first")
        with _process_races._watched(canary) as events:
            info = await pm.start(ProcessRequest("/usr/bin/python3 x.py", timeout_s=60))
            while (await pm.info(info.process_id)).state == "running":
                try:
                    if rounds % 2:
                        await snap.restore(first.snapshot_id)
                    else:
                        await snap.snapshot()
                except corral.OperationError:
                    refused += 1  # "the workspace changed while it was being restored"
                rounds += 1
            await pm.kill(info.process_id)
        out = await pm.read(info.process_id, "stdout", cursor=0, wait_s=5)
        err = await pm.read(info.process_id, "stderr", cursor=0, wait_s=5)
        assert out.data.startswith(b"swapped "), (out.data, err.data, refused, rounds)
        assert int(out.data.split()[1]) > 100, "the race was not really run"
        assert rounds > 50, "the race was not really run"
        assert events == []  # the canary was never opened, read, listed or written
        _protect_races._assert_canary_untouched(canary)
        assert _process_races._outside(tmp_path, base) == before
        # Once the race is over, versions are exact again.
        await snap.restore(first.snapshot_id)
        assert _fresh_scan(root) == _version(snap, first.snapshot_id)
        last = await snap.snapshot()
        assert _version(snap, last.snapshot_id) == _fresh_scan(root)
    finally:
        await ws.close()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("names", "deep"),
    [
        ({"a.txt", "src"}, False),
        ({"a.txt", ".git"}, True),  # a nested repository may have come back
        ({".gitmodules"}, True),
        ({".github"}, True),  # named like one: walked, to be safe
        ({"x.git", "git", "a.gitx"}, False),
        (set(), False),
    ],
)
async def test_a_patch_walks_for_nested_repositories_only_when_a_name_could_be_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: set[str], deep: bool
) -> None:
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path))
    (tmp_path / "ws").mkdir()
    (tmp_path / "state").mkdir()
    isolation = await provider.prepare_isolation(
        str(tmp_path / "ws"), state_dir=str(tmp_path / "state"), capabilities=frozenset({"fs"})
    )
    seen: list[bool] = []

    def spy(root: str, state_dir: str, *, deep: bool = True) -> Any:
        seen.append(deep)

    monkeypatch.setattr(provider, "_checker", spy)
    assert isolation.after_patch is not None
    isolation.after_patch(
        str(tmp_path / "ws"), str(tmp_path / "state"), names | {f"f{i}" for i in range(500)}
    )
    assert seen == [deep]
