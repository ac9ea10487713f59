"""Tools of the ``process`` capability: background processes and terminals.

A process outlives the call that started it; the model reads its output *by
cursor*. A cursor is a byte offset into one stream, counted before any
decoding, exactly as :class:`corral.provider.ProcessManager` defines it. The
tools hand the model text, so each read decodes UTF-8 and must not cut a
character in two: a multi-byte character split by the edge of a read (the
``max_bytes`` limit, or a process that has written only part of it so far)
is held back whole, and ``next_cursor`` points at its first byte, so the next
read returns it complete. Only once the stream has ended is a dangling
partial character decoded (as U+FFFD). Bytes that are not UTF-8 at all
become U+FFFD too; the cursor arithmetic is unaffected, so nothing is
delivered twice or skipped.

Terminal tools drive a process under a pseudo-terminal: named keys are
translated to the bytes a keyboard sends (:data:`corral._terminal.KEYS`) and
the model reads the *rendered screen* (see :mod:`corral._terminal`).
"""

from __future__ import annotations

import codecs
import math
import weakref
from collections.abc import Sequence
from typing import Annotated, Final, Literal

import anyio
import anyio.abc
import attrs

from . import _tool_meta as meta
from ._errors import OperationError
from ._exec_tools import MAX_COMMAND_CHARS, env_name_ok, precheck_allowlist
from ._policies import ProcessPolicy
from ._process import (
    CursorExpiredError,
    ProcessInfo,
    ProcessManager,
    ProcessRequest,
    StreamChunk,
    StreamName,
    TerminalSize,
)
from ._schema import Arg
from ._terminal import KEYS, Screen, ScreenCache, require_pyte
from ._tool import ToolEnv, ToolHints, ToolSpec

__all__ = ["decode_chunk", "info_data", "process_tools"]

Data = dict[str, object]
ProcessEnv = ToolEnv[ProcessPolicy, ProcessManager]

DEFAULT_TERMINAL_COMMAND: Final = "sh"
"""What ``workspace_open_terminal`` runs when the model names no command."""

_SETTLE_S: Final = 0.1
"""After new terminal output, how long a quiet terminal must stay quiet before rendering."""

_SCREENS: Final = ScreenCache()

ProcessId = Annotated[
    str,
    Arg(
        "A process_id from workspace_start_process or workspace_list_processes",
        min_length=1,
        max_length=200,
    ),
]
TerminalId = Annotated[
    str, Arg("A terminal_id from workspace_open_terminal", min_length=1, max_length=200)
]
Command = Annotated[str, Arg("The command line to run", min_length=1, max_length=MAX_COMMAND_CHARS)]
Cwd = Annotated[
    str | None, Arg("Working directory in the workspace (default /)", max_length=4096, path=True)
]
Env = Annotated[
    dict[str, Annotated[str, Arg(max_length=32768)]], Arg("Extra environment variables")
]
Timeout = Annotated[
    float | None,
    Arg("Kill it (and every process it started) after this many seconds", minimum=0.001),
]
Cols = Annotated[int, Arg("Width in character cells", minimum=1, maximum=1000)]
Rows = Annotated[int, Arg("Height in character cells", minimum=1, maximum=1000)]


def _wait(text: str, default: float) -> object:
    return Arg(f"{text} (seconds, default {default:g})", minimum=0)


# -- arguments ----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StartProcessArgs:
    """``workspace_start_process``."""

    command: Command
    cwd: Cwd = None
    env: Env = attrs.field(factory=dict)
    timeout_s: Timeout = None
    wait_s: Annotated[float, _wait("How long to wait for first output", 1.0)] = 1.0


@attrs.frozen(kw_only=True)
class ReadOutputArgs:
    """``workspace_read_process_output``."""

    process_id: ProcessId
    stream: Annotated[Literal["stdout", "stderr"], Arg("Which output stream")] = "stdout"
    cursor: Annotated[
        int, Arg("Byte offset to read from: 0, or the next_cursor of the last read", minimum=0)
    ] = 0
    wait_s: Annotated[float, _wait("How long to wait when no new output is there yet", 0)] = 0.0
    max_bytes: Annotated[
        int | None, Arg("Most bytes to return (default and ceiling: the policy's)", minimum=4)
    ] = None


