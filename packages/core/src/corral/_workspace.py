"""A ready-made :class:`~corral.provider.Workspace` for providers to return."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from ._errors import OperationError
from ._protocols import CodeInterpreter, FileSystem, Shell, Snapshotter

__all__ = ["ModularWorkspace", "workspace_closed"]

_BUILTIN = ("fs", "shell", "code", "script", "snapshot")


class ModularWorkspace:
    """A workspace assembled from module objects.

    ``close`` is idempotent and safe to call concurrently: the ``on_close``
    callback runs once and every caller waits for it.

    Args:
        workspace_id: Stable id of the workspace.
        fs, shell, code, script, snapshot: The populated built-in modules.
        extra_modules: Third-party modules by capability module name.
        on_close: Releases the workspace's resources; called once.
        details: Returns provider facts for ``WorkspaceRegistry.describe()``.
    """

    def __init__(
        self,
        workspace_id: str,
        *,
        fs: FileSystem | None = None,
        shell: Shell | None = None,
        code: CodeInterpreter | None = None,
        script: CodeInterpreter | None = None,
        snapshot: Snapshotter | None = None,
        extra_modules: Mapping[str, object] | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
        details: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self._id = workspace_id
        self._modules: dict[str, object | None] = {
            "fs": fs,
            "shell": shell,
            "code": code,
            "script": script,
            "snapshot": snapshot,
        }
        for name, module in (extra_modules or {}).items():
            if name in _BUILTIN:
                raise ValueError(f"extra module {name!r} shadows a built-in module")
            self._modules[name] = module
        self._on_close = on_close
        self._details = details
        self._closed = False
        self._close_done: anyio.Event | None = None

    @property
    def id(self) -> str:
        """The workspace id."""
        return self._id

    @property
    def fs(self) -> FileSystem | None:
        """The file system module."""
        return self._modules["fs"]  # type: ignore[return-value]

    @property
    def shell(self) -> Shell | None:
        """The shell module."""
        return self._modules["shell"]  # type: ignore[return-value]

    @property
    def code(self) -> CodeInterpreter | None:
        """The code interpreter module."""
        return self._modules["code"]  # type: ignore[return-value]

    @property
    def script(self) -> CodeInterpreter | None:
        """The script runner module."""
        return self._modules["script"]  # type: ignore[return-value]

    @property
    def snapshot(self) -> Snapshotter | None:
        """The snapshot module."""
        return self._modules["snapshot"]  # type: ignore[return-value]

    @property
    def closed(self) -> bool:
        """Whether ``close`` has started."""
        return self._closed

    def module(self, name: str) -> object | None:
        """A module by name, or None."""
        return self._modules.get(name)

    def details(self) -> Mapping[str, Any]:
        """Provider facts for operators."""
        return dict(self._details()) if self._details else {}

    async def close(self) -> None:
        """Run ``on_close`` once; later and concurrent calls wait for it."""
        if self._closed:
            if self._close_done is not None:
                await self._close_done.wait()
            return
        self._closed = True
        self._close_done = anyio.Event()
        try:
            if self._on_close is not None:
                await self._on_close()
        finally:
            self._close_done.set()

    def __repr__(self) -> str:
        mods = ",".join(k for k, v in self._modules.items() if v is not None)
        return f"<ModularWorkspace {self._id} [{mods}]{' closed' if self._closed else ''}>"


def workspace_closed() -> OperationError:
    """The standard error for a module used after its workspace closed.

    Every provider raises the same code and words, so the model and the
    conformance suite see one error for one situation::

        if self._closed:
            raise workspace_closed()
    """
    return OperationError("the workspace is closed", code="closed")
