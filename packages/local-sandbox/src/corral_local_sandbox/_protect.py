"""Protected paths: what exists is read-only, what a command creates is quarantined.

A protected path is something a tool on the host runs or obeys when a person
later uses the workspace directory (git hooks and config, shell start-up
files, editor tasks, MCP configs). :class:`PathGuard` keeps, per workspace,
a *baseline*: what stands at each protected location (the leaf, or the
first ancestor that is not a directory, e.g. a worktree's ``.git`` file or
a symlink), identified by ``lstat``.

* Before a command, baseline entries that exist are bound read-only into the
  sandbox and every directory above them is bound onto itself, so they can
  be neither written nor renamed away (``EBUSY`` on a mountpoint). Nothing is
  created on the host for absent entries.
* After a command, each location is ``lstat``-ed again (about 25 calls).
  Whatever appeared or changed where the baseline had nothing trusted is
  moved out of the workspace into its state directory and a note is added to
  the command's stderr. A ``.git/config`` is kept instead when the host's git
  parses it and every key is harmless (see ``_gitconfig.py``), so
  ``git init`` and ``git config user.email`` work inside the sandbox; such a
  sandbox-written config stays writable and is re-checked after each change.
* Changes between commands come from the host (no sandboxed process survives
  its command) and become the new trusted baseline.
* An ``inflight`` marker in the state directory exists while commands run; a
  process that died mid-command leaves it, and the next ``open``/``resolve``
  checks the workspace against the saved baseline before trusting anything.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from corral import OperationError
from corral_posix._layout import remove_tree

from ._policy import ProtectedPath

__all__ = ["Observation", "PathGuard", "Validator", "bind_args"]

log = logging.getLogger("corral.local_sandbox.protect")

Key = tuple[int, int, int, int, int, int]
Validator = Callable[[bytes, str], bool]
"""``(file bytes, scratch dir) -> keep?`` for a sandbox-written protected file."""

_MANIFEST: Final = "protect.json"
_INFLIGHT: Final = "inflight"
_QUARANTINE: Final = "quarantine"
_MAX_VALIDATE_BYTES: Final = 256 * 1024
NOTE: Final = (
    "corral-sandbox: {rel} was created or changed by the command at a protected path "
    "(VCS hooks/config, shell start-up, editor or agent configuration) and was moved out "
    "of the workspace\n"
)


@attrs.frozen
class Observation:
    """What stands at a protected location.

    Attributes:
        rel: Relative path of the leaf, or of the first ancestor that is not a
            directory; None when nothing is there.
        key: Mode, device, inode, size, mtime and ctime of ``rel``.
    """

    rel: str | None = None
    key: Key | None = None

    def same_object(self, other: Observation) -> bool:
        """Same path, file type and inode (content may differ)."""
        return (
            self.rel == other.rel
            and self.key is not None
            and other.key is not None
            and self.key[:3] == other.key[:3]
        )


_ABSENT: Final = Observation()


def _as_key(value: list[int]) -> Key:
    a, b, c, d, e, f = (int(v) for v in value)
    return (a, b, c, d, e, f)


def _key(st: os.stat_result) -> Key:
    return (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def observe(root: str, entry: ProtectedPath) -> Observation:
    """Walk ``entry`` from ``root`` without following symlinks."""
    parts = entry.path.split("/")
    for depth in range(1, len(parts) + 1):
        rel = "/".join(parts[:depth])
        try:
            st = os.lstat(os.path.join(root, rel))
        except (FileNotFoundError, NotADirectoryError):
            return _ABSENT
        if depth == len(parts) or not stat.S_ISDIR(st.st_mode):
            return Observation(rel, _key(st))
    return _ABSENT


def bind_args(host_root: str, sandbox_root: str, trusted: Iterable[str]) -> list[str]:
    """bwrap arguments binding ``trusted`` read-only and pinning the directories above them."""
    mounts: dict[str, bool] = {}
    for rel in trusted:
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            mounts.setdefault("/".join(parts[:depth]), False)
        mounts[rel] = True
    args: list[str] = []
    for rel in sorted(mounts, key=lambda r: (r.count("/"), r)):
        flag = "--ro-bind" if mounts[rel] else "--bind"
        args += [flag, os.path.join(host_root, rel), f"{sandbox_root}/{rel}"]
    return args


class PathGuard:
    """The protected-path baseline of one workspace (see the module docstring).

    Args:
        root: Host path of the workspace.
        state_dir: The workspace's private state directory (same filesystem).
        protected: The protected paths.
        validators: Per protected path, a check that may keep a sandbox-written
            regular file instead of quarantining it.
    """

    def __init__(
        self,
        root: str,
        state_dir: str,
        protected: Iterable[ProtectedPath],
        validators: Mapping[str, Validator] | None = None,
    ) -> None:
        self.root = root
        self._dir = os.path.join(state_dir, "protect")
        self._entries = tuple(protected)
        self._validators = dict(validators or {})
        self._lock = threading.Lock()
        self._baseline: dict[str, Observation] = {}
        self._accepted: set[str] = set()
        self._tainted: set[str] = set()
        self._inflight = 0
        self._seq = 0
        self._trusted: list[str] = []

    # -- persistence ---------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self._dir, name)

    def _save(self) -> None:
        data = {
            "version": 1,
            "baseline": {k: [v.rel, v.key] for k, v in self._baseline.items()},
            "accepted": sorted(self._accepted),
        }
        tmp = self._path(f".{_MANIFEST}.{os.getpid()}.{threading.get_ident()}")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, self._path(_MANIFEST))

    def _load(self) -> dict[str, Observation] | None:
        try:
            with open(self._path(_MANIFEST), encoding="utf-8") as fh:
                data: Any = json.load(fh)
            baseline = {
                str(k): Observation(v[0], _as_key(v[1]) if v[1] else None)
                for k, v in data["baseline"].items()
            }
            self._accepted = {str(a) for a in data["accepted"]}
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return None
        return baseline

    def start(self) -> list[str]:
        """Load or create the baseline at open/resolve (blocking).

        A leftover ``inflight`` marker means a command may have run without its
        check: the workspace is checked against the saved baseline first.

        Returns:
            The notes of anything quarantined.
        """
        os.makedirs(self._dir, mode=0o700, exist_ok=True)
        saved = self._load()
        notes: list[str] = []
        if saved is not None and os.path.lexists(self._path(_INFLIGHT)):
            self._baseline = saved
            notes = self._settle(self._changed())
        elif saved is not None:
            self._baseline = saved
        self._resync()
        self._save()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(_INFLIGHT))
        return notes

    # -- per command -------------------------------------------------------------------

    def _resync(self) -> bool:
        """Take the current state as trusted (only while no command runs)."""
        changed = False
        for entry in self._entries:
            now = observe(self.root, entry)
            before = self._baseline.get(entry.path)
            if now != before:
                changed = True
                self._baseline[entry.path] = now
                self._accepted.discard(entry.path)
        return changed

    def trusted(self) -> list[str]:
        """The existing protected paths to bind read-only (fixed while commands run)."""
        return self._trusted

    def begin(self) -> None:
        """Register a starting command; :meth:`end` must follow.

        Raises:
            OperationError: ``policy_denied`` when a protected location holds a
                symlink (bwrap would follow it on the host) or a planted file
                could not be removed.
        """
        with self._lock:
            if self._inflight == 0:
                if self._tainted:
                    self._settle_locked(self._tainted_changes())
                if self._tainted:
                    raise OperationError(
                        "a file planted at a protected path could not be removed; "
                        "remove it from the host to run commands",
                        code="policy_denied",
                    )
                if self._resync():
                    self._save()
            trusted: list[str] = []
            for path, obs in self._baseline.items():
                if obs.rel is None or path in self._accepted:
                    continue
                if obs.key is not None and stat.S_ISLNK(obs.key[0]):
                    raise OperationError(
                        f"protected path {path} is or lies under a symlink; remove it from the "
                        "workspace to run commands",
                        code="policy_denied",
                    )
                trusted.append(obs.rel)
            if self._inflight == 0:
                os.close(os.open(self._path(_INFLIGHT), os.O_WRONLY | os.O_CREAT, 0o600))
            self._inflight += 1
            self._trusted = sorted(set(trusted))

    def changed(self) -> list[tuple[str, Observation]]:
        """The protected locations that differ from the baseline (a few lstat calls)."""
        with self._lock:
            return self._changed()

    def _changed(self) -> list[tuple[str, Observation]]:
        out = []
        for entry in self._entries:
            now = observe(self.root, entry)
            if now != self._baseline.get(entry.path, _ABSENT):
                out.append((entry.path, now))
        return out

    def _tainted_changes(self) -> list[tuple[str, Observation]]:
        by_path = {e.path: e for e in self._entries}
        return [(p, observe(self.root, by_path[p])) for p in sorted(self._tainted)]

    def end(self, changes: list[tuple[str, Observation]]) -> list[str]:
        """Finish a command: neutralise ``changes`` (blocking when there are any).

        Returns:
            One stderr note per quarantined path.
        """
        with self._lock:
            self._inflight -= 1
            notes = self._settle_locked(changes) if changes else []
            if self._inflight == 0:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(_INFLIGHT))
            return notes

    # -- neutralising ----------------------------------------------------------------

    def _settle(self, changes: list[tuple[str, Observation]]) -> list[str]:
        with self._lock:
            return self._settle_locked(changes)

    def _settle_locked(self, changes: list[tuple[str, Observation]]) -> list[str]:
        notes: list[str] = []
        by_path = {e.path: e for e in self._entries}
        for path, _seen in changes:
            # Re-observed: quarantining one location may have cleared another (".git").
            now = observe(self.root, by_path[path])
            before = self._baseline.get(path, _ABSENT)
            if now == before:
                continue
            if now.rel is None:
                self._baseline[path] = now
                self._accepted.discard(path)
                continue
            if path not in self._accepted and before.same_object(now):
                # A trusted object the sandbox could not touch (read-only, pinned):
                # the host changed it during the command.
                self._baseline[path] = now
                continue
            if now.rel == path and self._keep(path, now):
                self._baseline[path] = now
                self._accepted.add(path)
                continue
            if self._quarantine(now.rel):
                log.warning("quarantined %s planted at a protected path of %s", now.rel, self.root)
                notes.append(NOTE.format(rel=now.rel))
                self._tainted.discard(path)
            else:
                self._tainted.add(path)
            self._baseline[path] = observe(self.root, by_path[path])
            self._accepted.discard(path)
        self._save()
        return notes

    def _keep(self, path: str, now: Observation) -> bool:
        validator = self._validators.get(path)
        if validator is None or now.key is None or not stat.S_ISREG(now.key[0]):
            return False
        try:
            fd = os.open(os.path.join(self.root, path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if _key(st) != now.key or st.st_nlink != 1 or st.st_size > _MAX_VALIDATE_BYTES:
                return False
            data = os.read(fd, _MAX_VALIDATE_BYTES + 1)
        finally:
            os.close(fd)
        return validator(data, self._dir)

    def _make_movable(self, rel: str) -> None:
        # A directory the command made read-only cannot be moved (its ".."
        # changes) nor can entries of a read-only parent; we own them.
        parts = rel.split("/")
        for depth in range(len(parts) + 1):
            path = os.path.join(self.root, *parts[:depth])
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)

    def _quarantine(self, rel: str) -> bool:
        src = os.path.join(self.root, rel)
        qdir = self._path(_QUARANTINE)
        os.makedirs(qdir, mode=0o700, exist_ok=True)
        self._seq += 1
        dst = os.path.join(qdir, f"{time.time_ns()}-{self._seq}-{rel.replace('/', '_')}")
        for attempt in range(2):
            try:
                os.rename(src, dst)
            except FileNotFoundError:
                return True
            except OSError:
                if attempt == 0:
                    self._make_movable(rel)
            else:
                return True
        with contextlib.suppress(OSError):
            if os.path.isdir(src) and not os.path.islink(src):
                remove_tree(src)
            else:
                os.unlink(src)
        return not os.path.lexists(src)