@attrs.frozen(kw_only=True)
class WriteInputArgs:
    """``workspace_write_process_input``."""

    process_id: ProcessId
    text: Annotated[str, Arg("Text sent to its standard input, as is", max_length=1_000_000)] = ""
    close_stdin: Annotated[bool, Arg("Then close its standard input (end of file)")] = False


@attrs.frozen(kw_only=True)
class KillProcessArgs:
    """``workspace_kill_process``."""

    process_id: ProcessId
    forget: Annotated[bool, Arg("Also discard its record and retained output")] = False


@attrs.frozen(kw_only=True)
class NoArgs:
    """``workspace_list_processes``."""


@attrs.frozen(kw_only=True)
class OpenTerminalArgs:
    """``workspace_open_terminal``."""

    command: Annotated[
        str | None,
        Arg(
            f"Program to run in the terminal (default: {DEFAULT_TERMINAL_COMMAND}, a shell)",
            min_length=1,
            max_length=MAX_COMMAND_CHARS,
        ),
    ] = None
    cwd: Cwd = None
    env: Env = attrs.field(factory=dict)
    cols: Cols = 80
    rows: Rows = 24
    timeout_s: Timeout = None
    wait_s: Annotated[float, _wait("How long to wait for the first screen", 0.5)] = 0.5


@attrs.frozen(kw_only=True)
class TerminalSendArgs:
    """``workspace_terminal_send``: ``text`` is typed first, then ``keys`` are pressed."""

    terminal_id: TerminalId
    text: Annotated[str | None, Arg("Text typed as is (no Enter is added)", max_length=100_000)] = (
        None
    )
    keys: Annotated[
        list[Annotated[str, Arg(choices=tuple(KEYS))]],
        Arg("Named keys pressed after the text, in order", max_items=200),
    ] = attrs.field(factory=list)
    wait_s: Annotated[float, _wait("How long to wait for the screen to update", 0.5)] = 0.5


@attrs.frozen(kw_only=True)
class TerminalScreenArgs:
    """``workspace_terminal_screen``."""

    terminal_id: TerminalId
    wait_s: Annotated[float, _wait("How long to wait for new output first", 0)] = 0.0


@attrs.frozen(kw_only=True)
class TerminalIdArgs:
    """``workspace_close_terminal``."""

    terminal_id: TerminalId


@attrs.frozen(kw_only=True)
class ResizeTerminalArgs:
    """``workspace_resize_terminal``."""

    terminal_id: TerminalId
    cols: Cols
    rows: Rows


# -- decoding and shapes ------------------------------------------------------------


def decode_chunk(data: bytes, *, ended: bool) -> tuple[str, int]:
    """Decode a chunk of UTF-8 output without cutting a character in two.

    Returns:
        ``(text, consumed)``: the text, and how many bytes of ``data`` it
        covers. A trailing partial character is left unconsumed (the next
        read starts at its first byte) unless the stream has ``ended``.
    """
    if ended:
        return data.decode("utf-8", "replace"), len(data)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(data, final=False)
    pending, _ = decoder.getstate()
    return text, len(data) - len(pending)


def info_data(info: ProcessInfo) -> Data:
    """The JSON shape of a :class:`ProcessInfo` for the model."""
    size = info.terminal
    return {
        "process_id": info.process_id,
        "command": info.command,
        "state": info.state,
        "exit_code": info.exit_code,
        "signal": info.signal,
        "started_at": info.started_at,
        "ended_at": info.ended_at,
        "terminal": None if size is None else {"cols": size.cols, "rows": size.rows},
        "stdout_end": info.stdout_end,
        "stderr_end": info.stderr_end,
        "stdout_start": info.stdout_start,
        "stderr_start": info.stderr_start,
        "stdin_open": info.stdin_open,
        "reason": info.reason,
    }


def _stream_data(chunk: StreamChunk, *, expired_from: int | None = None) -> Data:
    text, consumed = decode_chunk(chunk.data, ended=chunk.ended)
    next_cursor = chunk.cursor + consumed
    out: Data = {
        "text": text,
        "cursor": chunk.cursor,
        "next_cursor": next_cursor,
        # Ended only once everything up to the end was handed over as text.
        "ended": chunk.ended and next_cursor == chunk.next_cursor,
    }
    if expired_from is not None:
        out["expired_from"] = expired_from
    return out


