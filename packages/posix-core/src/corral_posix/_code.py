"""The ``code`` module: stateful Python contexts inside a provider's boundary.

Each context is one long-lived ``python3 -I -u`` running ``_codedriver.py``
over a framed byte channel. :class:`DriverCodeInterpreter` is the contract
(contexts, cells, timeouts, lost and busy, records) and knows nothing about
how the interpreter is started: a :class:`CodeLauncher` starts it and hands
back a :class:`CodeChannel` (its stdin, its stdout, and a way to kill its
whole tree). That seam is what lets docker drive the same driver through an
attached exec stream in the container.

:class:`PosixCodeInterpreter` is the tmpdir providers' flavour: the
interpreter is launched exactly like a shell command, through the
workspace's :class:`CommandWrapper` (so under bubblewrap with the shell's
mounts, seccomp, network policy and cgroup on local-sandbox) by a pooled
reaper of the process supervisor, which owns the whole process tree. The
reaper's stdin pipe and stdout messages are the channel; the reaper kills
every process the context started when the context is deleted, the
workspace closes, or this host process dies (its socket closes).

Truthfulness over convenience: a context whose interpreter died is ``lost``
(with the reason) until deleted or explicitly restarted; nothing is ever
swapped for a fresh interpreter behind the caller's back. Contexts are
recorded in the workspace's state directory, so a process that resolves the
workspace later reports the earlier process's contexts as lost instead of
"not found".
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from importlib import resources
from typing import Any, Final, Literal, Protocol

import anyio
import anyio.to_thread
import attrs

from corral.provider import (
    CodeContextInfo,
    CodeOutput,
    CodeState,
    ExecError,
    ExecResult,
    OperationError,
    WorkspaceEvictedError,
)

from ._checker import CommandChecker
from ._env import StartEnvironment
from ._reaper import FINAL, KIND_ERRNO
from ._shell import ProcessLimits, _fd_array, _send
from ._supervisor import POOL, Reaper, encode_limits, encode_request
from ._wrapper import IDENTITY_WRAPPER, CommandWrapper, WrapContext, wrap_guarded

__all__ = [
    "DRIVER_ARGS",
    "CellChecks",
    "ChannelLost",
    "CodeChannel",
    "CodeLauncher",
    "DriverCodeInterpreter",
    "OutputCallback",
    "PosixCodeInterpreter",
    "exit_status_reason",
]

OutputCallback = Callable[[str, str], object]
"""``on_output(stream, text)``: a cell's output as it arrives (``stream`` is stdout or stderr)."""

_BOOTSTRAP: Final = (
    "import os\n"
    "def _r(n):\n"
    "    b = b''\n"
    "    while len(b) < n:\n"
    "        c = os.read(0, n - len(b))\n"
    "        if not c: raise SystemExit(3)\n"
    "        b += c\n"
    "    return b\n"
    "exec(compile(_r(int.from_bytes(_r(4), 'big')), '<corral-driver>', 'exec'))\n"
)
DRIVER_ARGS: Final = ("-I", "-u", "-c", _BOOTSTRAP)
"""The interpreter's arguments (after the program name): read the driver from stdin, run it."""
_FOREVER_S: Final = 10.0 * 365 * 86400
_NO_CAP: Final = 1 << 62
_RECV: Final = (1 << 16) + 64
_START_TIMEOUT_S: Final = 30.0
_INTERRUPT_GRACE_S: Final = 2.0
_KILL_WAIT_S: Final = 10.0
_MAX_FRAME: Final = 256 << 20
_MAX_OUTPUTS_BYTES: Final = 32 << 20
_STATE_FILE: Final = "code-contexts.json"
_LANGUAGE: Final = "python"


def _driver_source() -> bytes:
    return resources.files(__package__).joinpath("_codedriver.py").read_bytes()


