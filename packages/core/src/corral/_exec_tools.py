"""Tools of the ``shell``, ``code``, ``script`` and ``snapshot`` capabilities."""

from __future__ import annotations

import re
import shlex
from typing import Any, Final

from ._data import CommandRequest, ExecResult, SnapshotInfo
from ._errors import OperationError
from ._paths import normalize_path
from ._policies import CodePolicy, ScriptPolicy, ShellPolicy, SnapshotPolicy
from ._tool import ToolEnv, ToolSpec
from ._tool import object_schema as _schema

__all__ = ["code_tools", "script_tools", "shell_tools", "snapshot_tools"]

_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
_ID = {"type": "string", "minLength": 1, "maxLength": 200}
MAX_COMMAND_CHARS: Final = 100_000
MAX_CODE_CHARS: Final = 1_000_000


def exec_data(result: ExecResult) -> dict[str, Any]:
    """The JSON shape of an :class:`ExecResult` for the model."""
    return {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "timed_out": result.timed_out,
        "signal": result.signal,
        "duration_ms": round(result.duration_ms, 3),
    }


def _precheck_allowlist(command: str, policy: ShellPolicy) -> None:
    """Tool-layer allowlist check; the shell's guard checks again, more deeply."""
    if policy.allowed_commands is None or policy.allow_shell_syntax:
        return
    try:
        argv = shlex.split(command)
    except ValueError:
        raise OperationError("command has unbalanced quotes", code="invalid_argument") from None
    if not argv:
        raise OperationError("command is empty", code="invalid_argument")
    program = argv[0]
    if "/" in program or program not in policy.allowed_commands:
        shown = program if len(program) <= 64 and program.isprintable() else "?"
        raise OperationError(
            f"command {shown!r} is not in the allowed commands", code="policy_denied"
        )


async def _run(env: ToolEnv, args: dict[str, Any]) -> Any:
    policy: ShellPolicy = env.policy
    command: str = args["command"]
    if not command.strip():
        raise OperationError("argument 'command': must not be empty", code="invalid_argument")
    timeout = float(args.get("timeout_s", policy.timeout_s))
    if timeout > policy.timeout_s:
        raise OperationError(
            f"argument 'timeout_s': must be at most {policy.timeout_s:g} (the policy's limit)",
            code="invalid_argument",
        )
    extra_env: dict[str, str] = args.get("env", {})
    for name in extra_env:
        if not _ENV_NAME.match(name):
            raise OperationError(
                "argument 'env': variable names must match [A-Za-z_][A-Za-z0-9_]*",
                code="invalid_argument",
            )
    _precheck_allowlist(command, policy)
    cwd = args.get("cwd")
    request = CommandRequest(
        command=command,
        cwd=normalize_path(cwd) if cwd is not None else None,
        timeout_s=timeout,
        env={**policy.env, **extra_env},
        stdin=args.get("stdin"),
        max_output_bytes=policy.max_output_bytes,
        allowed_commands=policy.allowed_commands,
        allow_shell_syntax=policy.allow_shell_syntax,
    )
    shell = await env.module("shell")
    return exec_data(await shell.run(request))


def shell_tools(policy: ShellPolicy) -> list[ToolSpec]:
    """``workspace_run``."""
    syntax = (
        "Shell syntax (pipes, redirects, globs) is allowed."
        if policy.allow_shell_syntax
        else "Runs one program with arguments, no shell: pipes, redirects, globs and ; are refused."
    )
    allowed = (
        f" Allowed programs: {', '.join(policy.allowed_commands)}."
        if policy.allowed_commands is not None
        else ""
    )
    return [
        ToolSpec(
            "workspace_run",
            f"Run a command in the workspace and return exit code, stdout and stderr. {syntax}"
            f"{allowed} Timeout at most {policy.timeout_s:g}s; output capped at "
            f"{policy.max_output_bytes} bytes per stream.",
            _schema(
                {
                    "command": {"type": "string", "minLength": 1, "maxLength": MAX_COMMAND_CHARS},
                    "cwd": {"type": "string", "maxLength": 4096},
                    "timeout_s": {"type": "number", "minimum": 0.001},
                    "env": {
                        "type": "object",
                        "additionalProperties": {"type": "string", "maxLength": 32768},
                    },
                    "stdin": {"type": "string", "maxLength": 10_000_000},
                },
                ["command"],
            ),
            _run,
            "run",
        )
    ]


