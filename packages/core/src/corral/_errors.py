"""The error model: failed workspaces, evicted workspaces, failed operations.

Three kinds, after the spec's error model:

* :class:`WorkspaceFailedError` -- the workspace cannot be opened or
  resolved. Raised by providers from ``open``/``resolve`` (and by the
  registry for contract violations). ``transient=True`` asks the registry to
  retry with backoff; only the provider knows when that is safe.
* :class:`WorkspaceEvictedError` -- raised by *module methods* when the
  backing resource is gone but the ref may re-resolve (a tmpdir cleaned, a
  container stopped). The tool layer re-resolves and retries exactly once.
* :class:`OperationError` -- the operation failed, the workspace is fine
  (file not found, command rejected by policy...). It reaches the model as a
  tool error carrying :attr:`OperationError.code`.

Messages never echo untrusted input verbatim beyond what the caller itself
supplied as a tool argument; payload validation errors are bare.
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "ConfigError",
    "ErrorCode",
    "OperationError",
    "WorkspaceError",
    "WorkspaceEvictedError",
    "WorkspaceFailedError",
]

ErrorCode = Literal[
    "not_found",
    "exists",
    "is_a_directory",
    "not_a_directory",
    "not_empty",
    "invalid_path",
    "invalid_argument",
    "unsupported_file_type",
    "too_large",
    "permission_denied",
    "policy_denied",
    "not_unique",
    "no_match",
    "timeout",
    "unsupported",
    "closed",
    "cursor_expired",
    "lost",
    "busy",
    "failed",
]

ERROR_CODES: Final[frozenset[str]] = frozenset(ErrorCode.__args__)  # type: ignore[attr-defined]


class WorkspaceError(Exception):
    """Base class of every error corral raises on purpose."""


class WorkspaceFailedError(WorkspaceError):
    """The workspace could not be opened, resolved, or has been lost.

    Args:
        message: What went wrong and, where possible, what to do about it.
        provider_id: The provider that failed, when known.
        transient: The provider believes a retry may succeed.
        cause: The underlying exception, kept for operators (also chained).
    """

    def __init__(
        self,
        message: str,
        *,
        provider_id: str | None = None,
        transient: bool = False,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider_id = provider_id
        self.transient = transient
        self.cause = cause
        if cause is not None:
            self.__cause__ = cause


class WorkspaceEvictedError(WorkspaceError):
    """The workspace's backing resource went away; re-resolving may recover it."""

    def __init__(self, message: str, *, provider_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.provider_id = provider_id


class OperationError(WorkspaceError):
    """An operation failed while the workspace itself is fine.

    Args:
        message: A clear sentence for the model; it may name the path the
            model asked for, never content the model did not supply.
        code: A stable machine-readable classification.
    """

    def __init__(self, message: str, *, code: ErrorCode = "failed") -> None:
        super().__init__(message)
        self.message = message
        self.code: ErrorCode = code


class ConfigError(WorkspaceError, ValueError):
    """A configuration value is wrong; the message names the key, not the value."""
