"""deepagents' ``execute`` through the session's ``workspace_run`` tool.

The command goes through corral's tool layer, not straight to the shell
module, so the session's shell policy applies to the backend exactly as it
does to the model's own tool calls: allowed programs, shell syntax,
the timeout ceiling, the output cap and the environment.
"""

from __future__ import annotations

from typing import Any, Final

from deepagents.backends.protocol import ExecuteResponse

import corral

__all__ = ["RUN_TOOL", "execute"]

RUN_TOOL: Final = "workspace_run"
"""The corral tool that runs commands (offered when the session declares ``shell``)."""


def _combined(data: dict[str, Any]) -> str:
    """stdout then stderr, as deepagents' sandboxes report one ``output``."""
    out = str(data.get("stdout", ""))
    err = str(data.get("stderr", ""))
    if err:
        out = f"{out}\n{err}" if out and not out.endswith("\n") else out + err
    if data.get("timed_out"):
        out += "\n[the command timed out and was killed]"
    return out


async def execute(
    session: corral.WorkspaceSession,
    command: str,
    timeout: int | None,  # noqa: ASYNC109 -- a value for corral's shell policy, not a deadline here
) -> ExecuteResponse:
    """Run one shell command in the workspace; a refusal or failure is an error output.

    Args:
        session: The open session.
        command: The shell command line.
        timeout: Seconds; None or 0 take the shell policy's default (corral
            has no unbounded commands), more than the policy allows is refused.
    """
    if not any(t.name == RUN_TOOL for t in session.tools):
        return ExecuteResponse(
            output="Error: this workspace runs no commands (open it with the shell capability)",
            exit_code=None,
        )
    arguments: dict[str, Any] = {"command": command}
    if timeout:
        arguments["timeout_s"] = timeout
    result = await session.call(RUN_TOOL, arguments, raise_on_error=False)
    if result.is_error or not isinstance(result.data, dict):
        return ExecuteResponse(output=f"Error: {result.content}", exit_code=None)
    data = result.data
    exit_code = data.get("exit_code")
    return ExecuteResponse(
        output=_combined(data),
        exit_code=exit_code if isinstance(exit_code, int) else None,
        truncated=bool(data.get("stdout_truncated") or data.get("stderr_truncated")),
    )
