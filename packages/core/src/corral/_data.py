"""Frozen value types shared by core, providers and tools."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

__all__ = [
    "CodeContextInfo",
    "CodeOutput",
    "CodeState",
    "CommandRequest",
    "ExecError",
    "ExecResult",
    "FileEntry",
    "FileStat",
    "FileType",
    "GrepMatch",
    "GrepOptions",
    "GrepResult",
    "ProviderConfig",
    "SessionRef",
    "SnapshotInfo",
    "WorkspaceConfig",
    "WorkspaceRef",
]

FileType = Literal["file", "dir", "symlink", "other"]
CodeState = Literal["kept", "lost", "fresh"]
"""What a code run left of its interpreter's state (see :attr:`ExecResult.state`)."""


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return dict(value or {})


def names(value: Iterable[str]) -> frozenset[str]:
    """A typed frozenset converter for attrs fields (mypy types ``frozenset`` loosely)."""
    return frozenset(value)


def _code_outputs(value: Iterable[CodeOutput]) -> tuple[CodeOutput, ...]:
    return tuple(value)


def _optional_names(value: Iterable[str] | None) -> frozenset[str] | None:
    return None if value is None else frozenset(value)


@attrs.frozen
class SessionRef:
    """Who a workspace belongs to: one workspace per session.

    Attributes:
        session_id: Stable id of the agent session (any non-empty string; providers
            sanitise it before using it in names).
        agent_id: Optional id of the agent, for logs and labels.
    """

    session_id: str = attrs.field(validator=attrs.validators.min_len(1))
    agent_id: str | None = None


@attrs.frozen
class ProviderConfig:
    """Which provider backs a workspace, with provider-specific per-session options."""

    kind: str = attrs.field(validator=attrs.validators.min_len(1))
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_mapping)


@attrs.frozen
class WorkspaceConfig:
    """A workspace declaration: the provider and the capabilities the agent gets.

    ``capabilities`` maps a capability name to ``True`` (default policy), a
    mapping of policy options, or ``False``/``None`` (not declared).
    """

    provider: ProviderConfig
    capabilities: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_mapping)

    @property
    def declared(self) -> frozenset[str]:
        """Names of the capabilities that are switched on."""
        return frozenset(k for k, v in self.capabilities.items() if v not in (False, None))


@attrs.frozen
class WorkspaceRef:
    """A serialisable handle from which a provider can re-attach a workspace.

    Attributes:
        provider_id: The provider that made it.
        payload: JSON-compatible provider data; never live objects or secrets.
        capabilities: Capabilities the provider populated (authoritative):
            exactly the modules ``open`` built, also when ``declared`` was None.
        schema_version: Version of ``payload``'s shape (N±1 contract).
    """

    provider_id: str
    payload: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_mapping)
    capabilities: frozenset[str] = attrs.field(factory=frozenset, converter=names)
    schema_version: int | None = None


@attrs.frozen
class FileStat:
    """Metadata of one path. ``path`` is the agent's view (always ``/``-rooted).

    ``size`` is the length in bytes of a file's content and 0 for a directory;
    ``mtime`` is the time of the last change to the content, in seconds since
    the Unix epoch (as ``os.stat``'s ``st_mtime``, never milliseconds);
    ``mode`` holds the permission bits only (``mode & ~0o7777 == 0``, e.g.
    ``0o644``), never the file-type bits that ``type`` already says.
    """

    path: str
    type: FileType
    size: int
    mtime: float = 0.0
    mode: int = 0


@attrs.frozen
class FileEntry:
    """One entry of a directory listing."""

    name: str
    path: str
    type: FileType
    size: int = 0


@attrs.frozen
class GrepOptions:
    """Where and how to search.

    Attributes:
        path: Directory (or file) to search under, agent's view; ``/`` by default.
        glob: Only files whose workspace path matches this glob.
        ignore_case: Case-insensitive matching.
        max_results: Stop after this many matching lines.
    """

    path: str = "/"
    glob: str | None = None
    ignore_case: bool = False
    max_results: int = 1000


@attrs.frozen
class GrepMatch:
    """A matching line; ``line_number`` starts at 1."""

    path: str
    line_number: int
    line: str


@attrs.frozen
class GrepResult:
    """Matches plus what was deliberately not searched, so "no match" is honest."""

    matches: tuple[GrepMatch, ...] = ()
    skipped_paths: tuple[str, ...] = ()
    skipped_binary_paths: tuple[str, ...] = ()
    truncated: bool = False


