"""Records of the service (workspaces, versions, handles) and the checks on client input.

Every value that arrives over HTTP goes through a ``check_*`` function here
before anything else sees it: types first (JSON gives ``true`` where a
string was meant), then sizes, then shapes. A failed check raises
:class:`ServiceError` naming the field, never echoing the value.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import attrs

from ._errors import ServiceError

__all__ = [
    "RUNTIME_PATHS",
    "HandleRecord",
    "SandboxDefinition",
    "VersionRecord",
    "WorkspaceRecord",
    "WorkspaceState",
    "check_bool",
    "check_int",
    "check_mapping",
    "check_metadata",
    "check_mount_path",
    "check_str",
    "check_tags",
    "new_id",
]

WorkspaceState = Literal["active", "archived"]
"""``active`` (usable) or ``archived`` (kept, read-only: no materialization)."""

RUNTIME_PATHS: Final = ("/dev", "/proc", "/sys", "/run", "/tmp", "/opt/corral")  # noqa: S108 - names, not used
"""Paths the runtime owns: a workspace mount path may not be, contain or lie under one."""

_ID_RE: Final = re.compile(r"(ws|ver|h|prj)-[0-9a-f]{32}")
_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_TAG_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/=-]{0,63}")
MAX_TAGS: Final = 32
MAX_METADATA_BYTES: Final = 16 << 10


def new_id(prefix: str) -> str:
    """An unguessable id (128 random bits) such as ``ws-<32 hex>``."""
    return f"{prefix}-{secrets.token_hex(16)}"


def check_id(value: object, prefix: str, what: str) -> str:
    """A well-formed id of the given kind, else ``invalid_argument`` (never found anyway)."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value) or not value.startswith(prefix):
        raise ServiceError(f"{what} is not a valid id")
    return value


def check_name(value: object, what: str) -> str:
    """A lower-case name (project names): 1-63 of ``a-z 0-9 . _ -``."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ServiceError(f"{what} must be 1-63 characters of a-z, 0-9, '.', '_' or '-'")
    return value


def check_str(value: object, what: str, *, max_len: int = 4096, empty: bool = False) -> str:
    """A string of bounded length without NUL."""
    if not isinstance(value, str):
        raise ServiceError(f"{what} must be a string")
    if len(value) > max_len:
        raise ServiceError(f"{what} is longer than {max_len} characters")
    if not value and not empty:
        raise ServiceError(f"{what} must not be empty")
    if "\0" in value:
        raise ServiceError(f"{what} must not contain NUL")
    return value


def check_int(value: object, what: str, *, lo: int, hi: int) -> int:
    """An integer (``true`` is not one) within ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServiceError(f"{what} must be an integer")
    if not lo <= value <= hi:
        raise ServiceError(f"{what} must be between {lo} and {hi}")
    return value


def check_number(value: object, what: str, *, lo: float, hi: float) -> float:
    """A number (not a boolean) within ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ServiceError(f"{what} must be a number")
    if not lo <= value <= hi:
        raise ServiceError(f"{what} must be between {lo} and {hi}")
    return float(value)


def check_bool(value: object, what: str) -> bool:
    """A JSON boolean."""
    if not isinstance(value, bool):
        raise ServiceError(f"{what} must be a boolean")
    return value


def check_mapping(value: object, what: str) -> dict[str, Any]:
    """A JSON object with string keys."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ServiceError(f"{what} must be an object")
    return dict(value)


def check_metadata(value: object) -> dict[str, Any]:
    """User metadata: a JSON object of at most 16 KiB once encoded."""
    meta = check_mapping(value, "metadata")
    if len(json.dumps(meta, separators=(",", ":"))) > MAX_METADATA_BYTES:
        raise ServiceError(f"metadata is larger than {MAX_METADATA_BYTES} bytes")
    return meta


def check_tags(value: object) -> tuple[str, ...]:
    """Tags: a list of at most 32 distinct short tags (sorted, duplicates dropped)."""
    if not isinstance(value, list | tuple):
        raise ServiceError("tags must be a list of strings")
    if len(value) > MAX_TAGS:
        raise ServiceError(f"tags holds more than {MAX_TAGS} entries")
    for tag in value:
        check_tag(tag)
    return tuple(sorted(set(value)))


def check_tag(value: object) -> str:
    """One tag: 1-64 of letters, digits and ``. _ : / = -``, starting alphanumeric."""
    if not isinstance(value, str) or not _TAG_RE.fullmatch(value):
        raise ServiceError(
            "a tag must be 1-64 characters of letters, digits, '.', '_', ':', '/', '=' or '-'"
        )
    return value


def check_mount_path(value: object) -> str:
    """The workspace mount path: absolute, not ``/``, no ``..``, clear of runtime paths."""
    path = check_str(value, "mount_path", max_len=255)
    if not path.startswith("/"):
        raise ServiceError("mount_path must be absolute")
    parts = [p for p in path.split("/") if p]
    if ".." in parts:
        raise ServiceError("mount_path must not contain '..'")
    norm = "/" + "/".join(p for p in parts if p != ".")
    if norm == "/":
        raise ServiceError("mount_path must not be '/'")
    for runtime in RUNTIME_PATHS:
        if norm == runtime or norm.startswith(runtime + "/") or runtime.startswith(norm + "/"):
            raise ServiceError(f"mount_path must not overlap the runtime path {runtime}")
    return norm


