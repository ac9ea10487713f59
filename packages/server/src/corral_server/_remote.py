"""A durable workspace as a library workspace: its modules call the service's API.

:class:`DurableWorkspaceProvider` opens *one* durable workspace of a
``corral serve``: ``open`` connects it (materialising its box through the
service) and returns a workspace whose ``fs``, ``shell`` and ``process``
modules are API calls -- ``fs`` through ``POST .../live/fs`` (the live box's
own module, so file semantics are the pinned provider's), ``shell`` and
``process`` through exec/PTY handles. Anything built on workspaces then
works on a durable one unchanged: ``corral mcp --workspace ID`` is
``corral_mcp`` serving this provider's workspace.

Closing the workspace only drops the HTTP connections: the durable
workspace stays live (its idle auto-stop takes a version) and nothing the
agent did is lost. The token is never put in a ref (refs are persisted).
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn, get_args

import anyio
import attrs
import httpx

from corral import ConfigError
from corral.provider import (
    CommandRequest,
    CursorExpiredError,
    ErrorCode,
    ExecResult,
    FileEntry,
    FileStat,
    GrepMatch,
    GrepOptions,
    GrepResult,
    Matcher,
    ModularWorkspace,
    OpenedWorkspace,
    OperationError,
    ProcessInfo,
    ProcessRequest,
    ProviderConfig,
    SessionRef,
    StreamChunk,
    StreamName,
    TerminalSize,
    Workspace,
    WorkspaceFailedError,
    WorkspaceRef,
    check_ref_schema_version,
)

from ._client import ApiError, AsyncClient, client_settings
from ._model import _ID_RE

__all__ = ["PROVIDER_ID", "DurableWorkspaceProvider"]

PROVIDER_ID: Final = "corral-server"
SCHEMA_VERSION: Final = 1
SUPPORTED_CAPABILITIES: Final = frozenset({"fs", "shell", "process"})
_PROCESS_FIELDS: Final = frozenset(f.name for f in attrs.fields(ProcessInfo))
# Every library error code but the one that needs a field the API sends apart
# (cursor_expired carries the earliest cursor; see _raise).
_OP_CODES: Final = frozenset(get_args(ErrorCode)) - {"cursor_expired"}
_API_CODES: Final = {
    "invalid_argument": "invalid_argument",
    "forbidden": "policy_denied",
    "not_found": "not_found",
    "conflict": "closed",
    "busy": "busy",
    "too_large": "too_large",
    "unsupported": "unsupported",
}


def _raise(exc: ApiError, *, workspace_level: bool = False) -> NoReturn:
    """The library error of an API error (the server's messages never echo input)."""
    if exc.code == "unauthenticated":
        raise WorkspaceFailedError(
            "the corral server refused the token", provider_id=PROVIDER_ID
        ) from None
    if exc.code == "operation_failed":
        code = str(exc.details.get("op_code"))
        raise OperationError(exc.message, code=code if code in _OP_CODES else "failed") from None  # type: ignore[arg-type]
    if exc.code == "cursor_expired":
        earliest = exc.details.get("earliest")
        raise CursorExpiredError(
            exc.message, earliest=earliest if isinstance(earliest, int) else 0
        ) from None
    if exc.code == "not_found" and workspace_level:
        raise WorkspaceFailedError(
            "the durable workspace is gone (deleted, or not in the token's project)",
            provider_id=PROVIDER_ID,
        ) from None
    if exc.code == "conflict" and workspace_level:
        raise WorkspaceFailedError("the durable workspace is archived", provider_id=PROVIDER_ID)
    if exc.code in ("unavailable", "failed") and workspace_level:
        raise WorkspaceFailedError(
            "the corral server could not serve the workspace",
            provider_id=PROVIDER_ID,
            transient=True,
        ) from None
    code = _API_CODES.get(exc.code, "failed")
    raise OperationError(exc.message, code=code) from None  # type: ignore[arg-type]


def _unreachable() -> NoReturn:
    raise WorkspaceFailedError(
        "the corral server could not be reached", provider_id=PROVIDER_ID, transient=True
    ) from None


class _Api:
    """The calls of one durable workspace, with errors turned into library errors."""

    def __init__(self, client: AsyncClient, workspace_id: str) -> None:
        self.client = client
        self.ws = workspace_id

    async def call(self, method: str, *args: Any, workspace_level: bool = False, **kw: Any) -> Any:
        try:
            return await getattr(self.client, method)(self.ws, *args, **kw)
        except ApiError as exc:
            _raise(exc, workspace_level=workspace_level)
        except httpx.TransportError:
            _unreachable()

    async def fs(self, op: str, **arguments: Any) -> dict[str, Any]:
        out: dict[str, Any] = await self.call("live_fs", op, workspace_level=True, **arguments)
        return out


class RemoteFileSystem:
    """The live box's ``fs`` module, one API call per operation."""

    def __init__(self, api: _Api) -> None:
        self._api = api

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a file of the live box."""
        kw = {} if max_bytes is None else {"max_bytes": max_bytes}
        return base64.b64decode((await self._api.fs("read_file", path=path, **kw))["data"])

    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file of the live box (bounded by the server's request size limit)."""
        await self._api.fs("write_file", path=path, data=base64.b64encode(data).decode("ascii"))

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Replace text in a file of the live box."""
        out = await self._api.fs(
            "edit_file", path=path, old_text=old_text, new_text=new_text, replace_all=replace_all
        )
        return int(out["count"])

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        """List a directory of the live box."""
        return [FileEntry(**e) for e in (await self._api.fs("ls", path=path))["entries"]]

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        """Glob in the live box."""
        return list((await self._api.fs("glob", pattern=pattern, path=path))["paths"])

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Search the live box; the service compiles ``matcher.pattern`` with its own engine."""
        out = await self._api.fs(
            "grep",
            pattern=matcher.pattern,
            path=options.path,
            glob=options.glob,
            ignore_case=options.ignore_case,
            max_results=options.max_results,
        )
        return GrepResult(
            matches=tuple(GrepMatch(**m) for m in out["matches"]),
            skipped_paths=tuple(out["skipped_paths"]),
            skipped_binary_paths=tuple(out["skipped_binary_paths"]),
            truncated=bool(out["truncated"]),
        )

    async def stat(self, path: str) -> FileStat:
        """Describe a path of the live box."""
        return FileStat(**(await self._api.fs("stat", path=path)))

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory in the live box."""
        await self._api.fs("mkdir", path=path, parents=parents)

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove a path of the live box."""
        await self._api.fs("rm", path=path, recursive=recursive)


def _info(handle: Mapping[str, Any]) -> ProcessInfo:
    fields = {k: v for k, v in handle.items() if k in _PROCESS_FIELDS}
    terminal = fields.get("terminal")
    fields["terminal"] = TerminalSize(**terminal) if isinstance(terminal, Mapping) else None
    fields["process_id"] = handle["id"]
    return ProcessInfo(**fields)


def _start_body(request: ProcessRequest) -> dict[str, Any]:
    """The exec/PTY body of a request (the command goes separately)."""
    body: dict[str, Any] = {
        "env": dict(request.env),
        "retained_bytes": max(1024, min(256 << 20, request.retained_bytes)),
        "allow_shell_syntax": request.allow_shell_syntax,
    }
    if request.cwd is not None:
        body["cwd"] = request.cwd
    if request.timeout_s is not None:
        body["timeout_s"] = request.timeout_s
    if request.allowed_commands is not None:
        body["allowed_commands"] = sorted(request.allowed_commands)
    return body


class RemoteProcesses:
    """The live box's processes as the service's exec and PTY handles (ids are handle ids)."""

    def __init__(self, api: _Api) -> None:
        self._api = api

    async def start(self, request: ProcessRequest) -> ProcessInfo:
        """Start an exec handle, or a PTY handle when ``request.terminal`` is set."""
        body = _start_body(request)
        if request.terminal is None:
            h = await self._api.call("exec", request.command, **body)
        else:
            size = request.terminal
            h = await self._api.call(
                "pty", command=request.command, cols=size.cols, rows=size.rows, **body
            )
        return _info(h)

    async def read(
        self,
        process_id: str,
        stream: StreamName = "stdout",
        *,
        cursor: int = 0,
        max_bytes: int = 65536,
        wait_s: float = 0.0,
    ) -> StreamChunk:
        """Read a stream after a cursor (waits of more than 60 s are cut to 60 s)."""
        if cursor < 0 or max_bytes < 1 or wait_s < 0:
            raise OperationError(
                "cursor, max_bytes or wait_s is out of range", code="invalid_argument"
            )
        data, nxt, ended = await self._api.call(
            "read",
            process_id,
            stream=stream,
            cursor=cursor,
            max_bytes=min(max_bytes, 1 << 20),
            wait_s=min(wait_s, 60.0),
        )
        return StreamChunk(data=data, cursor=cursor, next_cursor=nxt, ended=ended)

    async def write_stdin(self, process_id: str, data: bytes) -> None:
        """Send bytes to the process's input."""
        await self._api.call("write_stdin", process_id, data)

    async def close_stdin(self, process_id: str) -> None:
        """Close the process's input."""
        await self._api.call("write_stdin", process_id, b"", close=True)

    async def wait(self, process_id: str, *, timeout_s: float) -> ProcessInfo:
        """Wait for the end (in waits of at most 300 s, the API's bound)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            left = max(0.0, deadline - time.monotonic())
            info = _info(await self._api.call("wait", process_id, timeout_s=min(left, 300.0)))
            if info.state != "running" or left <= 300.0:
                return info

    async def signal(self, process_id: str, signal: int) -> None:
        """Signal the process group."""
        await self._api.call("signal", process_id, signal)

    async def kill(self, process_id: str) -> ProcessInfo:
        """Kill the process tree."""
        return _info(await self._api.call("kill", process_id))

    async def resize(self, process_id: str, size: TerminalSize) -> None:
        """Resize the process's terminal."""
        await self._api.call("resize", process_id, size.cols, size.rows)

    async def info(self, process_id: str) -> ProcessInfo:
        """The handle's current info."""
        return _info(await self._api.call("handle", process_id))

    async def list(self) -> Sequence[ProcessInfo]:
        """Every handle of the durable workspace (also those of earlier sessions)."""
        return [_info(h) for h in await self._api.call("handles", workspace_level=True)]

    async def remove(self, process_id: str) -> None:
        """Not offered: handles are the durable workspace's record and stay."""
        raise OperationError("handles of a durable workspace are kept", code="unsupported")


class RemoteShell:
    """Commands as exec handles, waited for and read back whole."""

    def __init__(self, processes: RemoteProcesses) -> None:
        self._pm = processes

    async def run(self, request: CommandRequest) -> ExecResult:
        """Run one command; the box's guard enforces the policy the request carries."""
        try:
            stdin = None if request.stdin is None else request.stdin.encode("utf-8")
        except UnicodeEncodeError:
            raise OperationError("stdin is not valid text", code="invalid_argument") from None
        started = time.monotonic()
        info = await self._pm.start(
            ProcessRequest(
                command=request.command,
                cwd=request.cwd,
                env=request.env,
                timeout_s=request.timeout_s,
                retained_bytes=max(1024, request.max_output_bytes + 1),
                allowed_commands=request.allowed_commands,
                allow_shell_syntax=request.allow_shell_syntax,
            )
        )
        pid = info.process_id
        try:
            try:
                if stdin:
                    await self._pm.write_stdin(pid, stdin)
                await self._pm.close_stdin(pid)
            except OperationError as exc:
                if exc.code != "closed":  # it ended before reading its input
                    raise
            info = await self._pm.wait(pid, timeout_s=request.timeout_s + 30.0)
            if info.state == "running":
                info = await self._pm.kill(pid)
            out, out_cut = await self._collect(pid, "stdout", info, request.max_output_bytes)
            err, err_cut = await self._collect(pid, "stderr", info, request.max_output_bytes)
        except BaseException:
            # The command ended or the server is gone: nothing left to kill.
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(10),
                contextlib.suppress(Exception),
            ):
                await self._pm.kill(pid)
            raise
        timed_out = info.state == "killed" and info.reason == "timeout"
        return ExecResult(
            exit_code=None if timed_out else info.exit_code,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            stdout_truncated=out_cut,
            stderr_truncated=err_cut,
            duration_ms=(time.monotonic() - started) * 1000.0,
            signal=None if timed_out else info.signal,
            timed_out=timed_out,
        )

    async def _collect(
        self, pid: str, stream: StreamName, info: ProcessInfo, cap: int
    ) -> tuple[bytes, bool]:
        start = info.stdout_start if stream == "stdout" else info.stderr_start
        end = info.stdout_end if stream == "stdout" else info.stderr_end
        buf = bytearray()
        cursor = start
        while cursor < end and len(buf) < cap:
            chunk = await self.read_some(pid, stream, cursor, min(1 << 20, cap - len(buf)))
            if not chunk.data:
                break
            buf += chunk.data
            cursor = chunk.next_cursor
        return bytes(buf), end - start > cap or start > 0

    async def read_some(self, pid: str, stream: StreamName, cursor: int, n: int) -> StreamChunk:
        """One read of an ended process's stream."""
        return await self._pm.read(pid, stream, cursor=cursor, max_bytes=n)