def _expired(cursor: int, exc: CursorExpiredError) -> CursorExpiredError:
    return CursorExpiredError(
        f"cursor {cursor} is older than the retained output; "
        f"the earliest available cursor is {exc.earliest}",
        earliest=exc.earliest,
    )


async def _read_from(
    manager: ProcessManager,
    process_id: str,
    stream: StreamName,
    *,
    cursor: int,
    max_bytes: int,
    wait_s: float,
    resume_if_expired: bool,
) -> Data:
    try:
        chunk = await manager.read(
            process_id, stream, cursor=cursor, max_bytes=max_bytes, wait_s=wait_s
        )
    except CursorExpiredError as exc:
        if not resume_if_expired:
            raise _expired(cursor, exc) from None
        chunk = await manager.read(
            process_id, stream, cursor=exc.earliest, max_bytes=max_bytes, wait_s=wait_s
        )
        return _stream_data(chunk, expired_from=cursor)
    return _stream_data(chunk)


def _check_env(env: dict[str, str]) -> None:
    for name in env:
        if not env_name_ok(name):
            raise OperationError(
                "argument 'env': variable names must match [A-Za-z_][A-Za-z0-9_]*",
                code="invalid_argument",
            )


def _check_max(value: float, limit: float, name: str) -> None:
    if value > limit:
        raise OperationError(
            f"argument {name!r}: must be at most {limit:g} (the policy's limit)",
            code="invalid_argument",
        )


def _check_finite(value: float, name: str) -> None:
    if not math.isfinite(value):
        raise OperationError(f"argument {name!r}: must be a finite number", code="invalid_argument")


# -- starting -----------------------------------------------------------------------

_START_LOCKS: weakref.WeakKeyDictionary[object, anyio.Lock] = weakref.WeakKeyDictionary()


def _start_lock(manager: object) -> anyio.Lock:
    """One lock per manager: counting running processes and starting one is atomic."""
    try:
        lock = _START_LOCKS.get(manager)
        if lock is None:
            lock = _START_LOCKS[manager] = anyio.Lock()
    except TypeError:  # not weakly referenceable: each call checks on its own
        return anyio.Lock()
    return lock


async def _start(
    env: ProcessEnv,
    *,
    command: str,
    cwd: str | None,
    extra_env: dict[str, str],
    timeout_s: float | None,
    wait_s: float,
    terminal: TerminalSize | None,
) -> ProcessInfo:
    policy = env.policy
    if not command.strip():
        raise OperationError("argument 'command': must not be empty", code="invalid_argument")
    timeout = policy.timeout_s if timeout_s is None else timeout_s
    _check_finite(timeout, "timeout_s")
    _check_max(timeout, policy.max_timeout_s, "timeout_s")
    _check_finite(wait_s, "wait_s")
    _check_max(wait_s, policy.max_wait_s, "wait_s")
    _check_env(extra_env)
    precheck_allowlist(command, policy.allowed_commands, policy.allow_shell_syntax)
    request = ProcessRequest(
        command=command,
        cwd=cwd,
        env={**policy.env, **extra_env},
        terminal=terminal,
        timeout_s=timeout,
        retained_bytes=policy.retained_bytes,
        allowed_commands=policy.allowed_commands,
        allow_shell_syntax=policy.allow_shell_syntax,
    )
    manager = await env.module()
    async with _start_lock(manager):
        running = sum(1 for p in await manager.list() if p.state == "running")
        if running >= policy.max_processes:
            raise OperationError(
                f"{running} processes are running, the policy's limit is "
                f"{policy.max_processes}: kill one first",
                code="busy",
            )
        return await manager.start(request)


async def _first_output(manager: ProcessManager, process_id: str, wait_s: float) -> None:
    """Wait up to ``wait_s`` until either stream has a byte, or both ended.

    Servers often log to stderr only: waiting on stdout alone would make
    every such start take the whole wait.
    """
    if wait_s <= 0:
        return

    async def watch(stream: StreamName, group: anyio.abc.TaskGroup) -> None:
        try:
            chunk = await manager.read(process_id, stream, cursor=0, max_bytes=1, wait_s=wait_s)
        except CursorExpiredError:
            chunk = None  # output already flowed past the window: there is output
        if chunk is None or chunk.data:
            group.cancel_scope.cancel()

    with anyio.move_on_after(wait_s):
        async with anyio.create_task_group() as group:
            group.start_soon(watch, "stdout", group)
            group.start_soon(watch, "stderr", group)


