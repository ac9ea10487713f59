"""The CommandWrapper seam: how OS sandboxes re-shape an already-guarded command.

A wrapper runs *after* every CommandChecker check (allowlist, metacharacters,
environment denylist, cwd containment) and may only re-shape the launch: it
turns the guarded argv into the argv that is actually executed (for example
``bwrap ... -- sh -c CMD``), and may change the environment the launcher sees,
hand the launcher extra fds, or move its working directory.  It never gets a
chance to weaken the guards because it only sees their output.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs

__all__ = [
    "IDENTITY_WRAPPER",
    "CommandWrapper",
    "IdentityWrapper",
    "WrapContext",
    "WrappedCommand",
    "fd_path",
    "wrap_guarded",
]


@attrs.frozen
class WrapContext:
    """What a wrapper knows about the command it wraps.

    Attributes:
        root: Host path of the workspace root.
        cwd: Host path of the command's working directory (inside ``root``).
        env: The guarded environment the command should see.
    """

    root: str
    cwd: str
    env: Mapping[str, str]


@attrs.frozen
class WrappedCommand:
    """The launch a wrapper asks the shell to perform.

    Attributes:
        argv: The argv actually executed; ``argv[0]`` is looked up on the
            ``PATH`` of ``env``.
        env: Environment to launch ``argv[0]`` with.
        pass_fds: File descriptors the launcher needs inherited (e.g. the
            ``bwrap --seccomp FD`` program).
        cwd: Host working directory for the launcher; ``None`` means
            ``ctx.cwd``.
        signal_as_status: The launcher reports the command's death by
            signal ``n`` as exit status ``128 + n`` (bubblewrap's monitor
            does, as ``docker exec`` does), so statuses 129-159 are decoded
            back into ``ExecResult.signal``; an explicit ``exit 137`` is then
            indistinguishable from SIGKILL, which is the boundary's limit.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    pass_fds: tuple[int, ...] = ()
    cwd: str | None = None
    signal_as_status: bool = False


@runtime_checkable
class CommandWrapper(Protocol):
    """Turns a guarded argv into the launch that is executed."""

    def wrap(self, argv: Sequence[str], ctx: WrapContext) -> WrappedCommand:
        """Return the launch for ``argv``.

        Args:
            argv: The argv the guard approved (``["sh", "-c", cmd]`` in
                shell-syntax mode).
            ctx: Root, working directory and guarded environment.

        Returns:
            The command to launch.
        """
        ...


@attrs.frozen
class IdentityWrapper:
    """The wrapper that changes nothing: runs ``argv`` in ``ctx.cwd`` with ``ctx.env``."""

    def wrap(self, argv: Sequence[str], ctx: WrapContext) -> WrappedCommand:
        """Return ``argv`` unchanged with the guarded environment.

        Args:
            argv: The guarded argv.
            ctx: Root, working directory and guarded environment.

        Returns:
            ``WrappedCommand(tuple(argv), dict(ctx.env))``.
        """
        return WrappedCommand(argv=tuple(argv), env=dict(ctx.env))


IDENTITY_WRAPPER: CommandWrapper = IdentityWrapper()
"""The shared no-op wrapper used when a shell is given no wrapper."""


def fd_path(fd: int) -> str | None:
    """The path the kernel has for an open fd (``/proc/self/fd``), or None."""
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/self/fd/{fd}")
    return None


def wrap_guarded(
    wrapper: CommandWrapper,
    argv: Sequence[str],
    *,
    root: str,
    cwd_fd: int,
    cwd_parts: Sequence[str],
    env: Mapping[str, str],
) -> WrappedCommand:
    """What ``wrapper`` makes of a guarded command whose working directory is ``cwd_fd``.

    The identity wrapper is answered without asking the kernel where the
    directory is (a ``readlink`` on a command's way to its first output);
    any other gets the directory's host path (``root`` joined with
    ``cwd_parts`` when ``/proc`` has none).
    """
    if type(wrapper) is IdentityWrapper:
        return WrappedCommand(argv=tuple(argv), env=env)
    host_cwd = fd_path(cwd_fd) or os.path.join(root, *cwd_parts)
    return wrapper.wrap(argv, WrapContext(root, host_cwd, env))
