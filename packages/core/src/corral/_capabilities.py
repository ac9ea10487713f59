"""Capabilities: a name, a policy class, the module it needs, and its tools."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from ._errors import ConfigError
from ._refs import converter
from ._tool import ToolSpec

__all__ = ["RESERVED_PREFIXES", "Capability", "check_user_tool_name"]

RESERVED_PREFIXES: Final = ("workspace_", "companion__")


@attrs.frozen
class Capability:
    """A capability as a plugin registers it.

    Attributes:
        name: Key in ``WorkspaceConfig.capabilities`` (``fs``, ``git``...).
        policy_type: attrs class built from the config value (``True`` -> defaults).
        tools: Builds the tool specs for a parsed policy.
        module: Workspace module the tools need (defaults to ``name``); the
            registry refuses a workspace that lacks it.
        summary: One line for ``corral providers`` and docs.
    """

    name: str
    policy_type: type[Any]
    tools: Callable[[Any], Sequence[ToolSpec]] = attrs.field(repr=False)
    module: str = attrs.field()
    summary: str = ""

    @module.default
    def _module_default(self) -> str:
        return self.name

    def parse_policy(self, value: Any) -> Any:
        """Turn ``True`` or a mapping of options into a policy object.

        Raises:
            ConfigError: Unknown key, wrong type or out-of-range value; the
                message names the key (``capabilities.shell.timeout_s``).
        """
        where = f"capabilities.{self.name}"
        if value is True:
            return self.policy_type()
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected true or an object of options")
        fields = {f.name: f for f in attrs.fields(attrs.resolve_types(self.policy_type))}
        kwargs: dict[str, Any] = {}
        for key, raw in value.items():
            if not isinstance(key, str) or key not in fields:
                shown = key if isinstance(key, str) and len(key) <= 64 else "?"
                known = ", ".join(sorted(fields)) or "none"
                raise ConfigError(f"{where}: unknown option {shown!r} (known: {known})")
            try:
                kwargs[key] = converter.structure(raw, fields[key].type)
            except Exception:
                raise ConfigError(
                    f"{where}.{key}: expected {_type_name(fields[key].type)}"
                ) from None
        try:
            return self.policy_type(**kwargs)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc}") from None


def _type_name(tp: Any) -> str:
    text = getattr(tp, "__name__", None) or str(tp)
    return text.replace("typing.", "").replace("collections.abc.", "")


def check_user_tool_name(name: str) -> None:
    """Refuse user tools that take a reserved prefix.

    Raises:
        ConfigError: ``name`` starts with ``workspace_`` or ``companion__``.
    """
    for prefix in RESERVED_PREFIXES:
        if name.startswith(prefix):
            raise ConfigError(f"tool names starting with {prefix!r} are reserved for corral")
