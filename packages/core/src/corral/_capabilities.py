"""Capabilities: a name, a policy class, the module it needs, and its tools."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Generic, TypeAlias, TypeVar

import attrs
from attrs import AttrsInstance

from ._errors import ConfigError
from ._policies import structure_option
from ._refs import converter
from ._tool import ToolSpec

__all__ = ["RESERVED_PREFIXES", "AnyCapability", "Capability", "check_user_tool_name"]

RESERVED_PREFIXES: Final = ("workspace_", "companion__")

PolicyT = TypeVar("PolicyT", bound=AttrsInstance)
ModuleT = TypeVar("ModuleT")


@attrs.frozen
class Capability(Generic[PolicyT, ModuleT]):
    """A capability as a plugin registers it, generic in its policy and module types.

    ``Capability("git", GitPolicy, git_tools, module="git")`` is a
    ``Capability[GitPolicy, Git]`` when ``git_tools`` returns
    ``list[ToolSpec[GitPolicy, Git]]``: the type checker ties the policy
    class, the module every handler gets and the handlers together.

    Attributes:
        name: Key in ``WorkspaceConfig.capabilities`` (``fs``, ``git``...).
        policy_type: attrs class built from the config value (``True`` -> defaults).
        tools: Builds the tool specs for a parsed policy.
        module: Workspace module the tools need (defaults to ``name``); the
            registry refuses a workspace that lacks it.
        summary: One line for ``corral providers`` and docs.
        controls_session: The tools may switch the session to another
            workspace of the same provider (``env.session``); only capabilities
            that must (snapshot restore and branch) should ask.
    """

    name: str
    policy_type: type[PolicyT]
    tools: Callable[[PolicyT], Sequence[ToolSpec[PolicyT, ModuleT]]] = attrs.field(repr=False)
    module: str = attrs.field()
    summary: str = ""
    controls_session: bool = False

    @module.default
    def _module_default(self) -> str:
        return self.name

    def parse_policy(self, value: object) -> PolicyT:
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
        kwargs: dict[str, object] = {}
        for key, raw in value.items():
            if not isinstance(key, str) or key not in fields:
                shown = key if isinstance(key, str) and len(key) <= 64 else "?"
                known = ", ".join(sorted(fields)) or "none"
                raise ConfigError(f"{where}: unknown option {shown!r} (known: {known})")
            try:
                kwargs[key] = structure_option(raw, fields[key].type, fallback=converter.structure)
            except Exception as exc:
                expected = getattr(exc, "expected", None) or _type_name(fields[key].type)
                raise ConfigError(f"{where}.{key}: expected {expected}") from None
        try:
            return self.policy_type(**kwargs)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc}") from None


AnyCapability: TypeAlias = "Capability[Any, Any]"
"""A capability of any policy and module type, as plugin sets hold them side by side.

Code that works on one capability stays generic (``def f(cap: Capability[P, M])``).
"""


def _type_name(tp: object) -> str:
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