class DurableWorkspaceProvider:
    """Opens one durable workspace of a ``corral serve`` as a library workspace.

    Build it with :meth:`connect` (which checks the id and the token against
    the server first, and learns the workspace's capabilities).

    Args:
        url: The server's URL.
        token: The project's bearer token (kept in memory only).
        workspace_id: The durable workspace.
        capabilities: Modules to offer (``fs``, ``shell``, ``process``).
        verify: TLS verification (a CA bundle path, or False for tests only).
    """

    def __init__(
        self,
        url: str,
        token: str,
        workspace_id: str,
        *,
        capabilities: frozenset[str] = SUPPORTED_CAPABILITIES,
        verify: bool | str = True,
    ) -> None:
        if not _ID_RE.fullmatch(workspace_id) or not workspace_id.startswith("ws-"):
            raise ConfigError("the workspace id is not a valid id (ws-...)")
        self.url = url
        self.workspace_id = workspace_id
        self._token = token
        self._verify = verify
        self._capabilities = frozenset(capabilities) & SUPPORTED_CAPABILITIES

    @classmethod
    async def connect(
        cls,
        workspace_id: str,
        *,
        url: str | None = None,
        token: str | None = None,
        data: Path | None = None,
        verify: bool | str = True,
    ) -> DurableWorkspaceProvider:
        """A provider for ``workspace_id``, checked against the server.

        ``url`` and ``token`` default as for ``corral ws`` (see
        :func:`corral_server.client_settings`).

        Raises:
            ConfigError: Malformed id, no token, a token the server refuses,
                a workspace the token's project does not have, or an
                unreachable server (messages never repeat the token).
        """
        url, token = client_settings(url, token, data)
        probe = cls(url, token, workspace_id, verify=verify)
        async with AsyncClient(url, token, verify=verify) as client:
            try:
                rec = await client.get(workspace_id)
            except ApiError as exc:
                if exc.code == "unauthenticated":
                    raise ConfigError("the corral server refused the token") from None
                if exc.code in ("not_found", "invalid_argument"):
                    raise ConfigError("no such workspace in the token's project") from None
                raise ConfigError("the corral server refused the request") from None
            except httpx.HTTPError:
                raise ConfigError("the corral server could not be reached") from None
        if rec.get("state") != "active":
            raise ConfigError("the workspace is archived")
        caps = frozenset(rec.get("sandbox", {}).get("capabilities", SUPPORTED_CAPABILITIES))
        return cls(url, token, probe.workspace_id, capabilities=caps, verify=verify)

    @property
    def provider_id(self) -> str:
        """Always ``corral-server``."""
        return PROVIDER_ID

    @property
    def capabilities(self) -> frozenset[str]:
        """The durable workspace's modules this adapter can carry."""
        return self._capabilities

    @property
    def schema_version(self) -> int:
        """The ref payload version."""
        return SCHEMA_VERSION

    async def open(
        self,
        config: ProviderConfig,
        session: SessionRef,
        declared: frozenset[str] | None = None,
    ) -> OpenedWorkspace:
        """Connect the durable workspace (materialising its box) and return it.

        Raises:
            WorkspaceFailedError: Per-session options were given, ``declared``
                names a module it lacks, or the server refused.
        """
        if config.options:
            raise WorkspaceFailedError(
                "a durable workspace takes no per-session options", provider_id=PROVIDER_ID
            )
        caps = self._capabilities if declared is None else frozenset(declared)
        if not caps <= self._capabilities:
            raise WorkspaceFailedError(
                "a declared capability is not offered by the durable workspace",
                provider_id=PROVIDER_ID,
            )
        workspace = await self._attach(caps)
        ref = WorkspaceRef(
            PROVIDER_ID,
            payload={"workspace_id": self.workspace_id},
            capabilities=caps,
            schema_version=SCHEMA_VERSION,
        )
        return OpenedWorkspace(workspace, ref)

    async def resolve(self, ref: WorkspaceRef) -> Workspace:
        """Re-attach the same durable workspace from a ref this provider made.

        Raises:
            WorkspaceFailedError: A foreign or malformed ref, or one of another workspace.
        """
        if not isinstance(ref, WorkspaceRef) or ref.provider_id != PROVIDER_ID:
            raise WorkspaceFailedError("workspace ref is foreign", provider_id=PROVIDER_ID)
        check_ref_schema_version(
            ref.schema_version, provider_id=PROVIDER_ID, current=SCHEMA_VERSION
        )
        if ref.payload.get("workspace_id") != self.workspace_id:
            raise WorkspaceFailedError(
                "the ref names another durable workspace", provider_id=PROVIDER_ID
            )
        if not ref.capabilities <= self._capabilities:
            raise WorkspaceFailedError(
                "the ref names a capability the workspace lacks", provider_id=PROVIDER_ID
            )
        return await self._attach(ref.capabilities)

    async def _attach(self, caps: frozenset[str]) -> Workspace:
        client = AsyncClient(self.url, self._token, verify=self._verify)
        api = _Api(client, self.workspace_id)
        try:
            await api.call("connect", workspace_level=True)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await client.aclose()
            raise
        processes = RemoteProcesses(api)
        extra: dict[str, object] = {"process": processes} if "process" in caps else {}
        url, ws_id = self.url, self.workspace_id
        return ModularWorkspace(
            f"{PROVIDER_ID}:{ws_id}",
            fs=RemoteFileSystem(api) if "fs" in caps else None,
            shell=RemoteShell(processes) if "shell" in caps else None,
            extra_modules=extra,
            on_close=client.aclose,
            details=lambda: {"server": url, "workspace_id": ws_id},
        )

    def __repr__(self) -> str:
        return f"DurableWorkspaceProvider({self.url!r}, {self.workspace_id!r})"
