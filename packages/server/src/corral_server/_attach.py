"""``corral ws pty``: this terminal attached to a PTY handle of a durable workspace.

The local terminal goes raw (every key goes to the remote program, ^C
included); a thread forwards stdin to the handle, the main loop long-polls
the output by cursor (so a dropped connection loses nothing) and writes it
to stdout, SIGWINCH resizes the remote terminal. Detaching is ``~.`` at the
start of a line, as in ssh; the program ends the session when it exits.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from typing import Any

from ._client import ApiError, Client

__all__ = ["attach"]


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _size() -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except OSError:
        return 80, 24
    return max(1, min(size.columns, 1000)), max(1, min(size.lines, 1000))


def _forward_input(client: Client, base: str, stop: threading.Event) -> None:
    """Send what the user types to the handle; ``~.`` at a line start detaches."""
    at_line_start, tilde = True, False
    while not stop.is_set():
        try:
            data = os.read(sys.stdin.fileno(), 4096)
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(ApiError, OSError):
                client.request("POST", f"{base}/stdin", json={"close": True})
            return
        if at_line_start and data == b"~":
            tilde = True
            continue
        if tilde and data == b".":
            stop.set()
            return
        if tilde:
            data = b"~" + data
            tilde = False
        at_line_start = data.endswith((b"\r", b"\n"))
        with contextlib.suppress(ApiError):
            payload = {"data": base64.b64encode(data).decode("ascii")}
            client.request("POST", f"{base}/stdin", json=payload)


def attach(client: Client, workspace_id: str, command: str, *, cwd: str | None = None) -> int:
    """Run ``command`` under a new PTY handle with this terminal attached; its exit status."""
    cols, rows = _size()
    body: dict[str, Any] = {"command": command, "cols": cols, "rows": rows}
    if cwd:
        body["cwd"] = cwd
    handle = client.request("POST", f"/v1/workspaces/{workspace_id}/pty", json=body)
    base = f"/v1/workspaces/{workspace_id}/handles/{handle['id']}"
    stop = threading.Event()

    def on_winch(_sig: int, _frame: object) -> None:
        c, r = _size()
        with contextlib.suppress(ApiError):
            client.request("POST", f"{base}/resize", json={"cols": c, "rows": r})

    previous = signal.signal(signal.SIGWINCH, on_winch)
    reader = threading.Thread(target=_forward_input, args=(client, base, stop), daemon=True)
    cursor = 0
    try:
        with _raw(sys.stdin.fileno()):
            reader.start()
            while not stop.is_set():
                data, cursor, ended = client.read(
                    workspace_id, handle["id"], cursor=cursor, wait_s=1.0
                )
                if data:
                    os.write(sys.stdout.fileno(), data)
                if ended:
                    break
    finally:
        stop.set()
        signal.signal(signal.SIGWINCH, previous)
    info = client.request("GET", base)
    code = info.get("exit_code")
    return int(code) if isinstance(code, int) else 0
