"""On-disk layout and ref payload shared by every tmpdir-backed provider.

Under ``tmpdir_root`` (default :func:`tempfile.gettempdir`) each provider
owns one base directory, private to the current user::

    <tmpdir_root>/corral-<provider_id>-<uid>/        0o700, owned by us
        ws-<session>-<random>/                       one workspace (mkdtemp)
        state/ws-<session>-<random>/marker.json      "this directory is ours"
        state/ws-<session>-<random>/snapshots/       its versions (manifests + metadata)
        store/                                       blobs every workspace's versions share
        .tmp-*, .trash-*                             conversions and removals in flight
        .stuck-*                                     leftovers a sweep could not remove

The uid in the base name keeps users sharing ``/tmp`` from colliding, and
the base is refused when another user owns it or anyone else may write to
it: on a shared ``/tmp`` a base planted by someone else could redirect every
workspace. The marker lives outside the workspace so the agent neither sees
nor edits it; a directory without one is not resolved.

A ref carries only the workspace's *name*, never a free path: resolve joins
it to the configured base after checking it against the name pattern, then
opens it with ``O_NOFOLLOW`` from the base's directory fd.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Iterator
from typing import Final

import attrs

from corral.provider import WorkspaceFailedError

from ._fdtree import remove_tree_at

log = logging.getLogger("corral.posix.layout")

__all__ = [
    "MARKER_NAME",
    "TmpdirLayout",
    "TmpdirRefPayload",
    "remove_tree",
    "sanitize_session_id",
]

MARKER_NAME: Final = "marker.json"
_STATE: Final = "state"
_SNAPSHOTS: Final = "snapshots"
_MAX_SID: Final = 32
_SCRATCH_MAX_AGE_S: Final = 3600
_STUCK_RETRY_S: Final = 24 * 3600
_SWEEP_INTERVAL_S: Final = 60.0
_SCRATCH_PREFIXES: Final = (".tmp-", ".trash-")
_STUCK_PREFIX: Final = ".stuck-"
_NAME_RE: Final = re.compile(r"ws-[A-Za-z0-9_-]{1,32}-[a-z0-9_]{8}")
_SID_BAD: Final = re.compile(r"[^A-Za-z0-9_-]")
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@attrs.frozen(kw_only=True)
class TmpdirRefPayload:
    """The ref payload of a tmpdir workspace: what resolve needs, nothing live or secret.

    Attributes:
        workspace: Directory name of the workspace under the base (not a path).
        base_dir: The base directory it was created under; resolve refuses a
            ref whose base differs from the provider's configured one.
        max_file_bytes: File size cap the filesystem was opened with.
        allow_leaf_symlinks: Whether the filesystem follows leaf symlinks.
    """

    workspace: str
    base_dir: str
    max_file_bytes: int = attrs.field(validator=attrs.validators.gt(0))
    allow_leaf_symlinks: bool = False


def sanitize_session_id(session_id: str) -> str:
    """A session id reduced to ``[A-Za-z0-9_-]``, at most 32 characters."""
    clean = _SID_BAD.sub("_", session_id)[:_MAX_SID]
    return clean or "_"


def remove_tree(path: str) -> None:
    """Remove a directory tree (or any entry) without following symlinks; missing is fine.

    Iterative and fd-bounded at any depth (:func:`remove_tree_at`): the
    workspace's content decides how deep the tree is, and CPython's
    ``shutil.rmtree`` recurses once per level before 3.13.

    Raises:
        OSError: Something could not be removed.
        OperationError: The tree was moved concurrently or kept refilling.
    """
    parent, name = os.path.split(os.path.normpath(path))
    try:
        parent_fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        remove_tree_at(parent_fd, name)
    finally:
        os.close(parent_fd)


_LAST_SWEEP: dict[str, float] = {}
"""When this process last swept each base directory (monotonic seconds)."""


class TmpdirLayout:
    """The directories of one provider under one ``tmpdir_root``.

    All methods block; callers run them in a worker thread.

    Args:
        provider_id: Names the base directory and the marker.
        tmpdir_root: Parent of the base directory; default the system temp dir.
    """

    def __init__(self, provider_id: str, tmpdir_root: str | os.PathLike[str] | None = None) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", provider_id):
            raise ValueError("provider_id must be a short lowercase identifier")
        root = os.fspath(tmpdir_root) if tmpdir_root is not None else tempfile.gettempdir()
        if not os.path.isabs(root):
            raise ValueError("tmpdir_root must be an absolute path")
        self.provider_id = provider_id
        self.tmpdir_root = os.path.realpath(root)
        self.base_dir = os.path.join(self.tmpdir_root, f"corral-{provider_id}-{os.geteuid()}")

    def _fail(self, message: str, *, transient: bool = False) -> WorkspaceFailedError:
        return WorkspaceFailedError(
            f"{self.provider_id}: {message}", provider_id=self.provider_id, transient=transient
        )

    # -- the base directory -------------------------------------------------

    @contextlib.contextmanager
    def _base_fd(self, *, create: bool) -> Iterator[int]:
        if create:
            try:
                os.makedirs(self.tmpdir_root, mode=0o700, exist_ok=True)
                os.mkdir(self.base_dir, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise self._fail("cannot create the workspace base directory") from exc
        try:
            fd = os.open(self.base_dir, _DIR_FLAGS)
        except FileNotFoundError:
            raise self._fail("workspace was lost: its base directory no longer exists") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._fail("the workspace base directory is not a real directory") from None
            raise self._fail("cannot open the workspace base directory") from exc
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                raise self._fail("the workspace base directory is owned by another user")
            if st.st_mode & 0o022:
                raise self._fail("the workspace base directory is writable by other users")
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o700)
            yield fd
        finally:
            os.close(fd)

    def check_base(self) -> None:
        """Create the base directory if needed and check who owns it.

        Raises:
            WorkspaceFailedError: The base is a symlink, not ours, or writable by others.
        """
        with self._base_fd(create=True):
            pass

    # -- paths ---------------------------------------------------------------

    def workspace_path(self, name: str) -> str:
        """Absolute path of a workspace directory (``name`` already validated)."""
        return os.path.join(self.base_dir, name)

    def state_path(self, name: str) -> str:
        """The per-workspace state directory (marker and snapshots)."""
        return os.path.join(self.base_dir, _STATE, name)

    def snapshot_path(self, name: str) -> str:
        """Where a workspace's versions live (and tarballs of the previous schema)."""
        return os.path.join(self.base_dir, _STATE, name, _SNAPSHOTS)

    def is_workspace_name(self, name: object) -> bool:
        """Whether a value has the shape of a workspace directory name."""
        return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None

    def session_workspaces(self, session_id: str) -> list[str]:
        """The workspaces created for ``session_id`` (by ``create_workspace``'s naming)."""
        # Exactly the prefix and the 8-character random part: a session "a" must
        # not take "ws-a-b-xxxxxxxx", which belongs to session "a-b".
        mine = re.compile(re.escape(f"ws-{sanitize_session_id(session_id)}-") + r"[a-z0-9_]{8}")
        try:
            names = os.listdir(self.base_dir)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if mine.fullmatch(n) and self.is_workspace_name(n))

    # -- lifecycle -----------------------------------------------------------

    def create_workspace(self, session_id: str) -> str:
        """Create a fresh, empty workspace and its state directory; return its name.

        Raises:
            WorkspaceFailedError: The base directory is unusable or the disk refused.
        """
        self.check_base()
        self._sweep_scratch()
        try:
            path = tempfile.mkdtemp(
                prefix=f"ws-{sanitize_session_id(session_id)}-", dir=self.base_dir
            )
        except OSError as exc:
            raise self._fail("cannot create the workspace directory", transient=True) from exc
        name = os.path.basename(path)
        try:
            os.makedirs(self.snapshot_path(name), mode=0o700, exist_ok=False)
            self._write_marker(name)
        except OSError as exc:
            self.remove_workspace(name)
            raise self._fail("cannot create the workspace state directory") from exc
        return name

    def _write_marker(self, name: str) -> None:
        body = json.dumps({"provider_id": self.provider_id, "workspace": name}).encode()
        final = os.path.join(self.state_path(name), MARKER_NAME)
        tmp = f"{final}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)

    def _marker_ok(self, base_fd: int, name: str) -> bool:
        try:
            state_fd = os.open(_STATE, _DIR_FLAGS, dir_fd=base_fd)
        except OSError:
            return False
        try:
            ws_state = os.open(name, _DIR_FLAGS, dir_fd=state_fd)
        except OSError:
            os.close(state_fd)
            return False
        os.close(state_fd)
        try:
            fd = os.open(
                MARKER_NAME,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=ws_state,
            )
        except OSError:
            return False
        finally:
            os.close(ws_state)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > 4096:
                return False
            data = json.loads(os.read(fd, 4096))
        except (OSError, ValueError):
            return False
        finally:
            os.close(fd)
        return bool(data == {"provider_id": self.provider_id, "workspace": name})

    def locate(self, payload: TmpdirRefPayload) -> str:
        """Check that a ref's workspace is one of ours and still there; return its path.

        Raises:
            WorkspaceFailedError: The ref points elsewhere than this provider's
                base, the directory is not a workspace of ours, or the
                workspace was lost (removed by close, a temp cleaner or a reboot).
        """
        if payload.base_dir != self.base_dir:
            raise self._fail("the workspace ref was made for a different tmpdir_root")
        if not self.is_workspace_name(payload.workspace):
            raise self._fail("the workspace ref does not name a workspace directory")
        name = payload.workspace
        with self._base_fd(create=False) as base_fd:
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=base_fd)
            except FileNotFoundError:
                raise self._fail(
                    "workspace was lost: its directory no longer exists (closed, or "
                    "removed by a temp cleaner or reboot); open a new workspace"
                ) from None
            except OSError:
                raise self._fail("the workspace ref does not name a workspace directory") from None
            try:
                if os.fstat(fd).st_uid != os.geteuid():
                    raise self._fail("the workspace directory is owned by another user")
            finally:
                os.close(fd)
            if not self._marker_ok(base_fd, name):
                raise self._fail("the directory named by the ref is not a workspace of ours")
        return self.workspace_path(name)

    def _sweep_scratch(self) -> None:
        """Remove scratch trees of restores and removals that crashed.

        Runs at the start of every open, so nothing in it may stop one: each
        entry's failure, whatever it is, is caught, counted and logged once
        per sweep. An entry that cannot be removed is renamed ``.stuck-*``
        (the rename refreshes its ctime) and retried only once a day, so one
        undeletable leftover does not make every open pay for it; and a
        process sweeps a base at most once a minute.
        """
        now = time.monotonic()
        last = _LAST_SWEEP.get(self.base_dir)
        if last is not None and now - last < _SWEEP_INTERVAL_S:
            return
        _LAST_SWEEP[self.base_dir] = now
        try:
            with os.scandir(self.base_dir) as it:
                entries = list(it)
        except OSError:
            return
        failed = 0
        for entry in entries:
            try:
                self._sweep_one(entry)
            except Exception:
                failed += 1
                self._set_aside(entry.name)
        if failed:
            log.warning(
                "%s: %d leftover scratch tree(s) under %s could not be removed; "
                "set aside as .stuck-* and retried daily",
                self.provider_id,
                failed,
                self.base_dir,
            )

    def _sweep_one(self, entry: os.DirEntry[str]) -> None:
        if entry.name.startswith(_SCRATCH_PREFIXES):
            # An hour is far longer than any restore: a live one is never touched.
            age_field, max_age = "st_mtime", _SCRATCH_MAX_AGE_S
        elif entry.name.startswith(_STUCK_PREFIX):
            age_field, max_age = "st_ctime", _STUCK_RETRY_S
        else:
            return
        st = entry.stat(follow_symlinks=False)
        if getattr(st, age_field) < time.time() - max_age:
            remove_tree(entry.path)

    def _set_aside(self, name: str) -> None:
        stuck = f"{_STUCK_PREFIX}{secrets.token_hex(6)}"
        try:
            os.rename(os.path.join(self.base_dir, name), os.path.join(self.base_dir, stuck))
        except Exception:
            log.debug("%s: cannot set aside a scratch tree", self.provider_id)

    def new_temp_dir(self, kind: str) -> str:
        """A private scratch directory beside the workspaces (``.tmp-``/``.trash-``)."""
        self.check_base()
        return tempfile.mkdtemp(prefix=f".{kind}-", dir=self.base_dir)

    def remove_workspace(self, name: str) -> None:
        """Remove a workspace, its marker and its snapshots; missing parts are fine.

        The directory is first renamed aside so it vanishes from resolve at
        once, even if the recursive removal is slow or interrupted.
        """
        if not self.is_workspace_name(name):
            raise ValueError("not a workspace name")
        path = self.workspace_path(name)
        trash = os.path.join(self.base_dir, f".trash-{name}")
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            trash = ""
        except OSError:
            trash = path
        if trash:
            remove_tree(trash)
        remove_tree(self.state_path(name))