class CellChecks(Protocol):
    """The isolation's guards around work that runs in the box (``ProcessChecks`` is one).

    ``before_start`` is awaited before a context starts and before every
    cell (raising refuses it: over the disk quota, a protected path dirty);
    ``monitor`` runs in a thread after every cell and returns why the
    workspace is no longer in order, or None.
    """

    @property
    def before_start(self) -> Callable[[], Awaitable[None]] | None:
        """Awaited before each start; raises to refuse."""
        ...

    @property
    def monitor(self) -> Callable[[], str | None] | None:
        """Blocking check after each cell; a reason when something is wrong."""
        ...


class ChannelLost(Exception):
    """The driver's channel ended; ``reason`` says how (never the driver's output)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_Lost = ChannelLost


class CodeChannel(Protocol):
    """The byte channel to one running driver, and the means to end its process tree.

    Implementations: the reaper's pipe and socket here; an attached exec
    stream in docker.
    """

    async def send(self, data: bytes) -> None:
        """Write ``data`` to the driver's stdin.

        Raises:
            ChannelLost: The driver no longer reads (it ended or was killed).
        """
        ...

    async def receive(self) -> bytes:
        """The next bytes of the driver's stdout (never empty).

        Cancelling a pending receive must lose no bytes: the next call
        returns them.

        Raises:
            ChannelLost: The driver ended; ``reason`` says how (its exit
                status or signal), or it was killed by :meth:`kill`.
        """
        ...

    async def kill(self) -> None:
        """Kill every process the driver started and release the channel (bounded wait).

        Idempotent; a :meth:`receive` pending in another task ends with
        :class:`ChannelLost`.
        """
        ...


class CodeLauncher(Protocol):
    """Starts the interpreter of one context inside the provider's boundary."""

    async def launch(self, cwd: str | None, args: Sequence[str]) -> CodeChannel:
        """Run the box's Python with ``args`` in ``cwd`` (agent view, None: the root).

        Raises:
            OperationError: The cwd is refused or missing, or the
                interpreter could not be started.
            WorkspaceEvictedError: The workspace is gone.
        """
        ...


class _Context:
    """One live (or dead) context: its channel and the frames read from it."""

    def __init__(self, context_id: str, language: str, cwd: str | None) -> None:
        self.id, self.language, self.cwd = context_id, language, cwd
        self.created_at = time.time()
        self.channel: CodeChannel | None = None
        self.buffer = bytearray()
        self.lost: str | None = None
        self.lock = anyio.Lock()
        self.running = 0
        self.cells = 0
        self.pid = 0
        self.on_output: OutputCallback | None = None

    def info(self) -> CodeContextInfo:
        status: Literal["idle", "busy", "lost"] = (
            "lost" if self.lost else "busy" if self.running else "idle"
        )
        return CodeContextInfo(
            context_id=self.id,
            language=self.language,
            cwd=self.cwd,
            created_at=self.created_at,
            status=status,
            lost_reason=self.lost,
        )