@attrs.frozen
class SandboxDefinition:
    """The sandbox a workspace is pinned to at create: later materializations use exactly this.

    Attributes:
        provider: Provider kind (as ``corral providers`` lists it).
        provider_options: Keyword options of the provider's factory.
        options: Per-workspace provider options (``ProviderConfig.options``).
        image: Image for providers that run one (added to ``options`` as
            ``image`` when the box is opened); None for the others.
        mount_path: Where the workspace appears to commands (see
            :func:`check_mount_path`).
        capabilities: Modules opened on a materialization.
    """

    provider: str
    provider_options: Mapping[str, Any] = attrs.field(factory=dict)
    options: Mapping[str, Any] = attrs.field(factory=dict)
    image: str | None = None
    mount_path: str = "/workspace"
    capabilities: tuple[str, ...] = ("fs", "shell", "process")

    def session_options(self) -> dict[str, Any]:
        """``ProviderConfig.options`` of a materialization (the image folded in)."""
        opts = dict(self.options)
        if self.image is not None:
            opts["image"] = self.image
        return opts

    def to_json(self) -> dict[str, Any]:
        """The definition as a JSON object."""
        return {
            "provider": self.provider,
            "provider_options": dict(self.provider_options),
            "options": dict(self.options),
            "image": self.image,
            "mount_path": self.mount_path,
            "capabilities": list(self.capabilities),
        }

    @classmethod
    def from_json(cls, value: object) -> SandboxDefinition:
        """Validate a client's definition (types, sizes, path rules)."""
        raw = check_mapping(value, "sandbox")
        unknown = set(raw) - {
            "provider",
            "provider_options",
            "options",
            "image",
            "mount_path",
            "capabilities",
        }
        if unknown:
            raise ServiceError("sandbox has an unknown field")
        if len(json.dumps(raw, separators=(",", ":"), default=str)) > MAX_METADATA_BYTES:
            raise ServiceError(f"sandbox is larger than {MAX_METADATA_BYTES} bytes")
        provider = check_str(raw.get("provider"), "sandbox.provider", max_len=64)
        image = raw.get("image")
        if image is not None:
            image = check_str(image, "sandbox.image", max_len=255)
        caps = raw.get("capabilities", ["fs", "shell", "process"])
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            raise ServiceError("sandbox.capabilities must be a list of strings")
        for cap in caps:
            check_name(cap, "a capability")
        return cls(
            provider=provider,
            provider_options=check_mapping(raw.get("provider_options", {}), "provider_options"),
            options=check_mapping(raw.get("options", {}), "sandbox.options"),
            image=image,
            mount_path=check_mount_path(raw.get("mount_path", "/workspace")),
            capabilities=tuple(sorted(set(caps))),
        )


@attrs.frozen
class WorkspaceRecord:
    """One durable workspace as the store keeps it."""

    id: str
    project: str
    sandbox: SandboxDefinition
    metadata: Mapping[str, Any]
    tags: tuple[str, ...]
    state: WorkspaceState
    current_version_id: str | None
    created_at: float
    updated_at: float

    def to_json(self, *, live: bool | None = None) -> dict[str, Any]:
        """The record as the API returns it."""
        out: dict[str, Any] = {
            "id": self.id,
            "project": self.project,
            "sandbox": self.sandbox.to_json(),
            "metadata": dict(self.metadata),
            "tags": list(self.tags),
            "state": self.state,
            "current_version_id": self.current_version_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
        if live is not None:
            out["live"] = live
        return out


@attrs.frozen
class VersionRecord:
    """A ready version: its manifest's digest in the blob store and totals."""

    id: str
    workspace_id: str
    manifest: str
    created_at: float
    files: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        """The record as the API returns it."""
        return {
            "id": self.id,
            "workspace_id": self.workspace_id,
            "created_at": self.created_at,
            "files": self.files,
            "bytes": self.bytes,
        }


@attrs.frozen
class HandleRecord:
    """An exec or PTY handle: which process of which workspace, and what was last known of it.

    Attributes:
        id: The handle's id (what clients name).
        workspace_id: Its workspace.
        process_id: The id the workspace's process module gave it.
        kind: ``exec`` or ``pty``.
        command: The command line.
        info: The last :class:`corral.provider.ProcessInfo` seen, as JSON.
        created_at: When it was created.
    """

    id: str
    workspace_id: str
    process_id: str
    kind: Literal["exec", "pty"]
    command: str
    info: Mapping[str, Any]
    created_at: float

    def to_json(self) -> dict[str, Any]:
        """The record as the API returns it."""
        return {
            "id": self.id,
            "workspace_id": self.workspace_id,
            "kind": self.kind,
            "command": self.command,
            "created_at": self.created_at,
            **dict(self.info),
        }


def json_list(value: Sequence[Any]) -> str:
    """Compact JSON text of a list (as the store keeps lists)."""
    return json.dumps(list(value), separators=(",", ":"))
