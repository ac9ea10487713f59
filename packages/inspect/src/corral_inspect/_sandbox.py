"""``CorralSandboxEnvironment``: one corral workspace per Inspect sample."""

from __future__ import annotations

import base64
import logging
import posixpath
import secrets
import shlex
from typing import Any, Literal, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
)
from pydantic import BaseModel

import corral
from corral import (
    OperationError,
    ProviderConfig,
    ScopedWorkspace,
    SessionRef,
    WorkspaceConfig,
    WorkspaceError,
    WorkspaceRegistry,
)
from corral.provider import CommandRequest

from ._config import CorralSandboxConfig

log = logging.getLogger("corral_inspect")

INLINE_STDIN_BYTES = 60 * 1024
"""Text input up to this size goes to the command's stdin directly; larger or
binary input is spooled to a file in the workspace (providers may refuse
stdin over 64 KiB, and stdin is text in corral's contract)."""

INLINE_COMMAND_BYTES = 48 * 1024
"""A command line longer than this runs from a script file in the workspace
(posix providers refuse command lines over 64 KiB)."""

_SPOOL_PREFIX = ".corral-inspect-"

_FILE_CAP_KINDS = frozenset({"local-sandbox", "docker", "local-bash"})
"""Built-in providers whose ``max_file_bytes`` option (10 MiB by default) is
raised to Inspect's read limit (100 MiB by default) unless set: Inspect's own
file transfers (sample files, large outputs) expect that much."""

# Exit statuses of the read-outside-the-workspace script.
_EXIT_IS_DIR = 3
_EXIT_TOO_LARGE = 5
_READ_OUTSIDE = (
    'if [ -d "$1" ]; then exit 3; fi\n'
    'size=$(wc -c < "$1") || exit 4\n'
    'if [ "$size" -gt "$2" ]; then exit 5; fi\n'
    'exec base64 < "$1"\n'
)


def _config(config: SandboxEnvironmentConfigType | None) -> CorralSandboxConfig:
    if config is None:
        return CorralSandboxConfig()
    if isinstance(config, CorralSandboxConfig):
        return config
    if isinstance(config, BaseModel):
        return CorralSandboxConfig.model_validate(config.model_dump())
    raise ValueError(
        "the corral sandbox takes a dict or CorralSandboxConfig, not a file name: "
        'sandbox=("corral", {"provider": "docker", "options": {...}})'
    )


def _exec_error(exc: OperationError, what: str) -> Exception:
    """The builtin exception Inspect expects for a corral operation error."""
    message = f"{what}: {exc}"
    match exc.code:
        case "not_found":
            return FileNotFoundError(message)
        case "is_a_directory":
            return IsADirectoryError(message)
        case "not_a_directory":
            return NotADirectoryError(message)
        case "permission_denied" | "policy_denied":
            return PermissionError(message)
        case "timeout":
            return TimeoutError(message)
        case "invalid_argument" | "invalid_path":
            return ValueError(message)
        case _:
            return RuntimeError(message)


