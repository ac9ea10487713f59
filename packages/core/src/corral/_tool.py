"""Tool types: what a capability contributes and what an agent loop calls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from ._regex import RegexEngine
    from ._registry import WorkspaceRegistry

__all__ = ["Tool", "ToolEnv", "ToolHandler", "ToolResult", "ToolSpec", "object_schema"]


def object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments: an object with no unknown keys."""
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


@attrs.frozen
class ToolResult:
    """What a tool call returns to the model.

    Attributes:
        content: Text for the model (JSON for structured results).
        is_error: The call failed; ``content`` says why in one clear line.
        data: The structured, JSON-compatible result (None on error).
        error_code: Stable classification of a failure (``not_found``...).
    """

    content: str
    is_error: bool = False
    data: Any = None
    error_code: str | None = None


class ToolEnv(Protocol):
    """What a tool handler receives besides its validated arguments."""

    @property
    def registry(self) -> WorkspaceRegistry:
        """The registry of the session's workspace."""
        ...

    @property
    def policy(self) -> Any:
        """The capability's parsed policy."""
        ...

    @property
    def regex_engine(self) -> RegexEngine:
        """The engine grep compiles patterns with."""
        ...

    async def module(self, name: str) -> Any:
        """The workspace module ``name`` (opening the workspace if needed)."""
        ...


ToolHandler = Callable[[ToolEnv, dict[str, Any]], Awaitable[Any]]
"""A handler gets validated arguments; returns JSON-compatible data or text."""


@attrs.frozen
class ToolSpec:
    """A tool as a capability declares it.

    Attributes:
        name: ``workspace_<op>``.
        description: What the model reads.
        parameters: JSON Schema (an object schema) of the arguments.
        handler: Does the work once arguments are valid.
        op: Usage name suffix: ``workspace.<op>``.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: ToolHandler
    op: str


@attrs.frozen
class Tool:
    """A tool bound to a session's workspace, ready for an agent loop.

    Call it with the model's arguments; it never raises for a failed
    operation or bad arguments: it returns an error :class:`ToolResult`.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    capability: str
    _invoke: Callable[[Any], Awaitable[ToolResult]] = attrs.field(alias="invoke", repr=False)

    async def __call__(self, arguments: Any) -> ToolResult:
        """Validate ``arguments`` and run the tool."""
        return await self._invoke(arguments)
