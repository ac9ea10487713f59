"""The ``code`` module of docker workspaces: posix-core's driver, in the container.

Each context is one long-lived ``python3 -I -u`` running posix-core's
``_codedriver.py`` as an attached exec in the workspace's container: same
user, network, limits (memory, pids, cpus, ulimits) and mounts as the
shell's commands, working directory the workspace. The exec's connection is
the framed channel (no ``docker exec`` per cell), so everything about
contexts -- cells, results, timeouts, lost and busy, records -- is
posix-core's :class:`~corral_posix._code.DriverCodeInterpreter`; this module
is only the launcher and the channel.

Reads: a thread of the channel's own reads the connection and hands the
driver's stdout to the event loop through a pipe, so a cell that times out
(a cancelled wait) loses no bytes of the frames that follow.

The whole tree: every context's exec carries a random marker in its
environment, and ending a context kills every process of the container
carrying it (the sweep of :mod:`._execs`), so what the user's code started
dies with it, ``setsid`` or not. An
interrupt is the driver's own frame (a ``KeyboardInterrupt`` raised in the
cell's thread, or SIGINT to a bash/node session's group); a cell that ignores
it is killed.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import anyio
import anyio.to_thread

from corral.provider import WorkspaceEvictedError
from corral_posix import CommandChecker

# The contexts manager, its channel seam and its exit wording (one implementation).
from corral_posix._code import (
    ChannelLost,
    CodeChannel,
    DriverCodeInterpreter,
    exit_status_reason,
)

from ._attach import AttachedExec
from ._engine import ContainerNotFoundError, DockerEngine, EngineError
from ._execs import engine_errors, kill_marked, require_attaching
from ._interpreters import code_languages, image_interpreters
from ._options import WORKDIR

__all__ = ["DockerCodeLauncher", "build_docker_code"]

_PYTHON: Final = "python3"
_READ: Final = 1 << 16
_KILL_WAIT_S: Final = 15.0
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_CWD: Final = 125
# cd into the working directory (125 when it is missing), then become the interpreter.
_ENTRY: Final = 'cd -- "$1" 2>/dev/null || exit 125; shift; exec "$@"'
_NO_PYTHON: Final = (
    "the container image has no python3 on its PATH, which code contexts need "
    "(use an image with python3, e.g. one built like corral-python:bookworm)"
)


async def build_docker_code(
    engine: DockerEngine,
    container: Callable[[], Awaitable[str]],
    *,
    user: str,
    root: str | None,
    gate: Callable[[], Awaitable[None]] | None,
    state_dir: str,
    image: str,
    probed: dict[str, frozenset[str]],
) -> DriverCodeInterpreter:
    """The ``code`` module of one docker workspace.

    Args:
        engine, container, user, root, gate: See :class:`DockerCodeLauncher`.
        state_dir: The workspace's private state directory on this host.
        image: The container's image (what the languages were probed for).
        probed: The provider's interpreters per image, filled here: an
            image is probed once per provider.

    Raises:
        EngineError: The probe failed.
    """
    programs = await image_interpreters(engine, container, user=user, image=image, probed=probed)
    languages = code_languages(programs)
    await anyio.to_thread.run_sync(lambda: os.makedirs(state_dir, exist_ok=True))
    return DriverCodeInterpreter(
        DockerCodeLauncher(engine, container, user=user, root=root, gate=gate),
        languages=languages,
        state_dir=state_dir,
        details={"code_python": _PYTHON},
        # Resolve removes the container of a process that died (it joins a live one's).
        adopted_reason="its interpreter ended with the container of the process that drove it",
        unavailable=None if languages else _NO_PYTHON,
    )


class DockerCodeLauncher:
    """Starts each context's interpreter as an attached exec (a :class:`CodeLauncher`).

    Args:
        engine: The workspace's engine; it must attach exec streams.
        container: Returns the id of the live container.
        user: ``UID:GID`` the interpreters run as (the shell's).
        root: The workspace's host directory (local engines): a missing
            ``cwd`` is refused before anything starts. Remote engines learn
            it from the exec's status.
        gate: Awaited before each start (a restore holds starts back).
    """

    def __init__(
        self,
        engine: DockerEngine,
        container: Callable[[], Awaitable[str]],
        *,
        user: str,
        root: str | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._engine = engine
        self._attaching = require_attaching(engine, "the code module")
        self._container = container
        self._user = user
        self._root = root
        self._gate = gate

    async def launch(self, cwd: str | None, args: Sequence[str]) -> CodeChannel:
        """Start ``python3 args`` in the container; see :class:`CodeLauncher`."""
        parts = CommandChecker.cwd_parts(cwd)
        if self._root is not None and parts:
            await anyio.to_thread.run_sync(self._check_cwd, cwd)
        workdir = WORKDIR + "".join("/" + p for p in parts)
        marker = secrets.token_hex(12)
        if self._gate is not None:
            await self._gate()
        with engine_errors("docker: could not start the interpreter"):
            container_id = await self._container()
            attached = await self._attaching.attach_exec(
                container_id,
                ["sh", "-c", _ENTRY, "corral", workdir, _PYTHON, *args],
                env={"CORRAL_EXEC": marker, "MPLBACKEND": "Agg"},
                workdir="/",
                user=self._user,
                stdin=True,
            )
        return _ExecChannel(attached, lambda: self._kill_marked(container_id, marker))

    def _check_cwd(self, cwd: str | None) -> None:
        assert self._root is not None
        try:
            root_fd = os.open(self._root, _DIR_FLAGS)
        except OSError:
            raise WorkspaceEvictedError(
                "docker: the workspace directory no longer exists", provider_id="docker"
            ) from None
        try:
            os.close(CommandChecker.open_cwd(root_fd, cwd))
        finally:
            os.close(root_fd)

    async def _kill_marked(self, container_id: str, marker: str) -> None:
        await kill_marked(
            self._engine, container_id, [marker], user=self._user, wait_s=_KILL_WAIT_S
        )


class _ExecChannel:
    """An attached exec as a :class:`CodeChannel`: stdin on the connection, stdout via a thread."""

    def __init__(self, attached: AttachedExec, kill_tree: Callable[[], Awaitable[None]]) -> None:
        self._attached = attached
        self._kill_tree = kill_tree
        self._read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self._read_fd, False)
        self._reading = False
        self._killed = False
        threading.Thread(
            target=self._pump, args=(write_fd,), name="corral-code-reader", daemon=True
        ).start()

    def _pump(self, write_fd: int) -> None:
        """Copy the driver's stdout into the pipe until the stream ends (blocking thread)."""
        try:
            while (chunks := self._attached.receive_blocking()) is not None:
                for name, data in chunks:
                    # stderr is the driver's own (a crash report): never shown as output.
                    if name == "stdout":
                        view = memoryview(data)
                        while view:
                            view = view[os.write(write_fd, view) :]
        except (OSError, EngineError):
            pass  # the channel was closed under the thread: the reader sees the end
        finally:
            os.close(write_fd)

    async def send(self, data: bytes) -> None:
        """Write to the driver's stdin; see :class:`CodeChannel`."""
        if self._killed or not await self._attached.send(data):
            raise ChannelLost("its interpreter stopped reading")

    async def receive(self) -> bytes:
        """The driver's next stdout bytes; see :class:`CodeChannel`."""
        while True:
            if self._killed:
                raise ChannelLost("it was deleted")
            try:
                data = os.read(self._read_fd, _READ)
            except BlockingIOError:
                self._reading = True
                try:
                    await anyio.wait_readable(self._read_fd)
                except anyio.ClosedResourceError:
                    raise ChannelLost("it was deleted") from None
                finally:
                    self._reading = False
                continue
            if data:
                return data
            raise ChannelLost(await self._end_reason())

    async def _end_reason(self) -> str:
        try:
            code = await self._attached.exit_code()
        except ContainerNotFoundError:
            return "the workspace's container went away"
        except EngineError:
            code = None
        if code is None:
            return "its exec stream ended without an exit status"
        if code == _NO_CWD:
            return "its working directory does not exist in the workspace"
        return exit_status_reason(code)

    async def kill(self) -> None:
        """Kill every marked process, close the connection; see :class:`CodeChannel`."""
        if self._killed:
            return
        self._killed = True
        with anyio.CancelScope(shield=True):
            await self._kill_tree()
            await self._attached.aclose()
            if self._reading:
                anyio.notify_closing(self._read_fd)
            os.close(self._read_fd)
