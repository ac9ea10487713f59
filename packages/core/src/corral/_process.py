"""The ``process`` module: long-running processes and terminals with byte-offset cursors.

A command run through :class:`corral.provider.Shell` returns when it ends; a
process started through :class:`ProcessManager` keeps running while the agent
works, and its output is read *by cursor*: a cursor is a byte offset into one
stream (counted before any decoding), so a reader that resumes from the
``next_cursor`` it was given never sees a byte twice and never skips one
silently. Each stream keeps a bounded *retained window* of its most recent
bytes; a cursor older than the window is a :class:`CursorExpiredError` that
names the earliest cursor still available.

A process with a pseudo-terminal (``pty`` set at start) has one output
stream, ``stdout`` (the terminal merges both); its ``stderr`` is empty and
ended from the start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal, Protocol, runtime_checkable

import attrs

from ._data import _frozen_mapping, _optional_names
from ._errors import OperationError

__all__ = [
    "DEFAULT_RETAINED_BYTES",
    "CursorExpiredError",
    "ProcessInfo",
    "ProcessManager",
    "ProcessRequest",
    "ProcessState",
    "StreamChunk",
    "StreamName",
    "TerminalSize",
]

ProcessState = Literal["running", "exited", "killed", "lost"]
"""``running``; ``exited`` (by itself, with an exit code or a signal);
``killed`` (by :meth:`ProcessManager.kill`, or by the workspace closing);
``lost`` (the process that supervised it died -- a crash of the host
program, say -- so its end was never observed)."""

StreamName = Literal["stdout", "stderr"]
"""An output stream of a process."""

DEFAULT_RETAINED_BYTES: Final = 8 << 20
"""Bytes of each stream kept for readers by default (older bytes expire)."""


class CursorExpiredError(OperationError):
    """A cursor points before the retained window of a stream.

    Attributes:
        earliest: The earliest cursor of the stream still readable.
    """

    def __init__(self, message: str, *, earliest: int) -> None:
        super().__init__(message, code="cursor_expired")
        self.earliest = earliest


@attrs.frozen
class TerminalSize:
    """A pseudo-terminal's size in character cells (1-1000 each)."""

    cols: int = attrs.field(
        default=80,
        validator=attrs.validators.and_(
            attrs.validators.instance_of(int), attrs.validators.ge(1), attrs.validators.le(1000)
        ),
    )
    rows: int = attrs.field(
        default=24,
        validator=attrs.validators.and_(
            attrs.validators.instance_of(int), attrs.validators.ge(1), attrs.validators.le(1000)
        ),
    )


@attrs.frozen
class ProcessRequest:
    """A process to start, with the limits the policy put on it.

    The command is guarded exactly as :class:`corral.provider.CommandRequest`
    is (``allowed_commands``, ``allow_shell_syntax``, the environment
    denylist, ``cwd`` inside the workspace) before anything starts.

    Attributes:
        command: The command line (as for the shell module).
        cwd: Agent path of the working directory (None: the workspace root).
        env: Extra environment variables.
        terminal: Run under a pseudo-terminal of this size (None: pipes).
        timeout_s: Kill the process tree after this many seconds (None: no
            limit but the workspace's life).
        retained_bytes: Bytes of each output stream kept for readers: at
            most this many (a flood of output cannot grow past it) and at
            least the most recent half of them (room for keeping output in
            pieces that expire whole).
        allowed_commands: As for :class:`corral.provider.CommandRequest`.
        allow_shell_syntax: As for :class:`corral.provider.CommandRequest`.
    """

    command: str
    cwd: str | None = None
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_mapping)
    terminal: TerminalSize | None = None
    timeout_s: float | None = None
    retained_bytes: int = DEFAULT_RETAINED_BYTES
    allowed_commands: frozenset[str] | None = attrs.field(default=None, converter=_optional_names)
    allow_shell_syntax: bool = False


