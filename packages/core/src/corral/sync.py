"""corral without ``async``: the same sessions, run on an anyio blocking portal.

A script, a notebook cell or a synchronous framework can use a workspace
without an event loop of its own::

    from corral.sync import open_workspace

    with open_workspace("local-bash", {"fs": True, "shell": True}) as ws:
        ws.call("workspace_write_file", {"path": "/a.txt", "content": "hi"})
        print(ws.call("workspace_run", {"command": "cat a.txt"}).content)

Everything runs the asynchronous code path unchanged on an event loop in a
helper thread (anyio's blocking portal), so results, errors and tool specs
are the very same types and behave identically. A session may be used from
several threads at once: each call is handed to the loop thread-safely.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Generic, Literal, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._bridges import AnthropicTool, OpenAIResponsesTool, OpenAITool
from ._data import ExecResult, WorkspaceRef
from ._protocols import WorkspaceProvider
from ._registry import RegistrySnapshot, ScopedWorkspace
from ._session import WorkspaceSession
from ._session import open_workspace as _open_workspace
from ._streaming import OutputChunk
from ._tool import Tool, ToolResult

__all__ = ["Blocking", "BlockingWorkspace", "SyncWorkspaceSession", "open_workspace"]

T = TypeVar("T")


class Blocking(Generic[T]):
    """A module (``FileSystem``, ``Shell``...) whose async methods block instead.

    ``Blocking[FileSystem]`` has the module's methods with the same arguments
    and results; each coroutine method runs on the session's event loop and
    returns its result (or raises its exception) in the calling thread.

    Args:
        inner: The asynchronous module.
        portal: The session's portal.
    """

    __slots__ = ("_inner", "_portal")

    def __init__(self, inner: T, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    @property
    def wrapped(self) -> T:
        """The asynchronous module itself (only usable on the portal's loop)."""
        return self._inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr
        portal = self._portal

        def blocking(*args: Any, **kwargs: Any) -> Any:
            async def run() -> Any:
                result = attr(*args, **kwargs)
                return await result if inspect.isawaitable(result) else result

            return portal.call(run)

        blocking.__name__ = name
        blocking.__doc__ = getattr(attr, "__doc__", None)
        return blocking


class BlockingWorkspace:
    """The typed workspace of a session (declared modules only), with blocking modules.

    Args:
        inner: The scoped asynchronous workspace.
        portal: The session's portal.
    """

    def __init__(self, inner: ScopedWorkspace, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    @property
    def id(self) -> str:
        """The workspace's id."""
        return self._inner.id

    def _wrap(self, module: T | None) -> Blocking[T] | None:
        return None if module is None else Blocking(module, self._portal)

    @property
    def fs(self) -> Blocking[Any] | None:
        """The file system, when declared."""
        return self._wrap(self._inner.fs)

    @property
    def shell(self) -> Blocking[Any] | None:
        """The shell, when declared."""
        return self._wrap(self._inner.shell)

    @property
    def code(self) -> Blocking[Any] | None:
        """The code interpreter, when declared."""
        return self._wrap(self._inner.code)

    @property
    def script(self) -> Blocking[Any] | None:
        """The script runner, when declared."""
        return self._wrap(self._inner.script)

    @property
    def snapshot(self) -> Blocking[Any] | None:
        """The snapshotter, when declared."""
        return self._wrap(self._inner.snapshot)

    def module(self, name: str) -> Blocking[Any] | None:
        """A declared module by name (a third-party capability's), or None."""
        return self._wrap(self._inner.module(name))


class SyncWorkspaceSession:
    """A :class:`~corral.WorkspaceSession` whose calls block; safe to share between threads.

    Args:
        session: The asynchronous session (running on ``portal``'s loop).
        portal: The portal that runs it.
    """

    def __init__(self, session: WorkspaceSession, portal: BlockingPortal) -> None:
        self.session = session
        self.portal = portal

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The ``workspace_*`` tools (their ``invoke`` is async: use :meth:`call`)."""
        return self.session.tools

    @property
    def ref(self) -> WorkspaceRef | None:
        """The current ref."""
        return self.session.ref

    def call(
        self, name: str, arguments: object = None, *, raise_on_error: bool | None = None
    ) -> ToolResult:
        """Call a tool by name and wait for its result (see ``WorkspaceSession.call``).

        Raises:
            ToolCallError: The call failed and ``raise_on_error`` is on.
        """

        async def run() -> ToolResult:
            return await self.session.call(name, arguments, raise_on_error=raise_on_error)

        return self.portal.call(run)

    def run_streaming(
        self,
        command: str,
        on_output: Callable[[OutputChunk], None] | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int = 1_000_000,
    ) -> ExecResult:
        """Run a command, calling ``on_output`` with each chunk as it is produced.

        See ``WorkspaceSession.run_streaming`` (needs the ``process``
        capability). ``on_output`` runs in the session's event-loop thread,
        between reads: keep it quick (print, append, put on a queue).
        """

        async def run() -> ExecResult:
            return await self.session.run_streaming(
                command,
                on_output,
                cwd=cwd,
                env=env,
                timeout_s=timeout_s,
                max_output_bytes=max_output_bytes,
            )

        return self.portal.call(run)

    def workspace(self) -> BlockingWorkspace:
        """The typed workspace with blocking modules, opening it if needed."""
        return BlockingWorkspace(self.portal.call(self.session.workspace), self.portal)

    def describe(self) -> RegistrySnapshot:
        """The registry's frozen snapshot (state, ids, last error)."""
        return self.portal.call(self._describe)

    async def _describe(self) -> RegistrySnapshot:
        return self.session.registry.describe()

    def openai_tools(self, *, strict: bool = False) -> list[OpenAITool]:
        """OpenAI Chat Completions function specs of the tools."""
        return self.session.openai_tools(strict=strict)

    def openai_responses_tools(self, *, strict: bool = True) -> list[OpenAIResponsesTool]:
        """OpenAI Responses API function tools."""
        return self.session.openai_responses_tools(strict=strict)

    def anthropic_tools(self) -> list[AnthropicTool]:
        """Anthropic tool specs of the tools."""
        return self.session.anthropic_tools()


@contextmanager
def open_workspace(
    provider: str | WorkspaceProvider,
    capabilities: Mapping[str, Any] | None = None,
    *,
    backend: Literal["asyncio", "trio"] = "asyncio",
    **options: Any,
) -> Iterator[SyncWorkspaceSession]:
    """Open a session's workspace with blocking tools; close it on exit.

    Takes exactly the arguments of :func:`corral.open_workspace` (opening is
    eager by default, so a provider that cannot run raises here) plus the
    event-loop ``backend`` the portal runs. Hooks, result filters and
    ``persist_ref`` callbacks run on the portal's loop thread.

    Args:
        provider: A provider kind or instance.
        capabilities: Capability config; None declares every supported one.
        backend: The anyio backend of the portal's loop.
        **options: Any keyword argument of :func:`corral.open_workspace`.

    Raises:
        ConfigError: As :func:`corral.open_workspace`.
        WorkspaceFailedError: As :func:`corral.open_workspace`.
    """
    with start_blocking_portal(backend) as portal:
        opened = _open_workspace(provider, capabilities, **options)
        with portal.wrap_async_context_manager(opened) as session:
            yield SyncWorkspaceSession(session, portal)