def _check_language(language: str, allowed: tuple[str, ...]) -> None:
    if language not in allowed:
        raise OperationError(
            f"language {language!r} is not enabled (enabled: {', '.join(allowed)})"
            if len(language) <= 32
            else "language is not enabled",
            code="policy_denied",
        )


async def _run_code(env: ToolEnv, args: dict[str, Any]) -> Any:
    policy: CodePolicy = env.policy
    _check_language(args["language"], policy.languages)
    code = await env.module("code")
    return exec_data(
        await code.run_code(args["language"], args["code"], timeout_s=policy.timeout_s)
    )


async def _create_context(env: ToolEnv, args: dict[str, Any]) -> Any:
    policy: CodePolicy = env.policy
    _check_language(args["language"], policy.languages)
    code = await env.module("code")
    return {"context_id": await code.create_context(args["language"])}


async def _run_in_context(env: ToolEnv, args: dict[str, Any]) -> Any:
    policy: CodePolicy = env.policy
    code = await env.module("code")
    return exec_data(
        await code.run_in_context(args["context_id"], args["code"], timeout_s=policy.timeout_s)
    )


async def _delete_context(env: ToolEnv, args: dict[str, Any]) -> Any:
    code = await env.module("code")
    await code.delete_context(args["context_id"])
    return {"context_id": args["context_id"], "deleted": True}


def code_tools(policy: CodePolicy) -> list[ToolSpec]:
    """``workspace_run_code`` and, when stateful, the three context tools."""
    lang = {"type": "string", "enum": list(policy.languages)}
    code = {"type": "string", "minLength": 1, "maxLength": MAX_CODE_CHARS}
    tools = [
        ToolSpec(
            "workspace_run_code",
            f"Run a code snippet in a fresh interpreter ({', '.join(policy.languages)}); "
            "returns exit code, stdout and stderr.",
            _schema({"language": lang, "code": code}, ["language", "code"]),
            _run_code,
            "run_code",
        )
    ]
    if policy.is_stateful:
        tools += [
            ToolSpec(
                "workspace_create_code_context",
                "Start a stateful interpreter context; variables persist across runs in it.",
                _schema({"language": lang}, ["language"]),
                _create_context,
                "create_code_context",
            ),
            ToolSpec(
                "workspace_run_in_code_context",
                "Run code in an existing context created by workspace_create_code_context.",
                _schema({"context_id": _ID, "code": code}, ["context_id", "code"]),
                _run_in_context,
                "run_in_code_context",
            ),
            ToolSpec(
                "workspace_delete_code_context",
                "Discard a code context.",
                _schema({"context_id": _ID}, ["context_id"]),
                _delete_context,
                "delete_code_context",
            ),
        ]
    return tools


async def _script(env: ToolEnv, args: dict[str, Any]) -> Any:
    policy: ScriptPolicy = env.policy
    timeout_ms = args.get("timeout_ms", policy.max_duration_ms)
    if timeout_ms > policy.max_duration_ms:
        raise OperationError(
            f"argument 'timeout_ms': must be at most {policy.max_duration_ms}",
            code="invalid_argument",
        )
    runner = await env.module("script")
    language = args.get("language") or next(iter(sorted(runner.languages)), "javascript")
    if language not in runner.languages:
        raise OperationError("language is not supported by the script runner", code="policy_denied")
    return exec_data(await runner.run_code(language, args["code"], timeout_s=timeout_ms / 1000))


