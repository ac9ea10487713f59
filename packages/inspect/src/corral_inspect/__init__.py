"""Inspect AI's ``corral`` sandbox: each sample runs in its own corral workspace.

``sandbox=("corral", {"provider": "docker", "options": {"image": "python:3.12"}})``
in a task; Inspect finds the sandbox through this package's ``inspect_ai``
entry point. Importing the package registers it too.
"""

from __future__ import annotations

from . import _plugin
from ._config import CorralSandboxConfig
from ._sandbox import CorralSandboxEnvironment

__all__ = ["CorralSandboxConfig", "CorralSandboxEnvironment"]

del _plugin
