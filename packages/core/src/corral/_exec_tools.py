"""Tools of the ``shell``, ``code`` and ``script`` capabilities (snapshot: ``_snapshot_tools``)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from typing import Annotated, Final

import attrs

from . import _tool_meta as meta
from ._data import CommandRequest, ExecResult
from ._echo import echo_if_short
from ._errors import OperationError
from ._policies import CodePolicy, ScriptPolicy, ShellPolicy
from ._protocols import CodeInterpreter, Shell
from ._schema import Arg
from ._tool import ToolContent, ToolEnv, ToolHints, ToolImage, ToolSpec

__all__ = [
    "code_content",
    "code_tools",
    "env_name_ok",
    "exec_data",
    "precheck_allowlist",
    "script_tools",
    "shell_tools",
]

_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
MAX_COMMAND_CHARS: Final = 100_000
MAX_CODE_CHARS: Final = 1_000_000

Data = dict[str, object]
Code = Annotated[str, Arg("Source code to run", min_length=1, max_length=MAX_CODE_CHARS)]
ContextId = Annotated[
    str, Arg("A context_id from workspace_create_code_context", min_length=1, max_length=200)
]


def exec_data(result: ExecResult) -> Data:
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
        **_code_outcome(result),
    }


def _code_outcome(result: ExecResult) -> Data:
    """A code runner's value, error, rich outputs and state, only when it reported them."""
    out: Data = {}
    if result.result_json is not None:
        out["result"] = json.loads(result.result_json)
    if result.error is not None:
        error = result.error
        out["error"] = {"name": error.name, "value": error.value, "traceback": error.traceback}
    if result.outputs:
        out["outputs"] = [{"kind": o.kind, "data": dict(o.data)} for o in result.outputs]
    if result.outputs_truncated:
        out["outputs_truncated"] = True
    if result.state is not None:
        out["state"] = result.state
    return out


# Image types the model APIs take as images; others (SVG) stay text in the data.
_IMAGE_TYPES: Final = ("image/png", "image/jpeg")


def code_content(result: ExecResult) -> ToolContent:
    """A code run for the model: :func:`exec_data` with images lifted out as image content.

    Each image in ``outputs`` is replaced in the data by a short note naming
    its position among the result's images, so the text stays small and the
    image reaches the model as an image.
    """
    data = exec_data(result)
    images: list[ToolImage] = []
    outputs = data.get("outputs")
    if isinstance(outputs, list):
        for output in outputs:
            bundle = output["data"]
            for mime in _IMAGE_TYPES:
                encoded = bundle.get(mime)
                if isinstance(encoded, str):
                    images.append(ToolImage(mime, encoded))
                    size = len(encoded) * 3 // 4
                    bundle[mime] = f"<image {len(images)} attached: {mime}, about {size} bytes>"
    return ToolContent(data, images)


# -- shell ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class RunArgs:
    """``workspace_run``."""

    command: Annotated[
        str, Arg("The command line to run", min_length=1, max_length=MAX_COMMAND_CHARS)
    ]
    cwd: Annotated[
        str | None,
        Arg("Working directory in the workspace (default /)", max_length=4096, path=True),
    ] = None
    timeout_s: Annotated[
        float | None, Arg("Timeout in seconds (default and ceiling: the policy's)", minimum=0.001)
    ] = None
    env: Annotated[
        dict[str, Annotated[str, Arg(max_length=32768)]],
        Arg("Extra environment variables for this command"),
    ] = attrs.field(factory=dict)
    stdin: Annotated[str | None, Arg("Text fed to standard input", max_length=10_000_000)] = None


def env_name_ok(name: str) -> bool:
    """Whether ``name`` may name an environment variable a tool sets."""
    return _ENV_NAME.match(name) is not None


def _precheck_allowlist(command: str, policy: ShellPolicy) -> None:
    precheck_allowlist(command, policy.allowed_commands, policy.allow_shell_syntax)