async def _start_process(env: ProcessEnv, args: StartProcessArgs) -> Data:
    info = await _start(
        env,
        command=args.command,
        cwd=args.cwd,
        extra_env=args.env,
        timeout_s=args.timeout_s,
        wait_s=args.wait_s,
        terminal=None,
    )
    manager = await env.module()
    limit = env.policy.max_read_bytes
    pid = info.process_id
    await _first_output(manager, pid, args.wait_s)
    stdout = await _read_from(
        manager, pid, "stdout", cursor=0, max_bytes=limit, wait_s=0, resume_if_expired=True
    )
    stderr = await _read_from(
        manager, pid, "stderr", cursor=0, max_bytes=limit, wait_s=0, resume_if_expired=True
    )
    return {**info_data(await manager.info(pid)), "stdout": stdout, "stderr": stderr}


# -- reading, writing, killing, listing ----------------------------------------------


async def _read_output(env: ProcessEnv, args: ReadOutputArgs) -> Data:
    policy = env.policy
    _check_finite(args.wait_s, "wait_s")
    _check_max(args.wait_s, policy.max_wait_s, "wait_s")
    max_bytes = policy.max_read_bytes if args.max_bytes is None else args.max_bytes
    _check_max(max_bytes, policy.max_read_bytes, "max_bytes")
    manager = await env.module()
    out = await _read_from(
        manager,
        args.process_id,
        args.stream,
        cursor=args.cursor,
        max_bytes=max_bytes,
        wait_s=args.wait_s,
        resume_if_expired=False,
    )
    info = await manager.info(args.process_id)
    return {
        "process_id": args.process_id,
        "stream": args.stream,
        **out,
        "state": info.state,
        "exit_code": info.exit_code,
        "signal": info.signal,
    }


async def _write_input(env: ProcessEnv, args: WriteInputArgs) -> Data:
    if not args.text and not args.close_stdin:
        raise OperationError(
            "give some text, or close_stdin: true, or both", code="invalid_argument"
        )
    manager = await env.module()
    data = args.text.encode("utf-8")
    if data:
        await manager.write_stdin(args.process_id, data)
    if args.close_stdin:
        await manager.close_stdin(args.process_id)
    info = await manager.info(args.process_id)
    return {
        "process_id": args.process_id,
        "bytes_written": len(data),
        "stdin_open": info.stdin_open,
    }


async def _kill_process(env: ProcessEnv, args: KillProcessArgs) -> Data:
    manager = await env.module()
    info = await manager.kill(args.process_id)
    if args.forget:
        await manager.remove(args.process_id)
        _SCREENS.forget(manager, args.process_id)
    return {**info_data(info), "forgotten": args.forget}


async def _list_processes(env: ProcessEnv, args: NoArgs) -> Data:
    manager = await env.module()
    return {"processes": [info_data(p) for p in await manager.list()]}


# -- terminals -----------------------------------------------------------------------


async def _settle(manager: ProcessManager, terminal_id: str, wait_s: float) -> None:
    """Wait up to ``wait_s`` for output, then until the terminal is briefly quiet.

    Only what the screen shows depends on this wait, never a cursor: a later
    render shows whatever arrived after it.
    """
    if wait_s <= 0:
        return
    info = await manager.info(terminal_id)
    cursor = info.stdout_end
    got_output = False
    with anyio.move_on_after(wait_s):
        while True:
            chunk = await manager.read(
                terminal_id,
                "stdout",
                cursor=cursor,
                max_bytes=1 << 20,
                wait_s=_SETTLE_S if got_output else wait_s,
            )
            if chunk.ended or (got_output and not chunk.data):
                return
            got_output = got_output or bool(chunk.data)
            cursor = chunk.next_cursor