def script_tools(policy: ScriptPolicy) -> list[ToolSpec]:
    """``workspace_script``: one stateless snippet in the ephemeral runner."""
    return [
        ToolSpec(
            "workspace_script",
            "Run a short stateless script in an ephemeral isolate "
            f"(network {policy.network}, at most {policy.max_duration_ms} ms).",
            _schema(
                {
                    "code": {"type": "string", "minLength": 1, "maxLength": MAX_CODE_CHARS},
                    "language": {"type": "string", "maxLength": 32},
                    "timeout_ms": {"type": "integer", "minimum": 1},
                },
                ["code"],
            ),
            _script,
            "script",
        )
    ]


def _info(info: SnapshotInfo) -> dict[str, Any]:
    return {
        "snapshot_id": info.snapshot_id,
        "created_at": info.created_at,
        "label": info.label,
        "size_bytes": info.size_bytes,
    }


async def _snapshot(env: ToolEnv, args: dict[str, Any]) -> Any:
    policy: SnapshotPolicy = env.policy
    snap = await env.module("snapshot")
    if len(await snap.list()) >= policy.max_snapshots:
        raise OperationError(
            f"this workspace already holds {policy.max_snapshots} snapshots; delete one first",
            code="policy_denied",
        )
    info = await snap.snapshot(args.get("label"))
    env.registry.emit("on_snapshot", status="snapshot", detail={"snapshot_id": info.snapshot_id})
    return _info(info)


async def _restore(env: ToolEnv, args: dict[str, Any]) -> Any:
    snap = await env.module("snapshot")
    ref = await snap.restore(args["snapshot_id"])
    await env.registry.swap_ref(ref)
    env.registry.emit("on_snapshot", status="restore", detail={"snapshot_id": args["snapshot_id"]})
    return {"restored": args["snapshot_id"]}


async def _list_snapshots(env: ToolEnv, args: dict[str, Any]) -> Any:
    snap = await env.module("snapshot")
    return {"snapshots": [_info(i) for i in await snap.list()]}


async def _delete_snapshot(env: ToolEnv, args: dict[str, Any]) -> Any:
    snap = await env.module("snapshot")
    await snap.delete(args["snapshot_id"])
    return {"deleted": args["snapshot_id"]}


async def _branch(env: ToolEnv, args: dict[str, Any]) -> Any:
    snap = await env.module("snapshot")
    ref = await snap.branch(args["snapshot_id"])
    await env.registry.swap_ref(ref)
    env.registry.emit("on_snapshot", status="branch", detail={"snapshot_id": args["snapshot_id"]})
    ws = await env.registry.get()
    return {"branched_from": args["snapshot_id"], "workspace_id": ws.id}


def snapshot_tools(policy: SnapshotPolicy) -> list[ToolSpec]:
    """The five snapshot tools."""
    sid = _schema({"snapshot_id": _ID}, ["snapshot_id"])
    return [
        ToolSpec(
            "workspace_snapshot",
            "Save the current state of the workspace; returns a snapshot_id for restore or branch.",
            _schema({"label": {"type": "string", "maxLength": 200}}, []),
            _snapshot,
            "snapshot",
        ),
        ToolSpec(
            "workspace_restore",
            "Bring the workspace back to exactly a snapshot's state (later changes are lost).",
            sid,
            _restore,
            "restore",
        ),
        ToolSpec(
            "workspace_list_snapshots",
            "List this workspace's snapshots, oldest first.",
            _schema({}, []),
            _list_snapshots,
            "list_snapshots",
        ),
        ToolSpec(
            "workspace_delete_snapshot",
            "Delete a snapshot.",
            sid,
            _delete_snapshot,
            "delete_snapshot",
        ),
        ToolSpec(
            "workspace_branch",
            "Continue in a new, separate workspace seeded from a snapshot; the current "
            "workspace is left as it is.",
            sid,
            _branch,
            "branch",
        ),
    ]