def precheck_allowlist(
    command: str, allowed_commands: Sequence[str] | None, allow_shell_syntax: bool
) -> None:
    """Tool-layer allowlist check; the module's guard checks again, more deeply."""
    if allowed_commands is None or allow_shell_syntax:
        return
    try:
        argv = shlex.split(command)
    except ValueError:
        raise OperationError("command has unbalanced quotes", code="invalid_argument") from None
    if not argv:
        raise OperationError("command is empty", code="invalid_argument")
    program = argv[0]
    if "/" in program or program not in allowed_commands:
        raise OperationError(
            f"command {echo_if_short(program)!r} is not in the allowed commands",
            code="policy_denied",
        )


async def _run(env: ToolEnv[ShellPolicy, Shell], args: RunArgs) -> Data:
    policy = env.policy
    if not args.command.strip():
        raise OperationError("argument 'command': must not be empty", code="invalid_argument")
    timeout = args.timeout_s if args.timeout_s is not None else policy.timeout_s
    if timeout > policy.timeout_s:
        raise OperationError(
            f"argument 'timeout_s': must be at most {policy.timeout_s:g} (the policy's limit)",
            code="invalid_argument",
        )
    for name in args.env:
        if not _ENV_NAME.match(name):
            raise OperationError(
                "argument 'env': variable names must match [A-Za-z_][A-Za-z0-9_]*",
                code="invalid_argument",
            )
    _precheck_allowlist(args.command, policy)
    request = CommandRequest(
        command=args.command,
        cwd=args.cwd,
        timeout_s=timeout,
        env={**policy.env, **args.env},
        stdin=args.stdin,
        max_output_bytes=policy.max_output_bytes,
        allowed_commands=policy.allowed_commands,
        allow_shell_syntax=policy.allow_shell_syntax,
    )
    shell = await env.module()
    return exec_data(await shell.run(request))


def shell_tools(policy: ShellPolicy) -> list[ToolSpec[ShellPolicy, Shell]]:
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
            RunArgs,
            _run,
            hints=meta.RUNS,
            output_schema=meta.EXEC_RESULT,
        )
    ]


# -- code -------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class RunCodeArgs:
    """``workspace_run_code``; ``language`` is narrowed to the policy's languages."""

    language: Annotated[str, Arg("Language of the snippet")]
    code: Code


@attrs.frozen(kw_only=True)
class CreateContextArgs:
    """``workspace_create_code_context``."""

    language: Annotated[str, Arg("Language of the context")]


@attrs.frozen(kw_only=True)
class RunInContextArgs:
    """``workspace_run_in_code_context``."""

    context_id: ContextId
    code: Code


@attrs.frozen(kw_only=True)
class ContextArgs:
    """``workspace_delete_code_context``."""

    context_id: ContextId


CodeEnv = ToolEnv[CodePolicy, CodeInterpreter]


def _check_language(language: str, allowed: tuple[str, ...]) -> None:
    if language not in allowed:
        raise OperationError(
            f"language {language!r} is not enabled (enabled: {', '.join(allowed)})"
            if len(language) <= 32
            else "language is not enabled",
            code="policy_denied",
        )


async def _run_code(env: CodeEnv, args: RunCodeArgs) -> ToolContent:
    policy = env.policy
    _check_language(args.language, policy.languages)
    code = await env.module()
    return code_content(await code.run_code(args.language, args.code, timeout_s=policy.timeout_s))


async def _create_context(env: CodeEnv, args: CreateContextArgs) -> Data:
    _check_language(args.language, env.policy.languages)
    code = await env.module()
    return {"context_id": await code.create_context(args.language)}


async def _run_in_context(env: CodeEnv, args: RunInContextArgs) -> ToolContent:
    code = await env.module()
    return code_content(
        await code.run_in_context(args.context_id, args.code, timeout_s=env.policy.timeout_s)
    )


async def _delete_context(env: CodeEnv, args: ContextArgs) -> Data:
    code = await env.module()
    await code.delete_context(args.context_id)
    return {"context_id": args.context_id, "deleted": True}


