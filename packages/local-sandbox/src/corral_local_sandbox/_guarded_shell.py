"""The shell decorator that checks the protected paths around every command."""

from __future__ import annotations

import anyio
import anyio.to_thread
import attrs

from corral import CommandRequest, ExecResult, OperationError, Shell

from ._protect import PathGuard

__all__ = ["GuardedShell"]


class GuardedShell:
    """Runs commands through ``inner``; quarantines what they plant at protected paths.

    Args:
        inner: The sandboxed posix-core shell.
        guard: The workspace's protected-path guard.
    """

    def __init__(self, inner: Shell, guard: PathGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._closed = False

    async def run(self, request: CommandRequest) -> ExecResult:
        """Run one command, then move anything it planted at a protected path out of the workspace.

        Raises:
            OperationError: ``policy_denied`` when a protected location holds a
                symlink or an unremovable planted file; anything ``inner`` raises.
        """
        if self._closed:  # the guard's state is gone with the workspace
            raise OperationError("the workspace is closed", code="closed")
        self._guard.begin()
        try:
            result = await self._inner.run(request)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._finish()
            raise
        notes = await self._finish()
        if notes:
            result = attrs.evolve(result, stderr=result.stderr + "".join(notes))
        return result

    async def _finish(self) -> list[str]:
        changes = self._guard.changed()
        if not changes:
            return self._guard.end([])
        return await anyio.to_thread.run_sync(self._guard.end, changes)

    async def aclose(self) -> None:
        """Close the inner shell (kills running commands)."""
        self._closed = True
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()
