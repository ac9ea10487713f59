"""Open a path beneath a directory fd without ever leaving it.

Two resolvers give the same answers (a property test holds them to it):

* ``openat2`` -- the kernel resolves the whole path with
  ``RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS``: one syscall, race-free by
  construction. Python has no wrapper, so it is called through ``ctypes``.
* ``walk`` -- for kernels or sandboxes without ``openat2``: one ``openat`` per
  component with ``O_NOFOLLOW``, symlinks read with ``readlinkat`` and resolved
  lexically against the stack of directory fds already open. ``..`` pops that
  stack and never the kernel's view, so no rename or symlink swap can carry
  the walk above the root fd.

Both follow relative symlinks that stay beneath the root, refuse absolute ones
and ones that climb out, and give up after 40 links (the kernel's limit).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import stat
from collections import deque
from collections.abc import Sequence
from typing import Any, Final, Literal

from corral.provider import ErrorCode, OperationError

__all__ = ["Resolver", "errno_code", "open_beneath", "openat2_available"]

Resolver = Literal["auto", "openat2", "walk"]

_SYS_OPENAT2: Final = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())
_RESOLVE_NO_MAGICLINKS: Final = 0x02
_RESOLVE_BENEATH: Final = 0x08
_MAXSYMLINKS: Final = 40
_AT_FDCWD: Final = -100
_EAGAIN_RETRIES: Final = 16
_DIR_FLAGS: Final = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_ERRNO_CODES: Final[dict[int, ErrorCode]] = {
    errno.ENOENT: "not_found",
    errno.ENOTDIR: "not_a_directory",
    errno.EISDIR: "is_a_directory",
    errno.EEXIST: "exists",
    errno.ENOTEMPTY: "not_empty",
    errno.EXDEV: "invalid_path",
    errno.ELOOP: "invalid_path",
    errno.ENAMETOOLONG: "invalid_path",
    errno.EINVAL: "invalid_path",
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
    errno.EROFS: "permission_denied",
    errno.ENXIO: "unsupported_file_type",
    errno.ENODEV: "unsupported_file_type",
    errno.ETXTBSY: "permission_denied",
    errno.EFBIG: "too_large",
    errno.ENOSPC: "too_large",
    errno.EDQUOT: "too_large",
}

_ERRNO_WORDS: Final[dict[int, str]] = {
    errno.ENOENT: "does not exist",
    errno.ENOTDIR: "has a non-directory where a directory is needed",
    errno.EISDIR: "is a directory",
    errno.EEXIST: "already exists",
    errno.ENOTEMPTY: "is a non-empty directory",
    errno.EXDEV: "escapes the workspace root",
    errno.ELOOP: "is or goes through a symlink that is not allowed here",
    errno.EACCES: "is not accessible",
    errno.EPERM: "is not accessible",
}


def errno_code(err: int) -> ErrorCode:
    """Map an errno value to the corral error code it stands for."""
    return _ERRNO_CODES.get(err, "failed")


def _fail(err: int, parts: Sequence[str]) -> OperationError:
    where = "/" + "/".join(parts)
    words = _ERRNO_WORDS.get(err) or os.strerror(err).lower()
    return OperationError(f"{where} {words}", code=errno_code(err))


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


@functools.cache
def _syscall() -> Any:
    """libc's ``syscall(2)``, or None where it cannot be loaded."""
    if _SYS_OPENAT2 is None:
        return None
    try:
        func = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_long
    func.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
    return func


def _raw_openat2(dirfd: int, path: bytes, flags: int, mode: int, resolve: int) -> int:
    """One openat2 call; returns the fd or ``-errno``."""
    how = _OpenHow(flags, mode, resolve)
    fd: int = _syscall()(_SYS_OPENAT2, dirfd, path, ctypes.byref(how), ctypes.sizeof(how))
    return fd if fd >= 0 else -ctypes.get_errno()


@functools.cache
def openat2_available() -> bool:
    """Whether this kernel (and any seccomp filter around us) allows ``openat2``."""
    if _syscall() is None:
        return False
    fd = _raw_openat2(
        _AT_FDCWD, b".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 0, _RESOLVE_BENEATH
    )
    if fd < 0:
        return False
    os.close(fd)
    return True