def code_tools(policy: CodePolicy) -> list[ToolSpec[CodePolicy, CodeInterpreter]]:
    """``workspace_run_code`` and, when stateful, the three context tools."""
    languages = {"language": Arg(choices=policy.languages)}
    tools: list[ToolSpec[CodePolicy, CodeInterpreter]] = [
        ToolSpec(
            "workspace_run_code",
            f"Run a code snippet in a fresh interpreter ({', '.join(policy.languages)}); "
            "returns exit code, stdout and stderr, the last expression's value ('result', "
            "and its rich forms in 'outputs'), displayed outputs and plots (images come "
            "attached), and an uncaught error with name, value and traceback.",
            RunCodeArgs,
            _run_code,
            hints=meta.RUNS,
            output_schema=meta.EXEC_RESULT,
            refine=languages,
        )
    ]
    if policy.is_stateful:
        tools += [
            ToolSpec(
                "workspace_create_code_context",
                "Start a stateful interpreter context; variables persist across runs in it.",
                CreateContextArgs,
                _create_context,
                hints=meta.ADDS,
                output_schema=meta.CONTEXT_CREATED,
                refine=languages,
            ),
            ToolSpec(
                "workspace_run_in_code_context",
                "Run code in an existing context created by workspace_create_code_context; "
                "its variables persist. Same result as workspace_run_code; 'state' says "
                "whether the context kept its variables ('kept') or its interpreter died "
                "('lost': create a new context).",
                RunInContextArgs,
                _run_in_context,
                hints=meta.RUNS,
                output_schema=meta.EXEC_RESULT,
            ),
            ToolSpec(
                "workspace_delete_code_context",
                "Discard a code context.",
                ContextArgs,
                _delete_context,
                hints=meta.OVERWRITES,
                output_schema=meta.CONTEXT_DELETED,
            ),
        ]
    return tools


# -- script -----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ScriptArgs:
    """``workspace_script``."""

    code: Code
    language: Annotated[
        str | None, Arg("Language (default: the runner's first)", max_length=32)
    ] = None
    timeout_ms: Annotated[
        int | None, Arg("Timeout in ms (default and ceiling: the policy's)", minimum=1)
    ] = None


async def _script(env: ToolEnv[ScriptPolicy, CodeInterpreter], args: ScriptArgs) -> Data:
    policy = env.policy
    timeout_ms = args.timeout_ms if args.timeout_ms is not None else policy.max_duration_ms
    if timeout_ms > policy.max_duration_ms:
        raise OperationError(
            f"argument 'timeout_ms': must be at most {policy.max_duration_ms}",
            code="invalid_argument",
        )
    runner = await env.module()
    if policy.network == "on" and getattr(runner, "has_network", False) is not True:
        # The tool told the model its scripts are online: never run them offline.
        raise OperationError(
            "the script policy gives scripts the network, but this workspace's script "
            "runner has none (set network to 'off', or use a runner with a network)",
            code="unsupported",
        )
    language = args.language or next(iter(sorted(runner.languages)), "javascript")
    if language not in runner.languages:
        raise OperationError(
            "language is not supported by the script runner "
            f"(available: {', '.join(sorted(runner.languages))})",
            code="policy_denied",
        )
    return exec_data(await runner.run_code(language, args.code, timeout_s=timeout_ms / 1000))


def _script_hints(policy: ScriptPolicy) -> ToolHints:
    # The isolate sees no workspace: it changes nothing, and reaches out only
    # when the policy gives it the network.
    return ToolHints(
        read_only=True, destructive=False, idempotent=False, open_world=policy.network == "on"
    )


def script_tools(policy: ScriptPolicy) -> list[ToolSpec[ScriptPolicy, CodeInterpreter]]:
    """``workspace_script``: one stateless snippet in the ephemeral runner."""
    return [
        ToolSpec(
            "workspace_script",
            "Run a short stateless script in an ephemeral isolate "
            f"(network {policy.network}, at most {policy.max_duration_ms} ms). Nothing is "
            "kept between calls. console output comes back in stdout/stderr; the value of "
            "the script's last expression (awaited when it is a promise) comes back as JSON "
            "in 'result'; an uncaught error in 'error' (name, value, traceback).",
            ScriptArgs,
            _script,
            hints=_script_hints(policy),
            output_schema=meta.EXEC_RESULT,
        )
    ]