async def _screen_data(manager: ProcessManager, terminal_id: str) -> Data:
    screen = await _SCREENS.render(manager, terminal_id)
    info = await manager.info(terminal_id)
    return {
        "terminal_id": terminal_id,
        **_screen_fields(screen),
        "state": info.state,
        "exit_code": info.exit_code,
    }


def _screen_fields(screen: Screen) -> Data:
    return {
        "screen": screen.text,
        "cursor_row": screen.cursor_row,
        "cursor_col": screen.cursor_col,
        "cols": screen.cols,
        "rows": screen.rows,
        "next_cursor": screen.next_cursor,
        "partial": screen.partial,
    }


async def _terminal(manager: ProcessManager, terminal_id: str) -> ProcessInfo:
    info = await manager.info(terminal_id)
    if info.terminal is None:
        raise OperationError(
            "that process has no terminal: use the process tools for it", code="invalid_argument"
        )
    return info


async def _open_terminal(env: ProcessEnv, args: OpenTerminalArgs) -> Data:
    require_pyte()  # before starting a process nobody could see
    info = await _start(
        env,
        command=args.command if args.command is not None else DEFAULT_TERMINAL_COMMAND,
        cwd=args.cwd,
        extra_env=args.env,
        timeout_s=args.timeout_s,
        wait_s=args.wait_s,
        terminal=TerminalSize(cols=args.cols, rows=args.rows),
    )
    manager = await env.module()
    await _settle(manager, info.process_id, args.wait_s)
    return await _screen_data(manager, info.process_id)


async def _terminal_send(env: ProcessEnv, args: TerminalSendArgs) -> Data:
    _check_finite(args.wait_s, "wait_s")
    _check_max(args.wait_s, env.policy.max_wait_s, "wait_s")
    data = (args.text or "").encode("utf-8") + b"".join(KEYS[key] for key in args.keys)
    if not data:
        raise OperationError("give some text or keys to send", code="invalid_argument")
    manager = await env.module()
    await _terminal(manager, args.terminal_id)
    await manager.write_stdin(args.terminal_id, data)
    await _settle(manager, args.terminal_id, args.wait_s)
    return await _screen_data(manager, args.terminal_id)


async def _terminal_screen(env: ProcessEnv, args: TerminalScreenArgs) -> Data:
    _check_finite(args.wait_s, "wait_s")
    _check_max(args.wait_s, env.policy.max_wait_s, "wait_s")
    manager = await env.module()
    await _terminal(manager, args.terminal_id)
    await _settle(manager, args.terminal_id, args.wait_s)
    return await _screen_data(manager, args.terminal_id)


async def _close_terminal(env: ProcessEnv, args: TerminalIdArgs) -> Data:
    manager = await env.module()
    await _terminal(manager, args.terminal_id)
    info = await manager.kill(args.terminal_id)
    await manager.remove(args.terminal_id)
    _SCREENS.forget(manager, args.terminal_id)
    return {
        "terminal_id": args.terminal_id,
        "closed": True,
        "state": info.state,
        "exit_code": info.exit_code,
    }


async def _resize_terminal(env: ProcessEnv, args: ResizeTerminalArgs) -> Data:
    manager = await env.module()
    await _terminal(manager, args.terminal_id)
    await manager.resize(args.terminal_id, TerminalSize(cols=args.cols, rows=args.rows))
    return {"terminal_id": args.terminal_id, "cols": args.cols, "rows": args.rows}


# -- rendering for the model --------------------------------------------------------


def _status(data: Data) -> str:
    state = str(data.get("state"))
    if data.get("exit_code") is not None:
        return f"{state}, exit code {data['exit_code']}"
    if data.get("signal") is not None:
        return f"{state}, signal {data['signal']}"
    return state


def _stream_text(name: str, stream: object) -> str:
    assert isinstance(stream, dict)
    head = f"{name} [{stream['cursor']}, {stream['next_cursor']})"
    if stream.get("expired_from") is not None:
        head += f" (bytes before {stream['cursor']} expired)"
    if stream["ended"]:
        head += " ended"
    body = str(stream["text"])
    return f"--- {head} ---\n{body}" if body else f"--- {head}: no output ---"


def render_started(data: Data) -> str:
    """``workspace_start_process``: the handle, its state, its first output."""
    return "\n".join(
        [
            f"process {data['process_id']} ({_status(data)})",
            _stream_text("stdout", data["stdout"]),
            _stream_text("stderr", data["stderr"]),
            "Read more with workspace_read_process_output from each next_cursor.",
        ]
    )