@attrs.frozen
class ProcessInfo:
    """What is known of one process (a snapshot; ask again for news).

    Attributes:
        process_id: The handle's id, unique within the workspace.
        command: The command line it was started with.
        state: See :data:`ProcessState`.
        exit_code: Exit status when it exited normally, else None.
        signal: The signal that ended it, else None.
        started_at: Unix time it started.
        ended_at: Unix time its end was observed (None while running or lost).
        terminal: Its pseudo-terminal's current size, or None.
        stdout_end: Bytes ``stdout`` has produced so far (the cursor after
            the last byte).
        stderr_end: The same for ``stderr``.
        stdout_start: The earliest ``stdout`` cursor still readable.
        stderr_start: The same for ``stderr``.
        stdin_open: Whether :meth:`ProcessManager.write_stdin` is accepted.
        reason: Why it is ``lost`` or ``killed``, else None: exactly
            ``"timeout"`` when its ``timeout_s`` ran out (streamed results
            read ``timed_out`` from it); free text otherwise (workspace
            closed, supervisor died...).
    """

    process_id: str
    command: str
    state: ProcessState
    exit_code: int | None = None
    signal: int | None = None
    started_at: float = 0.0
    ended_at: float | None = None
    terminal: TerminalSize | None = None
    stdout_end: int = 0
    stderr_end: int = 0
    stdout_start: int = 0
    stderr_start: int = 0
    stdin_open: bool = False
    reason: str | None = None


@attrs.frozen
class StreamChunk:
    """Bytes of one stream read from a cursor.

    Attributes:
        data: The bytes at ``[cursor, next_cursor)``.
        cursor: Where ``data`` starts (the cursor asked for).
        next_cursor: The cursor to resume from.
        ended: The stream is finished and ``next_cursor`` is its end: no
            byte will ever follow.
    """

    data: bytes
    cursor: int
    next_cursor: int
    ended: bool


@runtime_checkable
class ProcessManager(Protocol):
    """Long-running processes of a workspace (the ``process`` module).

    Processes belong to the workspace, not to a call: they run until they
    end, are killed, time out or the workspace closes (which kills every
    one of them, with their whole process trees). Each runs inside the same
    boundary as the shell's commands. Output and final state are recorded
    in the workspace's state as they arrive: after the program hosting the
    provider dies, a resolve still lists each handle with its retained
    output, and a process whose end was never observed reads as ``lost``.

    Errors: an unknown id is ``OperationError(code="not_found")``; a guard
    refusal is raised by :meth:`start` before anything runs (codes as for the
    shell); every method raises ``closed`` after the workspace closed.
    """

    async def start(self, request: ProcessRequest) -> ProcessInfo:
        """Start a process and return its handle's first info (state ``running``).

        A program that does not exist or cannot be executed is not an
        exception: the process exits 127 or 126 as the shell's would.
        """
        ...

    async def read(
        self,
        process_id: str,
        stream: StreamName = "stdout",
        *,
        cursor: int = 0,
        max_bytes: int = 65536,
        wait_s: float = 0.0,
    ) -> StreamChunk:
        """Up to ``max_bytes`` bytes of ``stream`` from ``cursor``.

        With no byte at ``cursor`` yet, waits up to ``wait_s`` seconds for
        one (or for the stream's end) and then returns what it has, possibly
        nothing. ``cursor`` may lie beyond the current end of a running
        stream (the read waits for bytes to reach it); beyond the end of an
        ended stream is ``invalid_argument``.

        Raises:
            CursorExpiredError: ``cursor`` is before the retained window.
            OperationError: ``invalid_argument`` for a negative cursor, a
                ``max_bytes`` below 1, a negative ``wait_s``.
        """
        ...

    async def write_stdin(self, process_id: str, data: bytes) -> None:
        """Send bytes to the process's stdin (or its terminal's input).

        Raises:
            OperationError: ``closed`` when its stdin was closed or the
                process ended.
        """
        ...

    async def close_stdin(self, process_id: str) -> None:
        """Close the process's stdin (EOF; on a terminal, sends EOF). Idempotent."""
        ...

    async def wait(self, process_id: str, *, timeout_s: float) -> ProcessInfo:
        """Wait up to ``timeout_s`` for the process to end; return its info either way."""
        ...

    async def signal(self, process_id: str, signal: int) -> None:
        """Send ``signal`` to the process (its process group). No-op once it ended."""
        ...

    async def kill(self, process_id: str) -> ProcessInfo:
        """Kill the process and its whole tree; return its final info (idempotent)."""
        ...

    async def resize(self, process_id: str, size: TerminalSize) -> None:
        """Resize the process's terminal.

        Raises:
            OperationError: ``invalid_argument`` when it has no terminal.
        """
        ...

    async def info(self, process_id: str) -> ProcessInfo:
        """What is known of one process now."""
        ...

    async def list(self) -> Sequence[ProcessInfo]:
        """Every process of the workspace (running or not), oldest first."""
        ...

    async def remove(self, process_id: str) -> None:
        """Forget an ended process and its retained output.

        Raises:
            OperationError: ``invalid_argument`` while it is running.
        """
        ...
