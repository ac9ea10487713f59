"""A pids cgroup per workspace, for hosts where ``RLIMIT_NPROC`` cannot work.

The kernel exempts processes whose *host* uid is root from ``RLIMIT_NPROC``
(``copy_process`` skips the check for ``INIT_USER``), and bubblewrap maps
the sandbox uid to the caller's uid, so a sandbox started by root could
fork without bound. There the workspace gets its own cgroup with
``pids.max``; the launcher moves bwrap into it before the sandbox exists.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from typing import Final

__all__ = ["PidsCgroup", "find_pids_hierarchy"]

_MOUNTINFO: Final = "/proc/self/mountinfo"


def find_pids_hierarchy(mountinfo: str = _MOUNTINFO) -> str | None:
    """The directory under which a pids-limited child cgroup can be made, or None.

    A cgroup v1 hierarchy carrying the ``pids`` controller, or the cgroup v2
    root when ``pids`` is enabled in its ``cgroup.subtree_control``.
    """
    try:
        with open(mountinfo, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    v2: str | None = None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount_point, fstype, super_opts = fields[4], tail[0], tail[2]
        if fstype == "cgroup" and "pids" in super_opts.split(","):
            return mount_point
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
    if v2 is not None:
        try:
            with open(os.path.join(v2, "cgroup.subtree_control"), encoding="utf-8") as fh:
                if "pids" in fh.read().split():
                    return v2
        except OSError:
            return None
    return None


class PidsCgroup:
    """One cgroup with ``pids.max``; :meth:`remove` kills what is left and deletes it.

    Args:
        hierarchy: Parent directory from :func:`find_pids_hierarchy`.
        max_pids: The ``pids.max`` value.

    Raises:
        OSError: The cgroup cannot be created or configured.
    """

    def __init__(self, hierarchy: str, max_pids: int) -> None:
        self.path = os.path.join(hierarchy, f"corral-sandbox-{secrets.token_hex(8)}")
        os.mkdir(self.path, 0o755)
        try:
            with open(os.path.join(self.path, "pids.max"), "w", encoding="ascii") as fh:
                fh.write(str(max_pids))
        except OSError:
            os.rmdir(self.path)
            raise

    @property
    def procs_file(self) -> str:
        """The file a launcher writes its pid to."""
        return os.path.join(self.path, "cgroup.procs")

    def remove(self) -> None:
        """Kill every process still in the cgroup and delete it (best effort, idempotent)."""
        for _ in range(50):
            try:
                with open(self.procs_file, encoding="ascii") as fh:
                    pids = [int(p) for p in fh.read().split()]
            except OSError:
                return
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        with contextlib.suppress(OSError):
            os.rmdir(self.path)
