"""``corral call`` draws a progress bar on stderr when it is a terminal, and only then."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")

CLEAR = "\r\x1b[K"


def corral_call(tmp_path: Path, *args: str, tty: bool) -> tuple[int, str, str]:
    """Run ``corral call`` on a local-bash session; stderr on a pseudo-terminal if ``tty``."""
    env = {**os.environ, "CORRAL_STATE_DIR": str(tmp_path / "state")}
    env.pop("CORRAL_DISABLE_PLUGINS", None)
    root = tmp_path / "ws"
    root.mkdir(exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "corral._cli",
        "call",
        "--provider",
        "local-bash",
        "--provider-options",
        json.dumps({"tmpdir_root": str(root)}),
        "--capabilities",
        '{"fs": true, "snapshot": true}',
        "--session",
        "bar",
        *args,
    ]
    if not tty:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=120, check=False
        )
        return proc.returncode, proc.stdout, proc.stderr
    controller, terminal = pty.openpty()
    try:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=terminal, env=env)
        os.close(terminal)
        terminal = -1
        seen = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        out, _ = child.communicate(timeout=120)
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)
    return child.returncode, out.decode(), seen.decode(errors="replace")


def _fill(tmp_path: Path) -> str:
    # One file is enough: the first entry walked is drawn at once.
    status, _out, err = corral_call(
        tmp_path,
        "workspace_write_file",
        json.dumps({"path": "/src/a.txt", "content": "a"}),
        tty=False,
    )
    assert status == 0, err
    status, out, err = corral_call(tmp_path, "--json", "workspace_snapshot", "{}", tty=False)
    assert status == 0, err
    return str(json.loads(out)["data"]["snapshot_id"])


def test_the_bar_shows_on_a_terminal_and_is_cleared(tmp_path: Path) -> None:
    snapshot_id = _fill(tmp_path)
    status, out, err = corral_call(tmp_path, "workspace_snapshot", "{}", tty=True)
    assert status == 0, err
    assert "snapshot: " in err  # a counter: a snapshot's total is unknown while walking
    assert err.endswith(CLEAR)  # and nothing of it is left on the line
    assert "snap-" in out  # the result itself goes to stdout, untouched
    assert "\r" not in out

    status, out, err = corral_call(
        tmp_path, "workspace_restore", json.dumps({"snapshot_id": snapshot_id}), tty=True
    )
    assert status == 0, err
    assert "restore [" in err  # a bar: the version's size is known
    assert err.endswith(CLEAR)


def test_no_bar_when_stderr_is_piped(tmp_path: Path) -> None:
    snapshot_id = _fill(tmp_path)
    status, _out, err = corral_call(tmp_path, "workspace_snapshot", "{}", tty=False)
    assert status == 0, err
    status, _out, err2 = corral_call(
        tmp_path, "workspace_restore", json.dumps({"snapshot_id": snapshot_id}), tty=False
    )
    assert status == 0, err2
    for text in (err, err2):
        assert "\r" not in text
        assert "\x1b" not in text
        assert "snapshot" not in text
        assert "restore" not in text
