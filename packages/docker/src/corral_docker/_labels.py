"""Container labels: who owns a container, whether that owner is alive, what it runs.

Owner liveness is a host-local fact: a pid means something only in the pid
namespace of the kernel it was read on, and only where ``/proc`` exists. The
labels therefore name that namespace (boot id and pid-namespace inode, next
to the hostname), and :func:`owner_alive` answers ``None`` -- unknown --
whenever this process cannot check the owner where it ran: another host,
another boot, another pid namespace, or no ``/proc`` here (macOS). Callers
never treat unknown as dead: on a remote engine the containers of other
clients are listed too, and removing a live client's container would break
its handle.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Mapping
from typing import Final

__all__ = [
    "LABEL_MANAGED",
    "LABEL_OWNER_HOST",
    "LABEL_OWNER_NS",
    "LABEL_OWNER_PID",
    "LABEL_OWNER_START",
    "LABEL_ROOT",
    "LABEL_SESSION",
    "LABEL_SPEC",
    "LABEL_WORKSPACE",
    "owned_here",
    "owner_alive",
    "owner_labels",
    "pid_namespace",
    "process_start",
]

LABEL_MANAGED: Final = "io.corral.managed"
LABEL_WORKSPACE: Final = "io.corral.workspace"
LABEL_SESSION: Final = "io.corral.session"
LABEL_ROOT: Final = "io.corral.root"
LABEL_SPEC: Final = "io.corral.spec"
LABEL_OWNER_HOST: Final = "io.corral.owner.host"
LABEL_OWNER_NS: Final = "io.corral.owner.ns"
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


@functools.cache
def pid_namespace() -> str:
    """Where this process's pids mean something: ``boot-id/pid-namespace``, or ``""``.

    Two processes may compare pids only when both values are equal and
    non-empty (same kernel boot, same pid namespace). Cached: neither
    changes while the process lives.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{ns}" if boot and ns else ""


def owner_labels() -> dict[str, str]:
    """Labels naming the current process as a container's owner."""
    pid = os.getpid()
    return {
        LABEL_OWNER_HOST: socket.gethostname(),
        LABEL_OWNER_NS: pid_namespace(),
        LABEL_OWNER_PID: str(pid),
        LABEL_OWNER_START: process_start(pid),
    }


def _checkable_here(labels: Mapping[str, str]) -> bool:
    """Whether the labelled owner's pid can be checked from this process."""
    if labels.get(LABEL_OWNER_HOST) != socket.gethostname():
        return False
    here = pid_namespace()
    if not here:
        return False  # no /proc here: nothing host-local can be checked
    # Labels written before the namespace label existed carry only the hostname.
    return labels.get(LABEL_OWNER_NS, here) == here


def owner_alive(labels: Mapping[str, str]) -> bool | None:
    """Whether the labelled owner process still runs; None when this process cannot tell.

    None covers an owner on another host, boot or pid namespace, and a
    system without ``/proc``: such a container may well be in use.
    """
    if not _checkable_here(labels):
        return None
    try:
        pid = int(labels.get(LABEL_OWNER_PID, ""))
    except ValueError:
        return False
    start = process_start(pid)
    return bool(start) and start == labels.get(LABEL_OWNER_START, start)


def owned_here(labels: Mapping[str, str]) -> bool:
    """Whether the labels name this very process as the owner."""
    if not _checkable_here(labels):
        return False
    pid = os.getpid()
    return labels.get(LABEL_OWNER_PID) == str(pid) and labels.get(
        LABEL_OWNER_START
    ) == process_start(pid)