class DriverCodeInterpreter:
    """Code contexts driven over :class:`CodeChannel` s (implements ``CodeContexts``).

    Args:
        launcher: Starts each context's interpreter inside the boundary.
        languages: The languages the box really has (empty: no Python).
        state_dir: The workspace's private state directory (the record of
            contexts lives there, so a later process knows they were lost).
        max_output_bytes: Cap of each stream per run (flagged when hit).
        busy_wait_s: How long a call waits for the context's running cell
            before it is refused as ``busy``.
        checks: The isolation's guards, run around every cell as the
            decorated shell runs them around every command.
        details: Further facts for ``describe()``.
        adopted_reason: Why contexts recorded by a process that has ended
            are lost (default: they ended with it).
        unavailable: Why the box has no language at all (what is missing),
            told to every caller asking for one.
    """

    def __init__(
        self,
        launcher: CodeLauncher,
        *,
        languages: frozenset[str],
        state_dir: str,
        max_output_bytes: int = 1_000_000,
        busy_wait_s: float = 5.0,
        checks: CellChecks | None = None,
        details: Mapping[str, Any] | None = None,
        adopted_reason: str | None = None,
        unavailable: str | None = None,
    ) -> None:
        self._launcher = launcher
        self._unavailable = unavailable
        self._languages = languages
        self._state_file = os.path.join(state_dir, _STATE_FILE)
        self._max_output = max_output_bytes
        self._busy_wait_s = busy_wait_s
        self._checks = checks
        self._details = dict(details or {})
        self._contexts: dict[str, _Context] = {}
        self._closed = False
        self._adopt_records(adopted_reason)

    # -- the CodeInterpreter contract ----------------------------------------------

    @property
    def languages(self) -> frozenset[str]:
        """``python`` when the interpreter exists in the box (and ``bash`` with it), else empty."""
        return self._languages

    async def run_code(
        self,
        language: str,
        code: str,
        *,
        timeout_s: float,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        """Run ``code`` in a throwaway context (``state="fresh"``), killed afterwards.

        ``on_output(stream, text)`` is called as output arrives (``stdout``/``stderr``).
        """
        self._check_language(language)
        ctx = _Context("run-" + secrets.token_hex(6), language, None)
        ctx.on_output = on_output
        try:
            await self._start(ctx)
            result = await self._execute(ctx, code, timeout_s)
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop(ctx)
        return _with_state(result, "lost" if result.state == "lost" else "fresh")

    async def create_context(self, language: str, *, cwd: str | None = None) -> str:
        """Start a context; see :class:`corral.provider.CodeContexts`."""
        self._check_open()
        self._check_language(language)
        ctx = _Context("ctx-" + secrets.token_hex(8), language, cwd)
        try:
            await self._start(ctx)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._stop(ctx)
            raise
        if self._closed:
            # The workspace closed while this context started: it must not outlive it.
            with anyio.CancelScope(shield=True):
                await self._stop(ctx, "the workspace closed")
            self._check_open()
        self._contexts[ctx.id] = ctx
        await self._save_records()
        return ctx.id

    async def run_in_context(
        self,
        context_id: str,
        code: str,
        *,
        timeout_s: float,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        """Run a cell in a context (one at a time; waits ``busy_wait_s`` for the previous).

        ``on_output(stream, text)`` is called as output arrives (``stdout``/``stderr``).
        """
        ctx = self._get(context_id)
        with anyio.move_on_after(self._busy_wait_s) as waited:
            await ctx.lock.acquire()
        if waited.cancelled_caught:
            raise OperationError(
                "the code context is busy running another cell; try again later or interrupt it",
                code="busy",
            )
        try:
            self._check_alive(ctx)
            ctx.on_output = on_output
            return await self._execute(ctx, code, timeout_s)
        finally:
            ctx.on_output = None
            ctx.lock.release()

    async def delete_context(self, context_id: str) -> None:
        """Kill the context's interpreter and everything it started; forget the context."""
        ctx = self._get(context_id)
        self._contexts.pop(context_id, None)
        with anyio.CancelScope(shield=True):
            await self._stop(ctx)
            await self._save_records()

    async def list_contexts(self) -> Sequence[CodeContextInfo]:
        """Every context of this workspace, oldest first, lost ones included."""
        return [c.info() for c in sorted(self._contexts.values(), key=lambda c: c.created_at)]

    async def restart_context(self, context_id: str) -> None:
        """Kill the context's interpreter (if alive) and start a new one under the same id."""
        ctx = self._get(context_id)
        await self.interrupt_context(context_id)
        async with ctx.lock:
            await self._stop(ctx)
            fresh = _Context(ctx.id, ctx.language, ctx.cwd)
            fresh.lock = ctx.lock
            await self._start(fresh)
            self._contexts[ctx.id] = fresh
        await self._save_records()

    async def interrupt_context(self, context_id: str) -> bool:
        """Send the running cell a KeyboardInterrupt; False when none was running."""
        ctx = self._get(context_id)
        if ctx.lost or not ctx.running:
            return False
        await self._write(ctx, {"op": "interrupt", "id": ctx.running})
        return True

    async def aclose(self) -> None:
        """Kill every context's process tree (bounded wait); later calls fail ``closed``."""
        self._closed = True
        contexts = list(self._contexts.values())
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for ctx in contexts:
                    tg.start_soon(self._stop, ctx, "the workspace closed")
            self._contexts.clear()
            await self._save_records()

    def details(self) -> dict[str, Any]:
        """Facts for ``describe()``: the languages the box really has."""
        facts = {"code_languages": sorted(self._languages), **self._details}
        if not self._languages and self._unavailable:
            facts["code_unavailable"] = self._unavailable
        return facts

    # -- checks -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise OperationError("the code interpreter is closed", code="closed")

    def _check_language(self, language: str) -> None:
        self._check_open()
        if not self._languages and self._unavailable:
            raise OperationError(
                f"code is not available in this workspace: {self._unavailable}",
                code="invalid_argument",
            )
        if language not in self._languages:
            available = ", ".join(sorted(self._languages)) or "none"
            shown = f"{language!r} " if len(language) <= 32 else ""
            raise OperationError(
                f"language {shown}is not available in this workspace (available: {available})",
                code="invalid_argument",
            )

    def _get(self, context_id: str) -> _Context:
        self._check_open()
        ctx = self._contexts.get(context_id)
        if ctx is None:
            raise OperationError("no code context with this id", code="not_found")
        return ctx

    @staticmethod
    def _check_alive(ctx: _Context) -> None:
        if ctx.lost is not None:
            raise OperationError(
                f"the code context was lost ({ctx.lost}); its variables are gone: delete it "
                "and create a new one",
                code="lost",
            )

    # -- records: what a later process must report as lost ---------------------------

    def _adopt_records(self, adopted_reason: str | None) -> None:
        try:
            with open(self._state_file, encoding="utf-8") as fh:
                record = json.load(fh)
            owner = int(record.get("pid", 0))
            entries = record.get("contexts", [])
        except (OSError, ValueError, TypeError, AttributeError):
            return
        if owner == os.getpid():
            why = "it belongs to another open handle of this workspace"
        elif owner and _alive(owner):
            why = "its interpreter belonged to another process that is still running"
        else:
            why = adopted_reason or "its interpreter ended with the process that created it"
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                continue
            ctx = _Context(entry["id"][:64], str(entry.get("language", _LANGUAGE))[:32], None)
            ctx.created_at = float(entry.get("created_at", 0.0) or 0.0)
            ctx.lost = why
            self._contexts[ctx.id] = ctx

    async def _save_records(self) -> None:
        record = {
            "pid": os.getpid(),
            "contexts": [
                {"id": c.id, "language": c.language, "created_at": c.created_at}
                for c in self._contexts.values()
            ],
        }
        await anyio.to_thread.run_sync(self._write_record, record)

    def _write_record(self, record: dict[str, Any]) -> None:
        tmp = f"{self._state_file}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(record, fh)
            os.replace(tmp, self._state_file)

    # -- the process ----------------------------------------------------------------

    async def _before(self) -> None:
        check = self._checks.before_start if self._checks is not None else None
        if check is not None:
            await check()

    async def _after(self, result: ExecResult) -> ExecResult:
        monitor = self._checks.monitor if self._checks is not None else None
        if monitor is None:
            return result
        reason = await anyio.to_thread.run_sync(monitor)
        if reason is None:
            return result
        note = f"corral: {reason}; further cells and commands are refused\n"
        return attrs.evolve(result, stderr=result.stderr + note)

    async def _start(self, ctx: _Context) -> None:
        await self._before()
        ctx.channel = await self._launcher.launch(ctx.cwd, DRIVER_ARGS)
        source = _driver_source()
        try:
            with anyio.fail_after(_START_TIMEOUT_S):
                await ctx.channel.send(len(source).to_bytes(4, "big") + source)
                ready = await self._event(ctx)
        except TimeoutError:
            raise OperationError("the interpreter did not start in time", code="failed") from None
        except _Lost as lost:
            raise OperationError(
                f"the interpreter could not start ({lost.reason})", code="failed"
            ) from None
        if ready.get("ev") != "ready":
            raise OperationError("the interpreter did not start", code="failed")
        ctx.pid = int(ready.get("pid", 0) or 0)

    async def _stop(self, ctx: _Context, reason: str = "it was deleted") -> None:
        """Kill the context's tree and wait (bounded) until it is gone."""
        channel, ctx.channel = ctx.channel, None
        if ctx.lost is None:
            ctx.lost = reason
        if channel is not None:
            await channel.kill()

    async def _write(self, ctx: _Context, message: dict[str, Any]) -> None:
        body = json.dumps(message).encode()
        channel = ctx.channel
        if channel is None:
            return
        with contextlib.suppress(_Lost):
            await channel.send(len(body).to_bytes(4, "big") + body)

    async def _event(self, ctx: _Context) -> dict[str, Any]:
        """The next frame from the driver; raises :class:`ChannelLost` when it ended."""
        while True:
            if len(ctx.buffer) >= 4:
                size = int.from_bytes(ctx.buffer[:4], "big")
                if size > _MAX_FRAME:
                    await self._kill(ctx, "its channel was corrupted")
                    raise _Lost(ctx.lost or "its channel was corrupted")
                if len(ctx.buffer) >= 4 + size:
                    body = bytes(ctx.buffer[4 : 4 + size])
                    del ctx.buffer[: 4 + size]
                    try:
                        event = json.loads(body)
                    except ValueError:
                        await self._kill(ctx, "its channel was corrupted")
                        raise _Lost(ctx.lost or "its channel was corrupted") from None
                    if isinstance(event, dict):
                        return event
                    continue
            channel = ctx.channel
            if channel is None:
                raise _Lost(ctx.lost or "it was deleted")
            try:
                ctx.buffer += await channel.receive()
            except _Lost as ended:
                # Stopped by another task (ctx.lost says why), or the driver ended.
                await self._kill(ctx, ctx.lost or ended.reason)
                raise _Lost(ctx.lost or ended.reason) from None

    async def _kill(self, ctx: _Context, reason: str) -> None:
        """Mark the context lost and kill its tree (waits, bounded, until it is gone)."""
        with anyio.CancelScope(shield=True):
            await self._stop(ctx, reason)

    async def _execute(self, ctx: _Context, code: str, timeout_s: float) -> ExecResult:
        await self._before()
        result = await self._execute_cell(ctx, code, timeout_s)
        with anyio.CancelScope(shield=True):
            return await self._after(result)
        raise AssertionError("unreachable: a shielded scope is never cancelled")

    async def _execute_cell(self, ctx: _Context, code: str, timeout_s: float) -> ExecResult:
        ctx.cells += 1
        cell = ctx.cells
        out: list[str] = []
        err: list[str] = []
        started = time.perf_counter()
        done: dict[str, Any] | None = None
        timed_out = False
        try:
            ctx.running = cell
            await self._write(
                ctx,
                {
                    "op": "exec",
                    "id": cell,
                    "code": code,
                    "limit": self._max_output,
                    "language": ctx.language,
                },
            )
            with anyio.move_on_after(timeout_s):
                done = await self._collect(ctx, cell, out, err)
            if done is None:
                timed_out = True
                done = await self._interrupt_or_kill(ctx, cell, out, err, "timed out")
        except _Lost:
            done = None
        except BaseException:
            # Cancelled mid-cell: stop the cell so the next call finds the context idle.
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(_Lost):
                    await self._interrupt_or_kill(ctx, cell, out, err, "was cancelled")
            raise
        finally:
            ctx.running = 0
        duration_ms = (time.perf_counter() - started) * 1000.0
        return _result(done, out, err, duration_ms, timed_out, ctx.lost)

    async def _interrupt_or_kill(
        self, ctx: _Context, cell: int, out: list[str], err: list[str], why: str
    ) -> dict[str, Any] | None:
        """Interrupt the cell; kill the context if it does not stop within the grace."""
        await self._write(ctx, {"op": "interrupt", "id": cell})
        with anyio.move_on_after(_INTERRUPT_GRACE_S):
            return await self._collect(ctx, cell, out, err)
        await self._kill(ctx, f"killed: the cell {why} and ignored the interrupt")
        return None

    async def _collect(
        self, ctx: _Context, cell: int, out: list[str], err: list[str]
    ) -> dict[str, Any]:
        while True:
            event = await self._event(ctx)
            if event.get("id") != cell:
                continue  # a late frame of an earlier, abandoned cell
            kind = event.get("ev")
            if kind == "stream":
                text = str(event.get("text", ""))
                name = "stderr" if event.get("name") == "stderr" else "stdout"
                (err if name == "stderr" else out).append(text)
                if ctx.on_output is not None:
                    ctx.on_output(name, text)
            elif kind == "done":
                return event


class PosixCodeInterpreter(DriverCodeInterpreter):
    """Python (and bash) code contexts of one tmpdir workspace (implements ``CodeContexts``).

    Args:
        root: Host path of the workspace root (the contexts' default cwd).
        state_dir: The workspace's private state directory (the record of
            contexts lives there, so a later process knows they were lost).
        wrapper: The workspace's command wrapper (bubblewrap on local-sandbox).
        base_env: Operator-trusted variables every context gets.
        limits: rlimits of every context's process tree.
        python: The interpreter to run, found on the box's ``PATH``
            (``python3``) or an absolute path.
        max_output_bytes: Cap of each stream per run (flagged when hit).
        busy_wait_s: How long a call waits for the context's running cell
            before it is refused as ``busy``.
        checks: The isolation's guards (disk quota, protected paths), run
            around every cell as the decorated shell runs them around
            every command.
        provider_id: Named in :class:`corral.WorkspaceEvictedError`.
    """

    def __init__(
        self,
        root: str,
        *,
        state_dir: str,
        wrapper: CommandWrapper | None = None,
        base_env: Mapping[str, str] | None = None,
        limits: ProcessLimits | None = None,
        python: str = "python3",
        max_output_bytes: int = 1_000_000,
        busy_wait_s: float = 5.0,
        checks: CellChecks | None = None,
        provider_id: str | None = None,
    ) -> None:
        launcher = _ReaperLauncher(
            os.path.abspath(root),
            wrapper or IDENTITY_WRAPPER,
            dict(base_env or {}),
            encode_limits((limits or ProcessLimits()).rlimits()),
            python,
            provider_id,
        )
        self.root = launcher.root
        super().__init__(
            launcher,
            languages=launcher.find_languages(),
            state_dir=state_dir,
            max_output_bytes=max_output_bytes,
            busy_wait_s=busy_wait_s,
            checks=checks,
            details={"code_python": python},
        )


class _ReaperLauncher:
    """Starts interpreters through the command wrapper, by a pooled reaper of the supervisor."""

    def __init__(  # noqa: PLR0917 - one private call site, every argument named there
        self,
        root: str,
        wrapper: CommandWrapper,
        base_env: dict[str, str],
        limits: bytes,
        python: str,
        provider_id: str | None,
    ) -> None:
        self.root = root
        self._wrapper = wrapper
        self._env = StartEnvironment(root, base_env)
        self._limits = limits
        self._python = python
        self._provider_id = provider_id

    def find_languages(self) -> frozenset[str]:
        """``python`` when the interpreter is in the box; ``bash`` and ``javascript`` too
        when bash and node are (the Python driver hosts their sessions)."""
        env = dict(self._env.get())  # the wrapper gets its own copy
        try:
            wrapped = self._wrapper.wrap([self._python], WrapContext(self.root, self.root, env))
        except OperationError:
            return frozenset()
        path = wrapped.env.get("PATH", "")
        if os.path.isabs(self._python):
            found = os.access(self._python, os.X_OK)
        else:
            found = shutil.which(self._python, path=path) is not None
        if not found:
            return frozenset()
        hosted = {"bash": "bash", "javascript": "node"}
        return frozenset(
            {_LANGUAGE}
            | {lang for lang, program in hosted.items() if shutil.which(program, path=path)}
        )

    async def launch(self, cwd: str | None, args: Sequence[str]) -> CodeChannel:
        """Start ``python args`` wrapped like a shell command; see :class:`CodeLauncher`."""
        try:
            root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise WorkspaceEvictedError(
                "the workspace directory no longer exists", provider_id=self._provider_id
            ) from None
        try:
            cwd_fd = CommandChecker.open_cwd(root_fd, cwd)
        finally:
            os.close(root_fd)
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        channel: _ReaperChannel | None = None
        try:
            wrapped = wrap_guarded(
                self._wrapper,
                [self._python, *args],
                root=self.root,
                cwd_fd=cwd_fd,
                cwd_parts=(),  # no /proc: the root
                env={**self._env.get(), "MPLBACKEND": "Agg"},
            )
            passed = [cwd_fd, in_r, *wrapped.pass_fds]
            payload = encode_request(
                argv=wrapped.argv,
                env=wrapped.env,
                cwd=wrapped.cwd,
                timeout_s=_FOREVER_S,
                limit=_NO_CAP,
                stdin_index=1,
                cwd_index=0,
                passes=[(2 + i, target) for i, target in enumerate(wrapped.pass_fds)],
            )
            reaper = await POOL.acquire(self._limits, fresh=True)
            channel = _ReaperChannel(reaper, in_w)
            sent = await _send(reaper, payload, _fd_array(passed))
            channel.seq = reaper.seq
        except BaseException:
            with anyio.CancelScope(shield=True):
                if channel is not None:
                    await channel.kill()
                else:
                    os.close(in_w)
            raise
        finally:
            os.close(in_r)
            os.close(cwd_fd)
        if not sent:
            with anyio.CancelScope(shield=True):
                await channel.kill()
            raise OperationError("could not start the interpreter", code="failed")
        os.set_blocking(in_w, False)
        return channel


class _ReaperChannel:
    """A driver's stdin pipe and the reaper socket carrying its stdout and end."""

    def __init__(self, reaper: Reaper, stdin_w: int) -> None:
        self._reaper: Reaper | None = reaper
        self._stdin_w = stdin_w
        self.seq = 0
        self._ended = False
        self._reading = False

    async def send(self, data: bytes) -> None:
        """Write everything to the driver's stdin pipe; see :class:`CodeChannel`."""
        view = memoryview(data)
        while view:
            if self._stdin_w < 0:
                raise _Lost("its input channel is closed")
            try:
                view = view[os.write(self._stdin_w, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._stdin_w)
            except BrokenPipeError:
                raise _Lost("its interpreter stopped reading") from None

    async def receive(self) -> bytes:
        """The driver's next stdout bytes; see :class:`CodeChannel`."""
        while True:
            reaper = self._reaper
            if reaper is None:
                raise _Lost("it was deleted")
            self._reading = True
            try:
                message = await _recv(reaper)
            finally:
                self._reading = False
            if self._reaper is None:  # killed by another task meanwhile
                raise _Lost("it was deleted")
            tag = message[:1]
            if tag == b"1":
                if len(message) > 1:
                    return message[1:]
            elif tag != b"2":  # b"2": the driver's own stderr, a crash report, never shown
                # Already over: nothing to kill, the reaper reaped the whole tree.
                self._ended = True
                raise _Lost(_exit_reason(message))

    async def kill(self) -> None:
        """Kill the tree through the reaper and wait (bounded) until it says it is gone."""
        if self._stdin_w >= 0:
            os.close(self._stdin_w)
            self._stdin_w = -1
        reaper, self._reaper = self._reaper, None
        if reaper is None:
            return
        if not self._ended:
            reaper.kill(self.seq)
            if self._reading:
                # A cell of another task is reading this socket: wake it (it
                # reports the context lost) and let the reaper finish the kill.
                anyio.notify_closing(reaper.sock)
            else:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_KILL_WAIT_S):
                    while True:
                        message = await _recv(reaper)
                        if not message or message[:1] == b"X":
                            break
        reaper.close()


async def _recv(reaper: Reaper) -> bytes:
    sock = reaper.sock
    while True:
        try:
            return sock.recv(_RECV)
        except BlockingIOError:
            try:
                await anyio.wait_readable(sock)
            except anyio.ClosedResourceError:
                return b""
        except OSError:
            return b""


def _exit_reason(final: bytes) -> str:
    """How the driver ended, from the reaper's ``X`` message (or its absence)."""
    if final[:1] != b"X" or len(final) < 1 + FINAL.size:
        return "its process supervisor went away"
    kind, value, _out, _err, _flags = FINAL.unpack_from(final, 1)
    if kind == KIND_ERRNO:
        return f"the interpreter could not be run: {os.strerror(value)}"
    return exit_status_reason(os.waitstatus_to_exitcode(value))


def exit_status_reason(code: int) -> str:
    """How an interpreter ended, from its exit code (negative or ``128 + n``: signal ``n``).

    Shells and container engines report a signal death as ``128 + n``.
    """
    number = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    if number:
        name = _signal_name(number)
        hint = " (out of memory, or killed from outside)" if number == signal.SIGKILL else ""
        return f"the interpreter was killed by {name}{hint}"
    return f"the interpreter exited with status {code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _result(  # noqa: PLR0917 - one private call site, every argument named there
    done: Mapping[str, Any] | None,
    out: list[str],
    err: list[str],
    duration_ms: float,
    timed_out: bool,
    lost: str | None,
) -> ExecResult:
    stdout, stderr = "".join(out), "".join(err)
    if done is None:
        return ExecResult(
            exit_code=None,
            stdout=stdout,
            stderr=stderr,
            duration_ms=duration_ms,
            timed_out=timed_out,
            error=ExecError("ContextLost", lost or "the interpreter died"),
            state="lost",
        )
    outputs, dropped = _outputs(done.get("outputs"))
    error = _error(done.get("error"))
    flags = done.get("truncated")
    truncated: Mapping[str, Any] = flags if isinstance(flags, dict) else {}
    status = done.get("status")
    if isinstance(status, int) and not isinstance(status, bool):
        # A bash cell: its exit code is the last command's status, as in a shell.
        failed = None if status == 0 else ExecError("ExitStatus", f"exit status {status}")
        return ExecResult(
            exit_code=None if timed_out else status,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=bool(truncated.get("stdout")),
            stderr_truncated=bool(truncated.get("stderr")),
            duration_ms=duration_ms,
            timed_out=timed_out,
            error=failed,
            state="kept",
        )
    result_json = done.get("result_json")
    return ExecResult(
        exit_code=None if timed_out else (1 if error is not None else 0),
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=bool(truncated.get("stdout")),
        stderr_truncated=bool(truncated.get("stderr")),
        duration_ms=duration_ms,
        timed_out=timed_out,
        result_json=result_json if isinstance(result_json, str) else None,
        error=error,
        outputs=outputs,
        state="kept",
        outputs_truncated=dropped,
    )


def _outputs(raw: object) -> tuple[tuple[CodeOutput, ...], bool]:
    """Validate the driver's bundles (they come from inside the box) and cap their size."""
    if not isinstance(raw, list):
        return (), False
    kept: list[CodeOutput] = []
    budget = _MAX_OUTPUTS_BYTES
    dropped = False
    for item in raw:
        if not isinstance(item, dict) or item.get("kind") not in ("result", "display"):
            continue
        data = item.get("data")
        if not isinstance(data, dict):
            continue
        bundle = {str(k)[:100]: v for k, v in data.items() if isinstance(v, str)}
        size = sum(len(v) for v in bundle.values())
        if size > budget:
            dropped = True
            continue
        budget -= size
        kept.append(CodeOutput(item["kind"], bundle))
    return tuple(kept), dropped


def _error(raw: object) -> ExecError | None:
    if not isinstance(raw, dict):
        return None
    return ExecError(
        str(raw.get("name", "Error"))[:200],
        str(raw.get("value", "")),
        str(raw.get("traceback", "")),
    )


def _with_state(result: ExecResult, state: CodeState) -> ExecResult:
    return attrs.evolve(result, state=state)
