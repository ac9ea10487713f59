"""Core's own capabilities, registered through the same hook a third party uses."""

from __future__ import annotations

from collections.abc import Callable

from ._capabilities import AnyCapability, Capability
from ._exec_tools import code_tools, script_tools, shell_tools
from ._fs_tools import fs_tools
from ._policies import (
    CodePolicy,
    FsPolicy,
    ProcessPolicy,
    ScriptPolicy,
    ShellPolicy,
    SnapshotPolicy,
)
from ._process_tools import process_tools
from ._snapshot_tools import snapshot_tools
from .hookspecs import hookimpl

__all__ = ["BUILTIN_CAPABILITIES", "BuiltinCapabilities"]

FS = Capability("fs", FsPolicy, fs_tools, summary="read, write, edit, list, glob, grep files")
SHELL = Capability("shell", ShellPolicy, shell_tools, summary="run commands")
CODE = Capability("code", CodePolicy, code_tools, summary="run code snippets, optionally stateful")
SCRIPT = Capability("script", ScriptPolicy, script_tools, summary="ephemeral stateless scripts")
SNAPSHOT = Capability(
    "snapshot",
    SnapshotPolicy,
    snapshot_tools,
    summary="snapshot, restore, branch",
    # restore and branch move the session to the workspace the snapshot module returns
    controls_session=True,
)

PROCESS = Capability(
    "process",
    ProcessPolicy,
    process_tools,
    summary="background processes and terminals, output read by byte cursor",
)

BUILTIN_CAPABILITIES: tuple[AnyCapability, ...] = (FS, SHELL, CODE, SCRIPT, SNAPSHOT, PROCESS)


class BuiltinCapabilities:
    """The plugin object core registers first in every plugin set."""

    @hookimpl
    def corral_register_capabilities(self, register: Callable[[AnyCapability], None]) -> None:
        """Register fs, shell, code, script, snapshot and process."""
        for capability in BUILTIN_CAPABILITIES:
            register(capability)
