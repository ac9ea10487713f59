"""``corral serve`` (zero setup) and ``corral ws`` verbs, as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import corral
from corral_server import SandboxDefinition
from server_support import ServerProcess

pytestmark = pytest.mark.slow


class _Done:
    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = code, stdout, stderr


def _ws(data: Path, url: str, *args: str, ok: bool = True) -> _Done:
    """``corral ws --data DATA ARGS`` in this process (no interpreter start per verb)."""
    import contextlib
    import io

    from corral._cli import main

    out, err = io.TextIOWrapper(io.BytesIO()), io.TextIOWrapper(io.BytesIO())
    old = os.environ.get("CORRAL_SERVER_URL")
    os.environ["CORRAL_SERVER_URL"] = url
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["ws", "--data", str(data), *args])
            except SystemExit as exc:
                code = int(exc.code or 0)
    finally:
        if old is None:
            del os.environ["CORRAL_SERVER_URL"]
        else:
            os.environ["CORRAL_SERVER_URL"] = old
    out.flush()
    err.flush()
    done = _Done(code, out.buffer.getvalue().decode(), err.buffer.getvalue().decode())  # type: ignore[attr-defined]
    assert (done.returncode == 0) == ok, done.stderr
    return done


def test_commands_are_registered() -> None:
    assert {"serve", "ws"} <= set(corral.default_plugins().commands)


def test_serve_and_ws_verbs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    boxes = tmp_path / "boxes"
    server = ServerProcess(
        data,
        "--no-validate-open",
        "--provider",
        "local-bash=" + json.dumps({"tmpdir_root": str(boxes)}),
    )
    try:
        assert oct((data / "token").stat().st_mode & 0o777) == "0o600"
        url = server.url
        created = json.loads(
            _ws(
                data,
                url,
                "create",
                "--provider",
                "local-bash",
                "--capabilities",
                "fs,shell",
                "--tag",
                "t1",
                "--metadata",
                '{"k": 1}',
            ).stdout
        )
        wid = created["id"]
        assert SandboxDefinition.from_json(created["sandbox"]).provider == "local-bash"
        listed = json.loads(_ws(data, url, "list", "--tag", "t1").stdout)
        assert [w["id"] for w in listed["workspaces"]] == [wid]
        shown = json.loads(_ws(data, url, "show", wid).stdout)
        assert shown["metadata"] == {"k": 1}
        updated = json.loads(_ws(data, url, "update", wid, "--tag", "t2").stdout)
        assert updated["tags"] == ["t2"]
        assert _ws(data, url, "files", "ls", wid).stdout == ""
        missing = _ws(data, url, "files", "read", wid, "/nope", ok=False)
        assert "not_found" in missing.stderr
        assert json.loads(_ws(data, url, "prune", wid, "--keep", "1").stdout) == {"removed": []}
        archived = json.loads(_ws(data, url, "archive", wid).stdout)
        assert archived["state"] == "archived"
        _ws(data, url, "delete", wid)
        assert "not_found" in _ws(data, url, "show", wid, ok=False).stderr
        # Another project's token (made offline, against the same state) sees nothing of these.
        made = subprocess.run(
            [sys.executable, "-m", "corral", "serve", "--data", str(data), "--new-token", "other"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        other = made.stdout.strip()
        assert other.startswith("crl_")
        _ws(data, url, "create", "--provider", "local-bash", "--capabilities", "fs")
        listed = json.loads(_ws(data, url, "--token", other, "list").stdout)
        assert listed["workspaces"] == []
    finally:
        server.stop()


def test_ws_pty_attaches_a_terminal(tmp_path: Path) -> None:
    import pty
    import select
    import time

    from server_support import Box

    box = Box(tmp_path)
    try:
        c = box.start()
        wid = c.create({"provider": "local-bash", "capabilities": ["fs", "shell", "process"]})["id"]
        env = {**os.environ, "CORRAL_SERVER_URL": box.server.url}
        argv = [sys.executable, "-m", "corral", "ws", "--data", str(box.data), "pty", wid]
        pid, fd = pty.fork()
        if pid == 0:  # the child: corral ws pty on a real terminal
            os.execvpe(sys.executable, argv, env)
        out = b""
        deadline = time.monotonic() + 60

        while b"# " not in out and b"$ " not in out:  # the remote shell's prompt
            assert time.monotonic() < deadline, out
            if select.select([fd], [], [], 1)[0]:
                out += os.read(fd, 4096)
        os.write(fd, b"echo hi-$((40+2))\r")
        while b"hi-42" not in out:
            assert time.monotonic() < deadline, out
            if select.select([fd], [], [], 1)[0]:
                out += os.read(fd, 4096)
        os.write(fd, b"exit 3\r")
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 1)[0]:
                try:
                    if not os.read(fd, 4096):
                        break
                except OSError:  # EIO: the child closed the terminal
                    break
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        assert os.WEXITSTATUS(status) == 3
    finally:
        box.stop()
