"""One cgroup per workspace (pids and memory), on cgroup v1 or v2.

Limits must bound the *workspace*, not one process: ``RLIMIT_AS`` caps each
process's address space (five processes hold five times the limit) and the
kernel exempts host root from ``RLIMIT_NPROC`` (bubblewrap maps the sandbox
uid to the caller's). So every workspace gets its own cgroup carrying
``pids.max`` and the memory limit (memory + swap), and the launcher moves
bwrap into it before the sandbox exists.

On cgroup v1 each controller lives in its own hierarchy: the workspace gets
one directory per hierarchy, all with the same name. On v2 it gets one
directory. The name is derived from the workspace's state directory, so the
next ``resolve`` of the same workspace (a CLI call in a new process) reuses
the cgroup instead of leaking another; creation is idempotent, ``close``
removes it, and :func:`sweep_orphans` removes those whose workspace is gone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import signal
import stat
import tempfile
import time
from collections.abc import Collection, Sequence
from typing import Final

import attrs

__all__ = [
    "CGROUP_PREFIX",
    "CgroupUnavailable",
    "Placement",
    "WorkspaceCgroup",
    "cgroup_name",
    "find_placements",
    "owner_index",
    "release_recorded",
    "remove_cgroup",
    "sweep_orphans",
    "workspace_cgroup",
]

log = logging.getLogger("corral.local_sandbox")

CGROUP_PREFIX: Final = "corral-sandbox-"
_MOUNTINFO: Final = "/proc/self/mountinfo"
_SELF_CGROUP: Final = "/proc/self/cgroup"
_NAME_RE: Final = re.compile(r"corral-sandbox-([0-9a-f]{8})-([0-9a-f]{16})")
_KILL_ROUNDS: Final = 50
_UNRECORDED_GRACE_S: Final = 60.0


def _digest(text: str, size: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:size]


def base_tag(base_dir: str) -> str:
    """The part of a cgroup name naming the provider base directory that owns it."""
    return _digest(os.path.realpath(base_dir), 8)


def workspace_tag(workspace: str) -> str:
    """The part of a cgroup name naming one workspace (by its directory name)."""
    return _digest(workspace, 16)


def cgroup_name(base_dir: str, workspace: str) -> str:
    """The stable cgroup directory name of one workspace: the same in every process."""
    return f"{CGROUP_PREFIX}{base_tag(base_dir)}-{workspace_tag(workspace)}"


@attrs.frozen
class Placement:
    """A directory under which workspace cgroups are made, and what it controls.

    Attributes:
        parent: The parent cgroup directory.
        version: 1 (one hierarchy per controller) or 2 (unified).
        controllers: The controllers from the requested set it carries.
    """

    parent: str
    version: int
    controllers: frozenset[str]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def _v2_parent(mount_point: str, mount_root: str, wanted: set[str], self_cgroup: str) -> str | None:
    """The cgroup v2 directory new workspace cgroups go under, or None.

    Root uses the hierarchy's root (exempt from the no-internal-processes
    rule, and the same for every caller). Anyone else needs a delegated
    subtree: the nearest ancestor of its own cgroup that it may write and
    whose ``cgroup.subtree_control`` enables every wanted controller.
    """
    candidates: list[str] = []
    if os.geteuid() == 0:
        candidates.append(mount_point)
    else:
        own = next(
            (ln[3:] for ln in (_read(self_cgroup) or "").splitlines() if ln.startswith("0::")), None
        )
        if own is not None:
            rel = own
            if mount_root != "/" and rel.startswith(mount_root):
                rel = rel[len(mount_root) :]
            path = os.path.normpath(os.path.join(mount_point, rel.lstrip("/")))
            while path.startswith(mount_point):
                candidates.append(path)
                if path == mount_point:
                    break
                path = os.path.dirname(path)
    for path in candidates:
        enabled = set((_read(os.path.join(path, "cgroup.subtree_control")) or "").split())
        if wanted <= enabled and os.access(path, os.W_OK):
            return path
    return None


def find_placements(
    controllers: Collection[str],
    *,
    mountinfo: str = _MOUNTINFO,
    self_cgroup: str = _SELF_CGROUP,
) -> tuple[list[Placement], list[str]]:
    """Where each wanted controller can be applied to a new child cgroup.

    Returns:
        The placements (v1: one per hierarchy; v2: at most one) and the
        controllers no writable hierarchy offers.
    """
    wanted = set(controllers)
    text = _read(mountinfo)
    if text is None:
        return [], sorted(wanted)
    placements: list[Placement] = []
    v2: tuple[str, str] | None = None
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount_root, mount_point, fstype, super_opts = fields[3], fields[4], tail[0], tail[2]
        if fstype == "cgroup":
            have = wanted.intersection(super_opts.split(","))
            have -= {c for p in placements for c in p.controllers}
            if have and os.access(mount_point, os.W_OK):
                placements.append(Placement(mount_point, 1, frozenset(have)))
        elif fstype == "cgroup2" and v2 is None:
            v2 = (mount_point, mount_root)
    rest = wanted - {c for p in placements for c in p.controllers}
    if rest and v2 is not None:
        parent = _v2_parent(v2[0], v2[1], rest, self_cgroup)
        if parent is not None:
            placements.append(Placement(parent, 2, frozenset(rest)))
            rest = set()
    return placements, sorted(rest)


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(value)


class WorkspaceCgroup:
    """The cgroup directories of one workspace, created or reused, with their limits.

    Args:
        placements: From :func:`find_placements`.
        name: From :func:`cgroup_name`.
        pids: ``pids.max``, or None.
        memory: Memory limit in bytes (swap bounded too where the kernel
            accounts it), or None.

    Raises:
        OSError: A directory cannot be created or a limit cannot be written;
            directories this call created are removed again.
    """

    def __init__(
        self,
        placements: Sequence[Placement],
        name: str,
        *,
        pids: int | None = None,
        memory: int | None = None,
    ) -> None:
        self.paths: tuple[str, ...] = tuple(os.path.join(p.parent, name) for p in placements)
        self.controllers: frozenset[str] = frozenset().union(*(p.controllers for p in placements))
        self.swap_limited = memory is None
        created: list[str] = []
        try:
            for placement, path in zip(placements, self.paths, strict=True):
                try:
                    os.mkdir(path, 0o755)
                    created.append(path)
                except FileExistsError:
                    pass  # the same workspace's cgroup, made by an earlier call: reuse it
                has = placement.controllers
                if pids is not None and "pids" in has:
                    _write(os.path.join(path, "pids.max"), str(pids))
                if memory is not None and "memory" in has:
                    self.swap_limited = _limit_memory(path, placement.version, memory)
        except OSError:
            for path in created:
                with contextlib.suppress(OSError):
                    os.rmdir(path)
            raise

    @property
    def procs_files(self) -> tuple[str, ...]:
        """The ``cgroup.procs`` files a launcher writes its pid to (one per hierarchy)."""
        return tuple(os.path.join(p, "cgroup.procs") for p in self.paths)

    def memory_peak(self) -> int | None:
        """The highest memory use the kernel recorded for the workspace, in bytes."""
        for path in self.paths:
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                text = _read(os.path.join(path, name))
                if text is not None and text.strip().isdigit():
                    return int(text)
        return None

    def remove(self) -> None:
        """Kill every process still inside and delete the directories (best effort, idempotent)."""
        for path in self.paths:
            try:
                remove_cgroup(path)
            except OSError as exc:
                log.warning("cannot remove cgroup %s: %s", path, exc.strerror)


def _limit_memory(path: str, version: int, limit: int) -> bool:
    """Write the memory limit; return whether swap is bounded too."""
    if version == 2:
        _write(os.path.join(path, "memory.max"), str(limit))
        try:
            _write(os.path.join(path, "memory.swap.max"), "0")
        except FileNotFoundError:
            return False  # no swap controller: the kernel has no swap to give
        return True
    memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
    swap = os.path.exists(memsw)
    if swap:
        # memsw must stay >= the memory limit at every step, whatever the old values.
        _write(memsw, "-1")
    _write(os.path.join(path, "memory.limit_in_bytes"), str(limit))
    if swap:
        _write(memsw, str(limit))
    return swap


def remove_cgroup(path: str) -> None:
    """Kill the processes of one cgroup directory and remove it (best effort)."""
    procs = os.path.join(path, "cgroup.procs")
    for _ in range(_KILL_ROUNDS):
        text = _read(procs)
        if text is None:
            return
        pids = [int(p) for p in text.split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    for _ in range(_KILL_ROUNDS):
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            time.sleep(0.02)  # killed processes are still being torn down
        else:
            return


def owner_index() -> str | None:
    """The directory recording which state directory owns each workspace cgroup.

    One per host user, in a runtime directory (cleared at boot, like the
    cgroups themselves): ``/run`` for root, else ``$XDG_RUNTIME_DIR``, else
    the temp dir. Refused when it is not a private directory of ours.
    """
    euid = os.geteuid()
    candidates = ["/run/corral-sandbox"] if euid == 0 else []
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        candidates.append(os.path.join(runtime, "corral-sandbox"))
    candidates.append(os.path.join(tempfile.gettempdir(), f"corral-owners-{euid}"))
    for path in candidates:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == euid and not st.st_mode & 0o022:
            return path
    return None


def _register(index: str, name: str, state_dir: str) -> None:
    # Recorded *before* the cgroup exists, so a cgroup without a record is an orphan.
    final = os.path.join(index, name)
    tmp = f"{final}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(state_dir, tmp)
    os.replace(tmp, final)


def _unregister(index: str | None, name: str) -> None:
    if index is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(index, name))


def sweep_orphans(placements: Sequence[Placement], index: str) -> int:
    """Remove workspace cgroups whose workspace (state directory) no longer exists.

    Two kinds of orphan: a recorded owner that is gone (the workspace was
    removed without ``close``: a temp cleaner, a crash), and a cgroup with no
    record at all that is over a minute old (its creator died between the two
    steps). One bad entry never stops the sweep, nor the ``open`` running it:
    each is handled on its own and failures are logged.

    Returns:
        How many cgroup directories were removed.
    """
    removed = 0

    def drop(name: str) -> None:
        nonlocal removed
        for placement in placements:
            path = os.path.join(placement.parent, name)
            if os.path.isdir(path):
                remove_cgroup(path)
                removed += 1

    try:
        owners = {e.name: e.path for e in os.scandir(index) if _NAME_RE.fullmatch(e.name)}
    except OSError as exc:
        log.warning("cannot read the cgroup owner records: %s", exc.strerror)
        return 0
    for name, record in owners.items():
        try:
            if os.path.isdir(os.readlink(record)):
                continue
            drop(name)
            os.unlink(record)
        except Exception as exc:  # a sweep never blocks an open
            log.warning("cannot remove orphan cgroup %s: %s", name, exc)
    cutoff = time.time() - _UNRECORDED_GRACE_S
    for placement in placements:
        try:
            entries = [e for e in os.scandir(placement.parent) if _NAME_RE.fullmatch(e.name)]
        except OSError as exc:
            log.warning("cannot scan %s for orphan cgroups: %s", placement.parent, exc.strerror)
            continue
        for entry in entries:
            try:
                if entry.name in owners or os.path.lexists(os.path.join(index, entry.name)):
                    continue
                if entry.stat(follow_symlinks=False).st_ctime > cutoff:
                    continue  # being created right now
                remove_cgroup(entry.path)
                removed += 1
            except Exception as exc:  # a sweep never blocks an open
                log.warning("cannot remove orphan cgroup %s: %s", entry.name, exc)
    return removed


class CgroupUnavailable(Exception):
    """A limit needs a cgroup and none can be made; the message says why (no untrusted text)."""


_RECORD: Final = "cgroups"


def workspace_cgroup(
    *,
    state_dir: str,
    scratch: str,
    pids: int | None,
    memory: int | None,
    require_pids: bool,
) -> WorkspaceCgroup | None:
    """Create or reuse the cgroup of the workspace whose state directory is ``state_dir``.

    Orphans of this provider base (workspaces that no longer exist) are
    swept first. The directories made are recorded in ``scratch`` so that
    closing the workspace removes them even when a later caller placed its
    cgroup elsewhere (a non-root caller in another delegated subtree).

    Args:
        state_dir: ``<base>/state/<workspace>``.
        scratch: The workspace's private sandbox directory (in ``state_dir``).
        pids: ``pids.max`` wanted, or None.
        memory: Memory limit wanted, or None.
        require_pids: Whether a missing pids controller is fatal (host root,
            whom ``RLIMIT_NPROC`` does not bind) or merely falls back.

    Returns:
        The cgroup, or None when no limit wants one.

    Raises:
        CgroupUnavailable: A required controller is missing or unusable.
    """
    wanted = {c for c, v in (("pids", pids), ("memory", memory)) if v is not None}
    required = {c for c in wanted if c == "memory" or require_pids}
    if not wanted:
        return None
    placements, missing = find_placements(wanted)
    if set(missing) & required and wanted != required:
        placements, missing = find_placements(required)  # v2 places all or nothing
    lacking = sorted(set(missing) & required)
    if lacking:
        raise CgroupUnavailable(
            f"no writable cgroup hierarchy offers the {' and '.join(lacking)} controller"
        )
    if not placements:
        return None
    base_dir = os.path.dirname(os.path.dirname(state_dir))
    name = cgroup_name(base_dir, os.path.basename(state_dir))
    index = owner_index()
    if index is None:
        log.warning("no private directory for cgroup owner records; orphans cannot be swept")
    try:
        if index is not None:
            sweep_orphans(placements, index)
            _register(index, name, state_dir)
        cgroup = WorkspaceCgroup(placements, name, pids=pids, memory=memory)
    except OSError as exc:
        why = f"the workspace cgroup could not be set up ({exc.strerror})"
        raise CgroupUnavailable(why) from exc
    _record(scratch, cgroup.paths)
    return cgroup


class WorkspaceProcesses:
    """Every process of one workspace that runs under a cgroup, read from the kernel.

    Each launch of a workspace's command joins the workspace's cgroup in
    every hierarchy before the sandbox exists (and a memory limit makes
    that mandatory), so the cgroup's members are the processes that can
    touch the tree. Used by the change journal to check for writable
    shared mappings (see :mod:`corral_posix._changes`).

    Args:
        state_dir: ``<base>/state/<workspace>``.
    """

    def __init__(self, state_dir: str) -> None:
        base_dir = os.path.dirname(os.path.dirname(state_dir))
        self._name = cgroup_name(base_dir, os.path.basename(state_dir))
        self._files: tuple[str, ...] | None = None  # found on first use, not at every open

    def __call__(self) -> list[int] | None:
        """The pids in the workspace's cgroups; None when no hierarchy can be read."""
        if self._files is None:
            placements, _missing = find_placements({"memory", "pids"})
            self._files = tuple(
                os.path.join(p.parent, self._name, "cgroup.procs") for p in placements
            )
        if not self._files:
            return None
        pids: set[int] = set()
        for path in self._files:
            try:
                with open(path, encoding="ascii") as fh:
                    pids.update(int(line) for line in fh if line.strip())
            except FileNotFoundError:
                continue  # never made: nothing has run in that hierarchy
            except (OSError, ValueError):
                return None
        return sorted(pids)


def _record(scratch: str, paths: Sequence[str]) -> None:
    record = os.path.join(scratch, _RECORD)
    known = set((_read(record) or "").splitlines())
    new = [p for p in paths if p not in known]
    if new:
        fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, "".join(f"{p}\n" for p in new).encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)


def release_recorded(scratch: str) -> None:
    """Remove every cgroup recorded for a workspace that is being closed (best effort)."""
    names = set()
    for path in (_read(os.path.join(scratch, _RECORD)) or "").splitlines():
        names.add(os.path.basename(path))
        if not _NAME_RE.fullmatch(os.path.basename(path)) or not path.startswith("/"):
            continue  # only ever our own cgroup directories
        try:
            remove_cgroup(path)
        except OSError as exc:
            log.warning("cannot remove cgroup %s: %s", path, exc.strerror)
    index = owner_index() if names else None
    for name in names:
        if _NAME_RE.fullmatch(name):
            _unregister(index, name)