class CorralSandboxEnvironment(SandboxEnvironment):
    """An Inspect sandbox backed by one corral workspace (``sandbox="corral"``).

    Relative paths and the default working directory are the workspace root,
    which is also where the provider's shell starts (``/workspace`` on
    local-sandbox and docker). Files persist only inside the workspace: a
    write outside it raises ``PermissionError``; a read outside it (``/etc/os-release``)
    goes through the shell, as the sandbox user.
    """

    def __init__(
        self, registry: WorkspaceRegistry, workspace: ScopedWorkspace, root: str, timeout_s: float
    ) -> None:
        """Wrap an open workspace (use ``sample_init``, not this, in an eval).

        Args:
            registry: Owns the workspace; closed at sample cleanup.
            workspace: The opened workspace (``fs`` and ``shell``).
            root: The workspace root as the shell sees it (``/workspace``).
            timeout_s: Bound of an ``exec`` without a timeout.
        """
        super().__init__()
        self.registry = registry
        self._fs = workspace.require("fs")
        self._shell = workspace.require("shell")
        self.root = root
        self._timeout_s = timeout_s

    # -- lifecycle ----------------------------------------------------------

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        """Inspect's hook for ``sandbox=("corral", {...})``: validate the dict."""
        return CorralSandboxConfig.model_validate(config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Fail the task at start, with the provider's advice, when it cannot run here."""
        cfg = _config(config)
        spec = corral.default_plugins().provider(cfg.provider)
        problem = spec.probe() if spec.probe is not None else None
        if problem is not None:
            raise SandboxUnavailableError(f"corral provider {cfg.provider!r}: {problem}")

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        """Open a fresh workspace for one sample."""
        return {"default": await cls.open(config)}

    @classmethod
    async def open(
        cls, config: SandboxEnvironmentConfigType | None = None
    ) -> CorralSandboxEnvironment:
        """Open one workspace as a sandbox (also usable outside an eval; ``close`` it).

        Raises:
            corral.ConfigError: Unknown provider kind or option, or a provider
                without ``fs`` and ``shell``.
            corral.WorkspaceFailedError: The provider cannot open a workspace
                here; the message carries its advice.
        """
        cfg = _config(config)
        options = dict(cfg.options)
        if cfg.provider in _FILE_CAP_KINDS:
            options.setdefault("max_file_bytes", SandboxEnvironmentLimits.MAX_READ_FILE_SIZE)
        provider = corral.default_plugins().provider(cfg.provider).create(options)
        registry = WorkspaceRegistry(
            WorkspaceConfig(
                provider=ProviderConfig(provider.provider_id),
                capabilities={"fs": True, "shell": True},
            ),
            SessionRef(f"inspect-{secrets.token_hex(6)}"),
            provider,
        )
        try:
            workspace = await registry.get()
            probe = await workspace.require("shell").run(CommandRequest(command="pwd"))
        except BaseException:
            await registry.close()
            raise
        root = probe.stdout.strip()
        if probe.exit_code != 0 or not posixpath.isabs(root):
            await registry.close()
            raise SandboxUnavailableError(
                f"corral provider {cfg.provider!r}: the shell did not report its directory"
            )
        return cls(registry, workspace, root, cfg.timeout_s)

    async def close(self) -> None:
        """Close the workspace and delete its data (idempotent)."""
        await self.registry.close()

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Close every workspace the sample opened; one failure does not keep the rest."""
        for env in environments.values():
            try:
                await env.as_type(CorralSandboxEnvironment).close()
            except Exception:
                log.exception("corral sandbox: closing a sample's workspace failed")

    # -- paths --------------------------------------------------------------

    def _agent_path(self, file: str) -> str | None:
        """The workspace path of ``file`` (relative to the root), None when outside."""
        full = posixpath.normpath(posixpath.join(self.root, file))
        if full == self.root:
            return "/"
        if full.startswith(self.root.rstrip("/") + "/"):
            return full[len(self.root.rstrip("/")) :]
        return None

    def _shell_path(self, agent_path: str) -> str:
        return self.root.rstrip("/") + agent_path

    # -- exec -----------------------------------------------------------------

    async def exec(  # noqa: PLR0917 -- Inspect's signature
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,  # noqa: ASYNC109 -- Inspect's signature
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run ``cmd`` (an argv, never re-split) in the workspace.

        ``user`` is refused with ``SandboxUserUnsupportedError``: a corral
        workspace has one user. ``timeout_retry`` and ``concurrency`` are
        accepted and ignored (corral never retries a command; providers bound
        their own concurrency).
        """
        if user is not None:
            raise SandboxUserUnsupportedError(
                "corral workspaces run every command as the workspace's one user"
            )
        if not cmd:
            raise ValueError("exec needs a command")
        line = shlex.join(cmd)
        request_cwd: str | None = None
        if cwd is not None:
            agent_cwd = self._agent_path(cwd)
            if agent_cwd is None:
                line = f"cd -- {shlex.quote(posixpath.normpath(cwd))} && {line}"
            else:
                request_cwd = agent_cwd
        spooled: list[str] = []
        stdin: str | None = None
        try:
            if isinstance(input, str) and len(input.encode("utf-8", "surrogatepass")) <= (
                INLINE_STDIN_BYTES
            ):
                stdin = input
            elif input is not None:
                data = input.encode("utf-8") if isinstance(input, str) else input
                path = await self._spool(data, ".in", spooled)
                line = f"{line} < {shlex.quote(self._shell_path(path))}"
            if len(line.encode("utf-8", "surrogatepass")) > INLINE_COMMAND_BYTES:
                script = await self._spool(line.encode("utf-8"), ".sh", spooled)
                line = f"exec sh {shlex.quote(self._shell_path(script))}"
            result = await self._run(
                line,
                cwd=request_cwd,
                env=env,
                timeout_s=float(timeout) if timeout is not None else None,
                stdin=stdin,
            )
        finally:
            for path in spooled:
                try:
                    await self._fs.rm(path)
                except WorkspaceError:
                    log.warning("corral sandbox: could not remove a spooled file")
        return result

    async def _spool(self, data: bytes, suffix: str, spooled: list[str]) -> str:
        path = f"/{_SPOOL_PREFIX}{secrets.token_hex(8)}{suffix}"
        spooled.append(path)
        try:
            await self._fs.write_file(path, data)
        except OperationError as exc:
            raise _exec_error(exc, "spooling exec input") from None
        except WorkspaceError as exc:
            raise SandboxUnavailableError(str(exc)) from None
        return path

    async def _run(
        self,
        line: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
        stdin: str | None = None,
        max_output: int | None = None,
    ) -> ExecResult[str]:
        limit = max_output or SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        request = CommandRequest(
            command=line,
            cwd=cwd,
            timeout_s=timeout_s or self._timeout_s,
            env=env or {},
            stdin=stdin,
            max_output_bytes=limit,
            allow_shell_syntax=True,
        )
        try:
            result = await self._shell.run(request)
        except OperationError as exc:
            raise _exec_error(exc, "exec") from None
        except WorkspaceError as exc:
            raise SandboxUnavailableError(str(exc)) from None
        if result.timed_out:
            raise TimeoutError(f"command timed out after {request.timeout_s:g} s")
        if result.stdout_truncated or result.stderr_truncated:
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                truncated_output=result.stdout,
            )
        code = 128 + (result.signal or 9) if result.exit_code is None else result.exit_code
        if code == 126 and "permission denied" in result.stderr.casefold():
            raise PermissionError(f"cannot execute: {result.stderr.strip()[:200]}")
        return ExecResult(
            success=code == 0, returncode=code, stdout=result.stdout, stderr=result.stderr
        )

    # -- files --------------------------------------------------------------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Write a file in the workspace, creating its parent directories.

        Raises:
            PermissionError: ``file`` is outside the workspace (nothing else
                persists between commands on every provider), or not writable.
            IsADirectoryError: ``file`` is a directory.
        """
        path = self._agent_path(file)
        if path is None:
            raise PermissionError(
                f"{file}: outside the corral workspace ({self.root}); only the workspace "
                "persists between commands"
            )
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        try:
            await self._fs.write_file(path, data)
        except OperationError as exc:
            raise _exec_error(exc, file) from None
        except WorkspaceError as exc:
            raise SandboxUnavailableError(str(exc)) from None

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """Read a file: from the workspace directly, from elsewhere through the shell.

        Raises:
            FileNotFoundError, IsADirectoryError, PermissionError: As their names say.
            OutputLimitExceededError: The file is larger than Inspect's read limit.
        """
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        path = self._agent_path(file)
        if path is None:
            data = await self._read_outside(file, limit)
        else:
            try:
                data = await self._fs.read_file(path, max_bytes=limit)
            except OperationError as exc:
                if exc.code == "too_large":
                    raise OutputLimitExceededError(
                        limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR,
                        truncated_output=None,
                    ) from None
                raise _exec_error(exc, file) from None
            except WorkspaceError as exc:
                raise SandboxUnavailableError(str(exc)) from None
        # newline="" semantics: bytes are decoded as they are, CRLF kept
        return data.decode("utf-8") if text else data

    async def _read_outside(self, file: str, limit: int) -> bytes:
        line = shlex.join(["sh", "-c", _READ_OUTSIDE, "sh", posixpath.normpath(file), str(limit)])
        # base64 is 4/3 of the data plus a newline every 76 characters
        result = await self._run(line, max_output=limit * 2 + 4096)
        if result.returncode == _EXIT_IS_DIR:
            raise IsADirectoryError(f"{file}: is a directory")
        if result.returncode == _EXIT_TOO_LARGE:
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
            )
        if not result.success:
            reason = result.stderr.casefold()
            if "no such file" in reason or "not a directory" in reason:
                raise FileNotFoundError(f"{file}: no such file")
            if "permission denied" in reason:
                raise PermissionError(f"{file}: permission denied")
            raise RuntimeError(f"{file}: could not be read (exit {result.returncode})")
        return base64.b64decode(result.stdout)
