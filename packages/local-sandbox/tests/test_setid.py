"""No set-user-ID or set-group-ID file can be left in a workspace on the host.

The sandbox uid maps to the caller's host uid (root in CI), so a set-id file
made inside would be a root setuid binary on the host. The seccomp filter
refuses set-id modes at the syscall; these tests run every usual way of
making one against real bubblewrap and then look at the host side.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral_local_sandbox._quota import measure

pytestmark = [pytest.mark.bwrap, pytest.mark.anyio]

SETUID_BINARIES = ("/usr/bin/su", "/bin/su", "/usr/bin/passwd", "/bin/mount", "/usr/bin/mount")


def _setuid_binary() -> str:
    for path in SETUID_BINARIES:
        if os.path.exists(path) and os.stat(path).st_mode & stat.S_ISUID:
            return path
    pytest.fail("no setuid system binary to copy")


def _setid_on_host(root: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.lstat(path).st_mode & (stat.S_ISUID | stat.S_ISGID):
                found.append(os.path.relpath(path, root))
    return found


def _setuid_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        body = b"#!/bin/sh\nid\n"
        member = tarfile.TarInfo("evil")
        member.size, member.mode = len(body), 0o6755
        tar.addfile(member, io.BytesIO(body))
        folder = tarfile.TarInfo("sgid-dir")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o2775
        tar.addfile(folder)
    return buf.getvalue()


ATTEMPTS = [
    "touch f1 && chmod 4755 f1",
    "touch f2 && chmod u+s f2",
    "mkdir d1 && chmod g+s d1",
    "touch f3 && chmod 2755 f3",
    "install -m 4755 /bin/true f4",
    "python3 -c 'import os; os.open(\"f5\", os.O_CREAT | os.O_WRONLY, 0o4755)'",
    'python3 -c \'import os; os.close(os.open("f6", os.O_CREAT | os.O_WRONLY, 0o755)); '
    'os.chmod("f6", 0o6755)\'',
    "python3 -c 'import os; os.mknod(\"f7\", 0o104755)'",
    "cp -a {setuid} f8",
    "cp -p {setuid} f9",
    "tar -xpf evil.tar",
    "ln {setuid} f10",
]


async def test_no_setid_file_survives_any_attempt(
    open_ws: Any, sh: Callable[..., Any], tmp_path: Path
) -> None:
    setuid = _setuid_binary()
    async with open_ws(limits={"disk_bytes": None}) as ws:  # seccomp alone, no sweep
        assert ws.details()["seccomp"] is True
        await ws.fs.write_file("/evil.tar", _setuid_tar())
        refused = []
        for attempt in ATTEMPTS:
            result = await sh(ws, attempt.format(setuid=setuid))
            refused.append((attempt, result.exit_code, result.stderr))
        assert _setid_on_host(ws.details()["root"]) == []
        # Each attempt failed loudly rather than silently dropping the bit.
        for attempt, code, stderr in refused:
            assert code != 0, attempt
            assert "not permitted" in stderr or "cross-device" in stderr, (attempt, stderr)


async def test_chmod_without_set_id_bits_still_works(open_ws: Any, sh: Callable[..., Any]) -> None:
    async with open_ws() as ws:
        result = await sh(
            ws,
            "touch a && chmod 755 a && chmod +t . && mkdir -m 700 d && "
            "python3 -c 'import os; os.close(os.open(\"b\", os.O_CREAT | os.O_WRONLY, 0o640))' "
            "&& stat -c %a a d b",
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout.split() == ["755", "700", "640"]


def test_the_quota_walk_clears_set_id_bits_left_by_anyone(tmp_path: Path) -> None:
    # Belt and braces: whatever put a set-id file there, the walk after each
    # command clears it -- checking the inode it opened is the one it saw.
    (tmp_path / "deep" / "er").mkdir(parents=True)
    paths = [tmp_path / "a", tmp_path / "deep" / "er" / "b", tmp_path / "deep"]
    for path in paths[:2]:
        path.write_bytes(b"x")
    os.chmod(paths[0], 0o4755)
    os.chmod(paths[1], 0o2711)
    os.chmod(paths[2], 0o2755)
    os.symlink("/usr/bin/su", tmp_path / "link")
    usage = measure(str(tmp_path))
    assert usage.stripped == 3
    assert _setid_on_host(str(tmp_path)) == []
    assert stat.S_IMODE(os.stat(paths[0]).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(paths[1]).st_mode) == 0o711