@attrs.frozen
class CommandRequest:
    """One shell command with the limits the capability policy put on it.

    The tool layer builds it from the model's arguments and the shell policy;
    shells enforce every field (posix-core's ShellGuard does so for the
    POSIX providers). ``stdin`` is delivered exactly (None: empty stdin, EOF
    at once); up to 64 KiB must be accepted, more may be refused with
    ``invalid_argument`` or ``too_large`` but never silently cut; text that
    stands for no bytes (a lone surrogate) is ``invalid_argument``. ``cwd`` is
    an agent path (relative to the root when relative); outside the
    workspace or missing is an ``OperationError``.
    """

    command: str
    cwd: str | None = None
    timeout_s: float = 30.0
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_mapping)
    stdin: str | None = None
    max_output_bytes: int = 1_000_000
    allowed_commands: frozenset[str] | None = attrs.field(default=None, converter=_optional_names)
    allow_shell_syntax: bool = False


@attrs.frozen
class ExecError:
    """An error raised by the code an interpreter ran (the workspace itself is fine).

    Attributes:
        name: The error's class as the language names it (``TypeError``).
        value: Its message.
        traceback: Where it was raised, as the language prints it (may be empty).
    """

    name: str
    value: str
    traceback: str = ""


@attrs.frozen
class CodeOutput:
    """One rich output of a code run, as a MIME bundle (Jupyter's ``data`` dict).

    Attributes:
        kind: ``result`` for the value of the last expression, ``display``
            for what the code showed (``display(obj)``, a matplotlib figure).
        data: MIME type -> content. Text types (``text/plain``,
            ``text/html``, ``text/markdown``, ``image/svg+xml``) as text;
            ``application/json`` as JSON text; binary types (``image/png``,
            ``image/jpeg``) base64-encoded. ``text/plain`` is always there for
            a ``result``.
    """

    kind: Literal["result", "display"]
    data: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_mapping)


@attrs.frozen
class CodeContextInfo:
    """One stateful code context, as :meth:`corral.provider.CodeContexts.list_contexts` shows it.

    Attributes:
        context_id: Its id.
        language: Its language.
        cwd: The working directory it was created with (agent path; None: the root).
        created_at: When it started, seconds since the Unix epoch.
        status: ``idle``, ``busy`` (running a cell) or ``lost`` (its
            interpreter died; ``lost_reason`` says why).
        lost_reason: Why it was lost, in one line that never repeats output.
    """

    context_id: str
    language: str
    cwd: str | None = None
    created_at: float = 0.0
    status: Literal["idle", "busy", "lost"] = "idle"
    lost_reason: str | None = None


@attrs.frozen
class ExecResult:
    """The outcome of a command or code run.

    ``exit_code`` is None when the process was killed by a signal (``signal``
    then names it) or timed out (``timed_out``); otherwise it is the exit
    status as the OS reports it (0-255). ``stdout_truncated`` /
    ``stderr_truncated`` are set exactly when that stream produced more than
    ``max_output_bytes`` (output of exactly the cap is kept whole); a short
    note (at most 200 bytes) may follow cut output. ``duration_ms`` is the
    wall time in milliseconds. Code runners also report the value the code
    returned as JSON text (``result_json``; None when it returned nothing)
    and an uncaught error (``error``); a shell leaves both None.

    A code interpreter also reports, like a notebook cell, its rich outputs
    (``outputs``, in the order they happened: what the code displayed, the
    last expression's value as a ``result`` bundle, then figures still open
    at the end of the run (matplotlib); ``outputs_truncated`` when some were
    dropped for size) and what became of its state (``state``): ``kept`` --
    the context holds everything from before plus this run's effects (also
    after an error, or a timeout the interpreter honoured by interrupting);
    ``lost`` -- the interpreter died during the run (killed after ignoring an
    interrupt, out of memory, crashed): every variable is gone and the
    context answers ``lost`` from now on; ``fresh`` -- the run used a
    throwaway interpreter (``run_code``). A shell leaves ``state`` None.
    """

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0
    signal: int | None = None
    timed_out: bool = False
    result_json: str | None = None
    error: ExecError | None = None
    outputs: tuple[CodeOutput, ...] = attrs.field(default=(), converter=_code_outputs)
    state: CodeState | None = None
    outputs_truncated: bool = False


@attrs.frozen
class SnapshotInfo:
    """A stored snapshot of a workspace."""

    snapshot_id: str
    created_at: float
    label: str | None = None
    size_bytes: int | None = None