def render_output(data: Data) -> str:
    """``workspace_read_process_output``: the text and where to resume."""
    return (
        f"process {data['process_id']} ({_status(data)}); next_cursor={data['next_cursor']}\n"
        + _stream_text(str(data["stream"]), data)
    )


def render_screen(data: Data) -> str:
    """The terminal tools: the rendered screen, framed, with the cursor's position."""
    head = (
        f"terminal {data['terminal_id']} ({_status(data)}), {data['cols']}x{data['rows']}, "
        f"cursor at row {data['cursor_row']} col {data['cursor_col']}, "
        f"output up to byte {data['next_cursor']}"
    )
    if data.get("partial"):
        head += " (older output expired: the screen may miss what it drew)"
    return f"{head}\n{'=' * 20}\n{data['screen']}\n{'=' * 20}"


def render_list(data: Data) -> str:
    """``workspace_list_processes``: one line per process."""
    processes = data["processes"]
    assert isinstance(processes, list)
    if not processes:
        return "no processes"
    lines = []
    for p in processes:
        kind = "terminal" if p["terminal"] is not None else "process"
        lines.append(
            f"{kind} {p['process_id']} ({_status(p)}) stdout {p['stdout_end']} B, "
            f"stderr {p['stderr_end']} B: {p['command']}"
        )
    return "\n".join(lines)


# -- schemas and specs --------------------------------------------------------------

_INFO_FIELDS: Final[dict[str, object]] = {
    "process_id": "string",
    "command": "string",
    "state": {"enum": ["running", "exited", "killed", "lost"]},
    "exit_code": "integer?",
    "signal": "integer?",
    "started_at": "number",
    "ended_at": "number?",
    "terminal": {"type": ["object", "null"]},
    "stdout_end": "integer",
    "stderr_end": "integer",
    "stdout_start": "integer",
    "stderr_start": "integer",
    "stdin_open": "boolean",
    "reason": "string?",
}
_STREAM_FIELDS: Final[dict[str, object]] = {
    "text": "string",
    "cursor": "integer",
    "next_cursor": "integer",
    "ended": "boolean",
}
PROCESS_INFO: Final = meta.output(_INFO_FIELDS)
STARTED: Final = meta.output(
    {
        **_INFO_FIELDS,
        "stdout": meta.output(_STREAM_FIELDS, {"expired_from": "integer"}),
        "stderr": meta.output(_STREAM_FIELDS, {"expired_from": "integer"}),
    }
)
OUTPUT: Final = meta.output(
    {
        "process_id": "string",
        "stream": {"enum": ["stdout", "stderr"]},
        **_STREAM_FIELDS,
        "state": {"enum": ["running", "exited", "killed", "lost"]},
        "exit_code": "integer?",
        "signal": "integer?",
    }
)
WRITTEN: Final = meta.output(
    {"process_id": "string", "bytes_written": "integer", "stdin_open": "boolean"}
)
KILLED: Final = meta.output({**_INFO_FIELDS, "forgotten": "boolean"})
LISTED: Final = meta.output({"processes": meta.array_of(PROCESS_INFO)})
SCREEN: Final = meta.output(
    {
        "terminal_id": "string",
        "screen": "string",
        "cursor_row": "integer",
        "cursor_col": "integer",
        "cols": "integer",
        "rows": "integer",
        "next_cursor": "integer",
        "partial": "boolean",
        "state": {"enum": ["running", "exited", "killed", "lost"]},
        "exit_code": "integer?",
    }
)
CLOSED: Final = meta.output(
    {"terminal_id": "string", "closed": "boolean", "state": "string", "exit_code": "integer?"}
)
RESIZED: Final = meta.output({"terminal_id": "string", "cols": "integer", "rows": "integer"})

_READS_OUTPUT: Final = ToolHints(
    read_only=True, destructive=False, idempotent=True, open_world=False
)
"""Reading output or a screen changes nothing (a wait only waits)."""


def _limits(policy: ProcessPolicy) -> dict[str, Arg]:
    return {
        "wait_s": Arg(maximum=policy.max_wait_s),
        "timeout_s": Arg(maximum=policy.max_timeout_s),
    }


