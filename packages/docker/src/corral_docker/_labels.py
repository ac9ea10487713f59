"""Container labels: who owns a container, and whether that owner is alive."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Final

__all__ = [
    "LABEL_MANAGED",
    "LABEL_OWNER_HOST",
    "LABEL_OWNER_PID",
    "LABEL_OWNER_START",
    "LABEL_ROOT",
    "LABEL_SESSION",
    "LABEL_WORKSPACE",
    "owner_alive",
    "owner_labels",
    "process_start",
]

LABEL_MANAGED: Final = "io.corral.managed"
LABEL_WORKSPACE: Final = "io.corral.workspace"
LABEL_SESSION: Final = "io.corral.session"
LABEL_ROOT: Final = "io.corral.root"
LABEL_OWNER_HOST: Final = "io.corral.owner.host"
LABEL_OWNER_PID: Final = "io.corral.owner.pid"
LABEL_OWNER_START: Final = "io.corral.owner.start"


def process_start(pid: int) -> str:
    """The kernel start time of ``pid`` (clock ticks since boot), or ``""``.

    Paired with the pid it tells a live owner from a recycled pid.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return ""
    # Field 2 (comm) may contain spaces and parentheses; fields resume after the last ')'.
    rest = data[data.rfind(b")") + 2 :].split()
    return rest[19].decode() if len(rest) > 19 else ""


def owner_labels() -> dict[str, str]:
    """Labels naming the current process as a container's owner."""
    pid = os.getpid()
    return {
        LABEL_OWNER_HOST: socket.gethostname(),
        LABEL_OWNER_PID: str(pid),
        LABEL_OWNER_START: process_start(pid),
    }


def owner_alive(labels: Mapping[str, str]) -> bool | None:
    """Whether the labelled owner process still runs; None when it is on another host."""
    if labels.get(LABEL_OWNER_HOST) != socket.gethostname():
        return None
    try:
        pid = int(labels.get(LABEL_OWNER_PID, ""))
    except ValueError:
        return False
    start = process_start(pid)
    return bool(start) and start == labels.get(LABEL_OWNER_START, start)