def _open_openat2(
    root_fd: int, parts: Sequence[str], flags: int, mode: int, *, follow_leaf: bool, strict: bool
) -> int | None:
    """Resolve in the kernel; ``None`` means "use the walk instead".

    ``strict`` (the caller asked for openat2 by name) turns a refused syscall
    into an error instead of a fallback.
    """
    path = os.fsencode("/".join(parts)) if parts else b"."
    flags |= os.O_CLOEXEC
    if not follow_leaf:
        flags |= os.O_NOFOLLOW
    resolve = _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS
    if not (flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE):
        mode = 0  # openat2, unlike openat, rejects a mode it would not use
    for _ in range(_EAGAIN_RETRIES):
        fd = _raw_openat2(root_fd, path, flags, mode, resolve)
        if fd >= 0:
            return fd
        err = -fd
        if err in (errno.EINTR, errno.EAGAIN):
            # EAGAIN: a concurrent rename raced a ".." lookup; the kernel asks us to retry.
            continue
        if err == errno.ENOSYS:
            if strict:
                raise OperationError("openat2 is not available on this system", code="unsupported")
            return None
        if err == errno.EPERM and not strict:
            # A seccomp filter, or a real EPERM that the walk reports just the same.
            return None
        raise _fail(err, parts)
    # Renames kept racing our ".." lookups; the walk never asks the kernel for "..".
    return None


def _readlink(name: str, dir_fd: int) -> str | None:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise


def _is_link(fd: int) -> bool:
    if stat.S_ISLNK(os.fstat(fd).st_mode):
        os.close(fd)
        return True
    return False


def _open_walk(root_fd: int, parts: Sequence[str], flags: int, mode: int, follow_leaf: bool) -> int:
    flags |= os.O_CLOEXEC | os.O_NOFOLLOW
    stack = [root_fd]
    pending = deque(parts)
    links = 0
    try:
        while pending:
            comp = pending.popleft()
            if comp == ".":
                continue
            if comp == "..":
                if len(stack) == 1:
                    raise _fail(errno.EXDEV, parts)
                os.close(stack.pop())
                continue
            leaf = not pending
            try:
                if leaf:
                    fd = os.open(comp, flags, mode, dir_fd=stack[-1])
                    if not (follow_leaf and flags & os.O_PATH and _is_link(fd)):
                        return fd
                    # O_PATH|O_NOFOLLOW opened the link itself; follow it instead.
                    raise OSError(errno.ELOOP, "symlink")  # noqa: TRY301
                stack.append(os.open(comp, _DIR_FLAGS, dir_fd=stack[-1]))
                continue
            except OSError as exc:
                # A symlink under O_NOFOLLOW fails with ELOOP, or ENOTDIR when a
                # directory was required; anything else is the real answer.
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise _fail(exc.errno or errno.EIO, parts) from None
                target = _readlink(comp, stack[-1])
                if target is None or (leaf and not follow_leaf):
                    raise _fail(exc.errno, parts) from None
            links += 1
            if links > _MAXSYMLINKS:
                raise _fail(errno.ELOOP, parts)
            if target.startswith("/"):
                raise _fail(errno.EXDEV, parts)
            # An empty component ("a//b", trailing "/") demands a directory, as "." does.
            pending.extendleft(reversed([c or "." for c in target.split("/")]))
        return os.open(".", flags & ~os.O_NOFOLLOW, mode, dir_fd=stack[-1])
    except OSError as exc:
        raise _fail(exc.errno or errno.EIO, parts) from None
    finally:
        for fd in stack[1:]:
            os.close(fd)


def open_beneath(
    root_fd: int,
    parts: Sequence[str],
    flags: int,
    mode: int = 0o600,
    *,
    resolver: Resolver = "auto",
    follow_leaf: bool = False,
) -> int:
    """Open ``parts`` beneath ``root_fd`` without ever leaving it.

    ``parts`` are lexically clean components from :func:`corral.provider.path_parts`;
    ``()`` opens the root itself. Relative symlinks are followed while they
    stay beneath the root; a symlink as the last component is refused
    (``invalid_path``) unless ``follow_leaf``, except with ``O_PATH``, which
    opens the link itself, as the kernel does.

    Args:
        root_fd: Directory fd every lookup starts from and stays beneath.
        parts: Path components relative to the root.
        flags: ``os.open`` flags; ``O_CLOEXEC`` is always added.
        mode: Permission bits for ``O_CREAT``.
        resolver: ``openat2`` (kernel), ``walk`` (component by component) or
            ``auto`` (``openat2`` when the kernel allows it).
        follow_leaf: Follow a symlink in the last component (still confined).

    Returns:
        A new file descriptor the caller owns.

    Raises:
        OperationError: ``not_found``, ``not_a_directory``, ``is_a_directory``,
            ``exists``, ``invalid_path`` (escape, symlink leaf, loop),
            ``permission_denied``, or ``unsupported`` when ``resolver="openat2"``
            and the kernel does not offer it.
    """
    if resolver != "walk":
        if openat2_available():
            fd = _open_openat2(
                root_fd, parts, flags, mode, follow_leaf=follow_leaf, strict=resolver == "openat2"
            )
            if fd is not None:
                return fd
        elif resolver == "openat2":
            raise OperationError("openat2 is not available on this system", code="unsupported")
    return _open_walk(root_fd, parts, flags, mode, follow_leaf)