def process_tools(policy: ProcessPolicy) -> Sequence[ToolSpec[ProcessPolicy, ProcessManager]]:
    """The process tools, and the terminal tools when the policy allows terminals."""
    allowed = (
        f" Allowed programs: {', '.join(policy.allowed_commands)}."
        if policy.allowed_commands is not None
        else ""
    )
    syntax = (
        "Shell syntax is allowed."
        if policy.allow_shell_syntax
        else "One program with arguments, no shell syntax."
    )
    limits = _limits(policy)
    wait_only = {"wait_s": limits["wait_s"]}
    tools: list[ToolSpec[ProcessPolicy, ProcessManager]] = [
        ToolSpec(
            "workspace_start_process",
            "Start a command in the background (a server, a watcher, a long build) and return "
            "its process_id with its first output; it keeps running while you work. "
            f"{syntax}{allowed} At most {policy.max_processes} run at once; each is killed "
            f"after {policy.timeout_s:g}s unless timeout_s says otherwise.",
            StartProcessArgs,
            _start_process,
            render=render_started,
            refine=limits,
            hints=meta.RUNS,
            output_schema=STARTED,
        ),
        ToolSpec(
            "workspace_read_process_output",
            "Read a background process's output from a byte cursor (0, or the next_cursor of "
            "your last read: nothing is repeated or skipped), optionally waiting for new "
            f"output. At most the last {policy.retained_bytes} bytes of each stream are kept.",
            ReadOutputArgs,
            _read_output,
            render=render_output,
            refine={**wait_only, "max_bytes": Arg(maximum=policy.max_read_bytes)},
            hints=_READS_OUTPUT,
            output_schema=OUTPUT,
        ),
        ToolSpec(
            "workspace_write_process_input",
            "Send text to a background process's standard input, optionally closing it.",
            WriteInputArgs,
            _write_input,
            hints=meta.RUNS,
            output_schema=WRITTEN,
        ),
        ToolSpec(
            "workspace_kill_process",
            "Kill a background process and everything it started; forget: true also discards "
            "its record and output.",
            KillProcessArgs,
            _kill_process,
            hints=meta.DESTROYS,
            output_schema=KILLED,
        ),
        ToolSpec(
            "workspace_list_processes",
            "List the workspace's processes and terminals with their state and output sizes.",
            NoArgs,
            _list_processes,
            render=render_list,
            hints=meta.READS,
            output_schema=LISTED,
        ),
    ]
    if policy.terminal:
        tools += [
            ToolSpec(
                "workspace_open_terminal",
                "Open an interactive terminal (a shell by default, or a full-screen program) "
                "and return its terminal_id and rendered screen.",
                OpenTerminalArgs,
                _open_terminal,
                render=render_screen,
                refine=limits,
                hints=meta.RUNS,
                output_schema=SCREEN,
            ),
            ToolSpec(
                "workspace_terminal_send",
                "Type text and/or press named keys (Enter, Tab, Escape, Backspace, Up, Down, "
                "Left, Right, Ctrl-C, ...) in a terminal; returns the screen afterwards. Text "
                "is typed as is: press Enter to submit a line.",
                TerminalSendArgs,
                _terminal_send,
                render=render_screen,
                refine=wait_only,
                hints=meta.RUNS,
                output_schema=SCREEN,
            ),
            ToolSpec(
                "workspace_terminal_screen",
                "Show a terminal's screen as a person would see it, optionally after waiting "
                "for new output.",
                TerminalScreenArgs,
                _terminal_screen,
                render=render_screen,
                refine=wait_only,
                hints=_READS_OUTPUT,
                output_schema=SCREEN,
            ),
            ToolSpec(
                "workspace_resize_terminal",
                "Change a terminal's size in character cells.",
                ResizeTerminalArgs,
                _resize_terminal,
                hints=meta.OVERWRITES,
                output_schema=RESIZED,
            ),
            ToolSpec(
                "workspace_close_terminal",
                "Close a terminal: kill what runs in it and discard its output.",
                TerminalIdArgs,
                _close_terminal,
                hints=meta.DESTROYS,
                output_schema=CLOSED,
            ),
        ]
    return tools
