"""corral for capability authors: how a new kind of tool set is declared.

Read this if you are adding what an agent may do (``git``, ``http``,
a database) on top of the workspace modules. A capability is a
:class:`Capability` registered through the ``corral_register_capabilities``
hook: a name (the key in ``WorkspaceConfig.capabilities``), the policy
class the config value becomes, the module it needs on the workspace, and
the tools it gives the model. Each tool is a :class:`ToolSpec`: a name, a
description, an attrs class of its arguments (its JSON Schema is generated
from it by :func:`args_schema`, annotated with :class:`Arg`), an async
handler that receives a :class:`ToolEnv` -- the typed policy, the module
it declared, and for snapshot-like tools a narrow :class:`SessionControl`
-- and optionally its own renderer. Handlers raise :class:`OperationError`
for "the operation failed, the workspace is fine".

A capability that greps compiles its pattern with a :class:`RegexEngine`
(:func:`get_regex_engine`) and hands the resulting :class:`Matcher` to
the module. corral's own fs, shell, code, script and snapshot capabilities
are registered through the same hook, with the same types.
"""

from __future__ import annotations

from ._capabilities import Capability
from ._data import GrepOptions
from ._echo import echo_if_short
from ._errors import ConfigError, ErrorCode, OperationError
from ._lazy import lazy_exports
from ._plugins import CliCommand
from ._regex import Matcher, RegexEngine, get_regex_engine
from ._schema import Arg, ArgsSchema, WorkspacePath, args_schema
from ._tool import (
    SessionControl,
    ToolContent,
    ToolEnv,
    ToolHandler,
    ToolHints,
    ToolImage,
    ToolRenderer,
    ToolResult,
    ToolSpec,
)
from .hookspecs import hookimpl

__all__ = [
    "Arg",
    "ArgsSchema",
    "Capability",
    "CliCommand",
    "ConfigError",
    "ErrorCode",
    "GrepOptions",
    "Matcher",
    "OperationError",
    "RegexEngine",
    "SessionControl",
    "ToolContent",
    "ToolEnv",
    "ToolHandler",
    "ToolHints",
    "ToolImage",
    "ToolRenderer",
    "ToolResult",
    "ToolSpec",
    "WorkspacePath",
    "args_schema",
    "echo_if_short",
    "get_regex_engine",
    "hookimpl",
    "lazy_exports",
]
