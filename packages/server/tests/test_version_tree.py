"""Versions carry the tree, not only file bytes: modes, directories and symlinks (as links).

Real parts: ``corral serve`` with local-bash (its real fs, shell and process
modules); a stop takes a version, a connect materialises a fresh box from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral_server import ApiError
from server_support import TREE_SETUP, Box

pytestmark = pytest.mark.slow

SETUP = TREE_SETUP


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    """A running ``corral serve`` on local-bash."""
    b = Box(tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _run(box: Box, wid: str, command: str) -> str:
    c = box.client
    h = c.exec(wid, command)
    info = c.wait(wid, h["id"], timeout_s=60.0)
    out = b"".join(c.output(wid, h["id"])).decode()
    err = b"".join(c.output(wid, h["id"], stream="stderr")).decode()
    assert info["exit_code"] == 0, (out, err)
    return out


def test_modes_dirs_and_links_round_trip(box: Box) -> None:
    c = box.client
    wid = c.create({"provider": "local-bash", "capabilities": ["fs", "shell", "process"]})["id"]
    _run(box, wid, SETUP)
    version = c.stop(wid)["version_id"]
    assert version is not None

    # Files from the version, no box: types and modes as they were.
    def stat(path: str) -> dict[str, object]:
        return dict(c.stat(wid, path))

    assert (stat("bin/tool")["type"], stat("bin/tool")["mode"]) == ("file", 0o755)
    assert (stat("plain.txt")["type"], stat("plain.txt")["mode"]) == ("file", 0o640)
    assert (stat("private")["type"], stat("private")["mode"]) == ("dir", 0o700)
    assert stat("private/deep/key")["mode"] == 0o600
    for link in ("bin/alias", "bin/up", "host-file", "host-dir", "dangling"):
        assert stat(link)["type"] == "symlink", link
    names = {e["name"]: e["type"] for e in c.ls(wid, "/")}
    assert names["host-file"] == names["host-dir"] == "symlink"
    # A link is never read through: not from the version, and nothing of the host is stored.
    with pytest.raises(ApiError, match="symbolic link"):
        c.read_file(wid, "host-file")
    versions = c.request("GET", f"/v1/workspaces/{wid}/versions")["versions"]
    assert versions[-1]["bytes"] == len(b"#!/bin/sh\necho ran-$1\n") + len(b"secret") + 5
    passwd = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    assert not (box.data / "blobs" / passwd[:2] / passwd[2:]).exists()

    # A fresh box materialised from the version has the same tree.
    out = _run(
        box,
        wid,
        "stat -c '%n %a %F' bin/tool plain.txt private private/deep/key"
        " && readlink bin/alias bin/up host-file host-dir dangling"
        " && bin/alias x && cat bin/up",
    )
    lines = out.splitlines()
    assert lines[:4] == [
        "bin/tool 755 regular file",
        "plain.txt 640 regular file",
        "private 700 directory",
        "private/deep/key 600 regular file",
    ]
    assert lines[4:9] == [
        "tool",
        "../plain.txt",
        "/etc/passwd",
        "../../../../../../../../etc",
        "does/not/exist",
    ]
    assert lines[9:] == ["ran-x", "hello"]
    # ... and a second round trip is a fixed point.
    second = c.stop(wid)["version_id"]
    assert second is not None
    assert second != version
    assert c.stat(wid, "bin/alias")["type"] == "symlink"
    assert c.stat(wid, "bin/tool")["mode"] == 0o755


@pytest.mark.anyio
async def test_links_and_modes_the_box_refuses_are_skipped_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A path that vanished or cannot be changed costs its metadata (logged), not the version."""
    from corral.provider import ProviderConfig, SessionRef
    from corral_local_bash import LocalBashProvider
    from corral_server._linkmodes import apply_modes, make_links, read_links

    opened = await LocalBashProvider(tmpdir_root=str(tmp_path)).open(
        ProviderConfig("local-bash"), SessionRef(session_id="t"), frozenset({"fs", "shell"})
    )
    ws = opened.workspace
    try:
        assert ws.fs is not None
        assert ws.shell is not None
        await ws.fs.write_file("/f", b"x")
        await make_links(ws.shell, [("/l", "f"), ("/no/such/dir/l", "f")])
        assert (await ws.fs.stat("/l")).type == "symlink"
        got = await read_links(ws.shell, ["/l", "/f", "/gone", "/-n"])
        assert got == {"/l": "f"}
        await apply_modes(ws.shell, [("/gone", 0o700), ("/f", 0o4755)])
        assert (await ws.fs.stat("/f")).mode == 0o755  # masked: no setuid planted
    finally:
        await ws.close()
    assert "could not be restored" in caplog.text
    assert "left out" in caplog.text
