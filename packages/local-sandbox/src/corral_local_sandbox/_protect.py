"""Protected paths: verified by content, before and after every command, under a lock.

A protected path is something a tool on the host runs or obeys when a person
later uses the workspace directory (git hooks and config, shell start-up
files, editor tasks, MCP configs). Nothing legitimate puts anything there
except corral itself: workspaces start empty, the file tools refuse those
paths, and whatever a command plants is moved out. So the rule is stateless
and decided at the moment of use:

* A protected location is acceptable when it is **absent**, or when it is a
  regular file its validator accepts (today only ``.git/config``, parsed by
  the host's git, see ``_gitconfig.py``), so ``git init`` and
  ``git config user.email`` work inside the sandbox. Anything else standing
  there -- or at the first ancestor that is not a plain directory, such as a
  ``.git`` symlink or a worktree's ``.git`` file -- is moved into the
  workspace's state directory (``protect/quarantine/``) and a note is added
  to the command's stderr.
* :meth:`ProtectedPathChecker.check` runs before and after every command, at every
  ``open``/``resolve``, after every snapshot restore and branch, and after
  every file-tool mutation, in whichever process does it. There is no
  per-process bookkeeping to lose when a process dies.
* Checks and quarantines of one workspace are serialised across processes by
  an exclusive ``flock`` on ``protect/lock`` in the state directory (which
  no sandboxed process can see).
* Every host-side operation inside the workspace goes through directory fds:
  each component is opened ``O_PATH | O_NOFOLLOW`` from the previous one and
  ``fstat``-ed, so what is judged is the object held; it is renamed out with
  ``renameat`` relative to its held parent after its inode is re-checked, and
  permissions are changed through the held fd. No symlink a command swaps in
  is ever followed, and nothing is bound into the sandbox by host path.
* Nested repositories get the same rule. ``git status`` at the root recurses
  into every submodule its index names (a gitlink ``git add sub`` records
  inside the sandbox) and obeys ``sub/.git/config`` there (``core.fsmonitor``
  runs a program), so a *deep* check also walks the whole tree (iteratively,
  by fds, never entering ``.git`` directories) and applies every ``.git*``
  protected path to each directory holding a ``.git`` entry; a ``.git`` that
  is not a plain directory (a ``gitdir:`` file pointing anywhere) is moved
  out. Deep checks run after every command, at ``open``/``resolve`` and after
  restore and branch; a walk that keeps meeting a moving tree is reported
  unclean.
* Acceptance is cached (in memory and in ``protect/accepted.json``) by
  device, inode, size, mtime, ctime *and* the SHA-256 of the content, so an
  unchanged config is not re-validated by running git; the content is
  hashed on every check.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

import anyio.to_thread
import attrs

from corral.provider import OperationError
from corral_posix import remove_tree_at

from ._policy import ProtectedPath

__all__ = ["NOTE", "STUCK_NOTE", "CheckResult", "ProtectedPathChecker", "Validator"]

log = logging.getLogger("corral.local_sandbox.protect")

Validator = Callable[[bytes, str], bool]
"""``(file bytes, scratch dir) -> keep?`` for a sandbox-written protected file."""

CacheKey = tuple[str, int, int, int, int, int, str]
"""Protected path, dev, ino, size, mtime_ns, ctime_ns, SHA-256 of the content."""

_LOCK: Final = "lock"
_ACCEPTED: Final = "accepted.json"
_QUARANTINE: Final = "quarantine"
_MAX_VALIDATE_BYTES: Final = 256 * 1024
_MAX_CACHE: Final = 64
# A pass that had to act is followed by another; a command racing the checker
# could keep it busy forever, so give up (and refuse commands) after this many.
_MAX_ROUNDS: Final = 8
_PATH_FLAGS: Final = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_GIT: Final = ".git"
_DIR_PATH_FLAGS: Final = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

NOTE: Final = (
    "corral-sandbox: {rel} was created or changed by the command at a protected path "
    "(VCS hooks/config, shell start-up, editor or agent configuration) and was moved out "
    "of the workspace\n"
)
STUCK_NOTE: Final = (
    "corral-sandbox: something at a protected path could not be moved out of the workspace; "
    "further commands are refused until it is removed from the host\n"
)


@attrs.frozen
class CheckResult:
    """The outcome of one :meth:`ProtectedPathChecker.check`.

    Attributes:
        notes: One stderr note per object moved out of the workspace.
        clean: Whether every protected location was acceptable at the end.
    """

    notes: tuple[str, ...] = ()
    clean: bool = True


class _NeedThread(Exception):
    """The fast path met something that needs blocking work (lock, git, a rename)."""


class _Raced(Exception):
    """A directory moved while the nested-repository walk was inside it."""


def _ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def _fd_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def _ensure_mode(fd: int, bits: int) -> None:
    """Add permission ``bits`` to the object ``fd`` holds (an ``O_PATH`` fd is fine).

    The command may have made a directory unsearchable or read-only; corral
    owns every file in the workspace, so it may put the bits back. The change
    goes through the held fd's ``/proc`` link, never through a path.
    """
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode & bits != bits:
        with contextlib.suppress(OSError):
            os.chmod(_fd_path(fd), mode | bits)


def _open_at(name: str, parent: int, flags: int) -> int | None:
    """``openat`` without following symlinks; None when the name is absent.

    An unsearchable parent (``chmod 000`` by a command) is made searchable once.
    """
    for attempt in range(2):
        try:
            return os.open(name, flags, dir_fd=parent)
        except FileNotFoundError:
            return None
        except PermissionError:
            if attempt:
                raise
            _ensure_mode(parent, 0o700)
    return None  # pragma: no cover - the loop returns or raises


@attrs.define
class _Found:
    """What stands at (or above) one protected location, held by fds."""

    rel: str
    parent: int  # borrowed: owned by the walk that found it
    name: str
    fd: int  # owned: O_PATH fd of the object itself
    st: os.stat_result
    is_leaf: bool


class ProtectedPathChecker:
    """The protected-path check of one workspace (see the module docstring).

    Cheap to build: one is built per restore or branch as well as per
    workspace. Every method is safe to call from several threads and several
    processes at once.

    Args:
        root: Host path of the workspace.
        state_dir: The workspace's private state directory (same filesystem).
        protected: The protected paths.
        validators: Per protected path, a check that may keep a regular file
            standing there instead of quarantining it.
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
        self._entries = tuple((e.path, tuple(e.path.split("/"))) for e in protected)
        # What a nested repository's own directory must satisfy: the
        # ``.git``-rooted entries (hooks, config, info, commondir) and ``.gitmodules``.
        self._nested_entries = tuple(
            (path, parts) for path, parts in self._entries if parts[0].casefold().startswith(_GIT)
        )
        self._validators = dict(validators or {})
        self._cache: dict[CacheKey, None] = {}
        self._cache_lock = threading.Lock()
        self._seq = 0
        os.makedirs(self._dir, mode=0o700, exist_ok=True)
        self._load_cache()

    # -- the acceptance cache ----------------------------------------------------

    def _load_cache(self) -> None:
        try:
            with open(os.path.join(self._dir, _ACCEPTED), encoding="utf-8") as fh:
                raw = json.load(fh)
            keys = [
                (str(k[0]), int(k[1]), int(k[2]), int(k[3]), int(k[4]), int(k[5]), str(k[6]))
                for k in raw
            ]
        except (OSError, ValueError, TypeError, IndexError):
            return
        with self._cache_lock:
            for key in keys:
                self._cache[key] = None

    def _remember(self, key: CacheKey) -> None:
        with self._cache_lock:
            self._cache[key] = None
            while len(self._cache) > _MAX_CACHE:
                del self._cache[next(iter(self._cache))]
            keys = list(self._cache)
        tmp = os.path.join(self._dir, f".{_ACCEPTED}.{os.getpid()}.{threading.get_ident()}")
        with contextlib.suppress(OSError):
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(keys, fh)
            os.replace(tmp, os.path.join(self._dir, _ACCEPTED))

    # -- checking ----------------------------------------------------------------

    def check(self, *, deep: bool = True) -> CheckResult:
        """Verify every protected location and quarantine what is not acceptable (blocking).

        Args:
            deep: Also walk the whole tree for nested repositories (see the
                module docstring); the shallow check covers the root only.

        Raises:
            OperationError: The workspace or its state directory is gone.
        """
        with self._locked(blocking=True):
            result = self._check(fast=False)
            if not deep:
                return result
            nested = self._check_nested()
            return CheckResult(
                tuple(dict.fromkeys(result.notes + nested.notes)), result.clean and nested.clean
            )

    def try_check_fast(self) -> CheckResult | None:
        """The common case without blocking: everything absent or already accepted.

        A few dozen ``openat``/``fstat`` calls and, for an accepted config, one
        small read and hash; suitable for the event loop.

        Returns:
            None when the lock is held elsewhere or something needs validating
            or moving: call :meth:`check` in a worker thread instead.
        """
        try:
            with self._locked(blocking=False):
                return self._check(fast=True)
        except _NeedThread:
            return None

    async def acheck(self, *, deep: bool = False) -> CheckResult:
        """:meth:`check` without blocking the event loop (fast path inline, else a thread).

        Args:
            deep: Walk the whole tree too (always in a worker thread).
        """
        if deep:
            return await anyio.to_thread.run_sync(lambda: self.check(deep=True))
        fast = self.try_check_fast()
        if fast is not None:
            return fast
        return await anyio.to_thread.run_sync(lambda: self.check(deep=False))

    @contextlib.contextmanager
    def _locked(self, *, blocking: bool) -> Iterator[None]:
        try:
            fd = os.open(
                os.path.join(self._dir, _LOCK),
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
        except OSError:
            raise OperationError("the workspace's state directory is gone", code="failed") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                raise _NeedThread from None
            yield
        finally:
            os.close(fd)  # releases the lock

    def _open_root(self) -> int:
        try:
            return os.open(self.root, _DIR_PATH_FLAGS)
        except OSError:
            raise OperationError("the workspace directory is gone", code="failed") from None

    def _check(self, *, fast: bool) -> CheckResult:
        notes: list[str] = []
        root = self._open_root()
        try:
            for _ in range(_MAX_ROUNDS):
                acted = False
                for path, parts in self._entries:
                    note = self._settle(root, path, parts, fast=fast)
                    if note is not None:
                        acted = True
                        if note:
                            notes.append(note)
                if not acted:
                    return CheckResult(tuple(dict.fromkeys(notes)), clean=True)
        finally:
            os.close(root)
        log.error("a protected path of %s could not be made safe", self.root)
        return CheckResult(tuple(dict.fromkeys(notes)), clean=False)

    def _check_nested(self) -> CheckResult:
        """Settle the ``.git*`` entries of every nested repository (lock held)."""
        notes: list[str] = []
        for _ in range(_MAX_ROUNDS):
            root = self._open_root()
            try:
                acted = self._walk_nested(root, notes)
            except _Raced:
                continue
            finally:
                os.close(root)
            if not acted:
                return CheckResult(tuple(dict.fromkeys(notes)), clean=True)
        log.error("the nested repositories of %s could not be made safe", self.root)
        return CheckResult(tuple(dict.fromkeys(notes)), clean=False)

    def _walk_nested(self, root: int, notes: list[str]) -> bool:
        """One depth-first pass; whether anything was moved out.

        Descends by ``openat(O_NOFOLLOW)`` and climbs by ``..`` checked
        against the inode it came from, so it holds one directory fd whatever
        the depth and never recurses; ``.git`` directories are not entered.
        """
        acted = False
        fd = os.open(".", _READ_DIR_FLAGS, dir_fd=root)
        names: list[str] = []
        try:
            stack = [(_ident(os.fstat(fd)), self._listing(fd)[0])]
            while stack:
                pending = stack[-1][1]
                if pending:
                    name = pending.pop()
                    child = self._enter(fd, name)
                    if child is None:
                        continue
                    os.close(fd)
                    fd = child
                    names.append(name)
                    subdirs, has_git = self._listing(fd)
                    if has_git:
                        prefix = "/".join(names) + "/"
                        for path, parts in self._nested_entries:
                            note = self._settle(fd, path, parts, fast=False, prefix=prefix)
                            if note is not None:
                                acted = True
                                if note:
                                    notes.append(note)
                    stack.append((_ident(os.fstat(fd)), subdirs))
                    continue
                stack.pop()
                if not stack:
                    break
                parent = os.open("..", _READ_DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                names.pop()
                if _ident(os.fstat(fd)) != stack[-1][0]:
                    raise _Raced
        finally:
            os.close(fd)
        return acted

    @staticmethod
    def _enter(parent: int, name: str) -> int | None:
        """Open a subdirectory for reading (made readable once if a command locked it)."""
        for attempt in range(2):
            try:
                return os.open(name, _READ_DIR_FLAGS, dir_fd=parent)
            except PermissionError:
                if attempt:
                    raise
                held = _open_at(name, parent, _DIR_PATH_FLAGS)
                if held is None:
                    return None
                try:
                    _ensure_mode(held, 0o700)
                finally:
                    os.close(held)
            except OSError:
                return None  # gone, or replaced by something that is not a directory
        return None  # pragma: no cover - the loop returns or raises

    @staticmethod
    def _listing(fd: int) -> tuple[list[str], bool]:
        """The subdirectories to descend into (not ``.git``), and whether a ``.git`` is here."""
        subdirs: list[str] = []
        has_git = False
        with os.scandir(fd) as it:
            for entry in it:
                if entry.name.casefold() == _GIT:
                    has_git = True
                    continue
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.name)
        return subdirs, has_git

    def _settle(
        self, root: int, path: str, parts: tuple[str, ...], *, fast: bool, prefix: str = ""
    ) -> str | None:
        """Check one location; None when it was acceptable, else a note ("" = nothing moved).

        ``root`` is the directory the location is relative to; ``prefix``
        names it in notes (the workspace root: empty).
        """
        opened: list[int] = []
        try:
            found = self._walk(root, parts, opened)
            if found is None:
                return None
            if found.is_leaf and self._acceptable(path, found, fast=fast):
                return None
            if fast:
                raise _NeedThread
            found.rel = prefix + found.rel
            return self._quarantine(found)
        finally:
            for fd in opened:
                os.close(fd)

    def _walk(self, root: int, parts: tuple[str, ...], opened: list[int]) -> _Found | None:
        """Open each component ``O_PATH | O_NOFOLLOW``; stop at the leaf or a non-directory."""
        parent = root
        for depth, name in enumerate(parts, start=1):
            fd = _open_at(name, parent, _PATH_FLAGS)
            if fd is None:
                return None
            opened.append(fd)
            st = os.fstat(fd)
            leaf = depth == len(parts)
            if leaf or not stat.S_ISDIR(st.st_mode):
                return _Found("/".join(parts[:depth]), parent, name, fd, st, leaf)
            parent = fd
        return None  # pragma: no cover - parts is never empty

    def _acceptable(self, path: str, found: _Found, *, fast: bool) -> bool:
        validator = self._validators.get(path)
        st = found.st
        if (
            validator is None
            or not stat.S_ISREG(st.st_mode)
            or st.st_nlink != 1
            or st.st_size > _MAX_VALIDATE_BYTES
        ):
            return False
        data = self._read(found)
        if data is None:
            return False
        key: CacheKey = (
            path,
            st.st_dev,
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
            hashlib.sha256(data).hexdigest(),
        )
        if key in self._cache:
            return True
        if fast:
            raise _NeedThread
        self._load_cache()  # another process may have validated it already
        if key in self._cache:
            return True
        if not validator(data, self._dir):
            return False
        self._remember(key)
        return True

    @staticmethod
    def _read(found: _Found) -> bytes | None:
        """The content of the very inode observed (re-opened through its held fd)."""
        try:
            fd = os.open(_fd_path(found.fd), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if _ident(st) != _ident(found.st) or not stat.S_ISREG(st.st_mode):
                return None
            data = os.read(fd, _MAX_VALIDATE_BYTES + 1)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if len(data) != found.st.st_size or after.st_mtime_ns != found.st.st_mtime_ns:
            return None  # changed while being read: judged again next pass
        return data

    # -- neutralising --------------------------------------------------------------

    def _quarantine_dir(self) -> int:
        qdir = os.path.join(self._dir, _QUARANTINE)
        with contextlib.suppress(FileExistsError):
            os.mkdir(qdir, 0o700)
        return os.open(qdir, _DIR_PATH_FLAGS)

    def _quarantine(self, found: _Found) -> str:
        """Move ``found`` out of the workspace; return its note ("" if it was not ours to move)."""
        try:
            now = os.stat(found.name, dir_fd=found.parent, follow_symlinks=False)
        except FileNotFoundError:
            return ""
        if _ident(now) != _ident(found.st):
            return ""  # swapped since observed: the next pass judges the newcomer
        # Renaming needs a writable parent, and a directory must be writable
        # itself (its ".." entry changes).
        _ensure_mode(found.parent, 0o700)
        if stat.S_ISDIR(found.st.st_mode):
            _ensure_mode(found.fd, 0o700)
        self._seq += 1
        dst = f"{time.time_ns()}-{os.getpid()}-{self._seq}-{found.rel.replace('/', '_')}"
        qfd = self._quarantine_dir()
        try:
            try:
                os.rename(found.name, dst, src_dir_fd=found.parent, dst_dir_fd=qfd)
            except FileNotFoundError:
                return ""
            except OSError as exc:
                log.warning("quarantine rename failed (%s); removing instead", exc.strerror)
                try:
                    remove_tree_at(found.parent, found.name)
                except (OSError, OperationError) as err:
                    log.error(  # noqa: TRY400 - the reason is enough, no traceback
                        "could not remove %s from %s: %s", found.rel, self.root, err
                    )
                    return ""
            else:
                moved = os.stat(dst, dir_fd=qfd, follow_symlinks=False)
                if _ident(moved) != _ident(found.st):
                    log.warning("a different object was moved out of %s", found.rel)
        finally:
            os.close(qfd)
        log.warning("quarantined %s planted at a protected path of %s", found.rel, self.root)
        return NOTE.format(rel=found.rel)
