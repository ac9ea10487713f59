"""The agent's watchdog: kills what the agent's workspaces were running when the agent dies hard.

``ray.kill``, an out-of-memory kill or a lost raylet ends the agent process
without a chance to close its workspaces, and their commands -- each in its
own session and process group -- would run on. The agent starts this
watchdog with a pipe on its stdin. The watchdog samples the agent's
descendants a few times a second; when the pipe reaches end of file (the
agent is gone, however it died) it kills every process group it saw,
checking start times so a reused pid is never hit. Missed: a process started
in the last fraction of a second before the death, and one that left the
agent's tree on purpose (double fork) -- the agent is not a child subreaper,
because reaping strangers' children would steal its own commands' exit
statuses.

Run as ``python -I path/to/_watchdog.py AGENT_PID`` (standard library only).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from pathlib import Path
from typing import Final

__all__ = ["descendants", "main"]

_PERIOD_S: Final = 0.2


def _stat(pid: int) -> tuple[int, int, int] | None:
    """``(ppid, pgid, start time)`` of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return int(fields[1]), int(fields[2]), int(fields[19])


def descendants(root: int) -> dict[int, tuple[int, int]]:
    """Every process below ``root``: pid -> (pgid, start time)."""
    table: dict[int, tuple[int, int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            info = _stat(int(entry.name))
            if info is not None:
                table[int(entry.name)] = info
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, tuple[int, int]] = {}
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        found[pid] = (table[pid][1], table[pid][2])
        stack.extend(children.get(pid, ()))
    return found


def _kill(seen: dict[int, tuple[int, int]]) -> None:
    me = os.getpid()
    for pid, (pgid, started) in seen.items():
        info = _stat(pid)
        if pid == me or info is None or info[2] != started:
            continue  # exited already, or the pid now names another process
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if pgid not in (me, os.getpgid(0)):
                os.killpg(pgid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    """Watch the agent whose pid is ``argv[0]`` until its pipe closes, then kill what it left."""
    agent = int(argv[0])
    seen: dict[int, tuple[int, int]] = {}
    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([stdin], [], [], _PERIOD_S)
        if ready and not os.read(stdin, 4096):
            break
        current = descendants(agent)
        current.pop(os.getpid(), None)
        seen = current
    # The agent is gone: its orphans were re-parented, so use the last sample too.
    _kill({**seen, **{p: v for p, v in descendants(agent).items() if p != os.getpid()}})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
