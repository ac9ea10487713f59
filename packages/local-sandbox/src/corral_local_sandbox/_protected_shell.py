"""The shell decorator that checks the protected paths around every command."""

from __future__ import annotations

import logging

import anyio
import attrs

from corral.provider import CommandRequest, ExecResult, ForwardingShell, OperationError, Shell

from ._protect import STUCK_NOTE, ProtectedPathChecker

__all__ = ["ProtectedShell"]

log = logging.getLogger("corral.local_sandbox.protect")


class ProtectedShell(ForwardingShell):
    """Runs commands through ``inner`` between two protected-path checks.

    The check *before* catches what another process's command, a process
    that died mid-command, or the host left behind; the check *after* catches
    what this command planted, nested repositories included (a deep walk of
    the tree, in a worker thread). Both judge content, not who ran when.

    Args:
        inner: The sandboxed posix-core shell.
        checker: The workspace's protected-path checker.
    """

    def __init__(self, inner: Shell, checker: ProtectedPathChecker) -> None:
        super().__init__(inner)
        self._checker = checker
        self._closed = False

    async def run(self, request: CommandRequest) -> ExecResult:
        """Check, run one command, check again; notes on anything moved go to stderr.

        Raises:
            OperationError: ``policy_denied`` when something at a protected
                path cannot be moved out of the workspace; anything ``inner`` raises.
        """
        if self._closed:  # the checker's state is gone with the workspace
            raise OperationError("the workspace is closed", code="closed")
        before = await self._checker.acheck()
        if not before.clean:
            raise OperationError(
                "a file planted at a protected path could not be removed; "
                "remove it from the host to run commands",
                code="policy_denied",
            )
        try:
            result = await self._inner.run(request)
        except BaseException:
            with anyio.CancelScope(shield=True):
                try:
                    await self._checker.acheck(deep=True)
                except Exception:  # the command's own error matters more
                    log.exception("protected-path check after a failed command")
            raise
        after = await self._checker.acheck(deep=True)
        notes = before.notes + after.notes + (() if after.clean else (STUCK_NOTE,))
        if notes:
            result = attrs.evolve(result, stderr=result.stderr + "".join(notes))
        return result

    async def aclose(self) -> None:
        """Close the inner shell (kills running commands)."""
        self._closed = True
        await super().aclose()
