"""A background process races the host-side checks and file tools (real bubblewrap).

A process started through the ``process`` module has no "after the command"
check until it ends: while it runs, the provider checks the protected paths
every couple of seconds, and the file tools run whenever the agent calls
them. Here such a process flips ``.git`` between a directory and a symlink
to a host directory (the canary of ``test_protect_races.py``) in a tight
loop while both happen; the canary must never be opened, read or written by
anyone, and nothing outside the workspace may change.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import importlib.util
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import anyio
import pytest

import corral
from corral.provider import ProcessManager, ProcessRequest
from corral_local_sandbox import LocalSandboxProvider

pytestmark = [pytest.mark.bwrap, pytest.mark.anyio]


def _sibling(name: str) -> ModuleType:
    """Import a test module beside this one (``--import-mode=importlib`` puts none on the path)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_corral_sandbox_tests_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_races = _sibling("test_protect_races")
canary = _races.canary  # the fixture: a host directory no command may reach
anyio_backend = _races.anyio_backend  # seconds of racing: one backend is enough

_ROUNDS = 3000
# Runs inside the sandbox, started as a background process: swaps ".git" (a
# directory, whatever the file tools put in it) with a relative symlink to
# the host's canary atomically (renameat2 RENAME_EXCHANGE), so no check ever
# sees it absent, and puts back whatever a check moved out.
SWAPPER = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
def swap():
    if libc.renameat2(-100, b"l", -100, b".git", 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
        raise OSError(ctypes.get_errno(), "renameat2")
end = time.time() + {seconds}
moved = 0
while time.time() < end:
    try:
        if not os.path.lexists(".git"):
            os.mkdir(".git")
        if os.path.lexists("l") and not os.path.islink("l"):
            moved += 1
            os.rename("l", "old-%d" % moved)
        if not os.path.lexists("l"):
            os.symlink({target!r}, "l")
        swap(); time.sleep(0.002); swap(); time.sleep(0.002)
    except OSError:
        time.sleep(0.001)
"""
_IN_ALL_EVENTS = 0xFFF  # access, modify, attrib, close, open, moves, create, delete, self
_EVENT = struct.Struct("iIII")


class ProcSandbox(LocalSandboxProvider):
    """local-sandbox with the ``process`` module (registered by core later)."""

    capabilities: ClassVar[frozenset[str]] = LocalSandboxProvider.capabilities | {"process"}


@contextlib.contextmanager
def _watched(directory: Path) -> Iterator[list[str]]:
    """Every inotify event on ``directory`` and its entries while the block runs.

    An open, a read or a listing counts as much as a write: the canary is not
    reachable from inside the sandbox, so any event at all is the host side
    following a symlink a sandboxed process planted.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        pytest.fail(f"inotify_init1: {os.strerror(ctypes.get_errno())}")
    events: list[str] = []
    try:
        if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_ALL_EVENTS) < 0:
            pytest.fail(f"inotify_add_watch: {os.strerror(ctypes.get_errno())}")
        yield events
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                raise
            offset = 0
            while offset < len(data):
                _wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                start = offset + _EVENT.size
                name = data[start : start + size].rstrip(b"\0").decode(errors="replace")
                events.append(f"{mask:#x} {name or '.'}")
                offset = start + size
    finally:
        os.close(fd)


def _outside(tmp_path: Path, workspaces: Path) -> dict[str, tuple[int, int, str]]:
    """Type, mode and content hash of everything under ``tmp_path`` but the provider's base."""
    seen: dict[str, tuple[int, int, str]] = {}
    for top, dirs, files in os.walk(tmp_path):
        if Path(top) == workspaces.parent:
            dirs[:] = [d for d in dirs if Path(top, d) != workspaces]
        for name in [*dirs, *files]:
            path = Path(top, name)
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            seen[str(path.relative_to(tmp_path))] = (st.st_mode, st.st_size, digest)
    return seen


async def _file_tools(fs: Any, step: int) -> list[bytes]:
    """One round of host-side file tools under ``.git`` and elsewhere; what they returned."""
    got: list[bytes] = []
    calls = [
        lambda: fs.read_file(".git/config"),
        lambda: fs.read_file(".git/secret"),
        lambda: fs.write_file(".git/pwned", b"written through the race\n"),
        lambda: fs.write_file(".git/config", b"[core]\n\tfsmonitor = evil\n"),
        lambda: fs.edit_file(".git/config", "the host", "the sandbox"),
        lambda: fs.ls(".git"),
        lambda: fs.stat(".git/secret"),
        lambda: fs.write_file(f"notes/{step % 7}.txt", b"ordinary\n"),
        lambda: fs.read_file(f"notes/{step % 7}.txt"),
    ]
    for call in calls:
        try:
            result = await call()
        except corral.OperationError:
            continue  # refused or raced away: either is fine, a leak is not
        got.append(repr(result).encode() if not isinstance(result, bytes) else result)
    return got


async def test_background_git_toggler_never_reaches_the_host(tmp_path: Path, canary: Path) -> None:
    base = tmp_path / "base"
    provider = ProcSandbox(tmpdir_root=str(base))
    opened = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("r"))
    ws = opened.workspace
    fs: Any = ws.fs
    pm = ws.module("process")
    assert isinstance(pm, ProcessManager)
    root = Path(str(ws.details()["root"]))
    before = _outside(tmp_path, base)
    returned: list[bytes] = []
    rounds = 0
    try:
        script = SWAPPER.format(seconds=_races.TOGGLE_SECONDS, target=os.path.relpath(canary, root))
        await fs.write_file("swap.py", script.encode())
        with _watched(canary) as events:
            info = await pm.start(ProcessRequest("/usr/bin/python3 swap.py", timeout_s=60))
            # Until it ends by itself: the periodic check runs a few times meanwhile.
            while rounds < _ROUNDS and (await pm.info(info.process_id)).state == "running":
                returned += await _file_tools(fs, rounds)
                rounds += 1
                await anyio.sleep(0.002)
            final = await pm.kill(info.process_id)
        assert rounds > 20, "the race was not really run"
        assert final.state in ("exited", "killed")
        assert events == []  # the canary was never opened, read, listed or written
        leaks = [r for r in returned if _races.SECRET.encode() in r or b"host's own" in r]
        assert leaks == []
        _races._assert_canary_untouched(canary)
        assert _outside(tmp_path, base) == before
    finally:
        await ws.close()
