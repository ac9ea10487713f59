"""corral-isolate: the ``script`` capability as JavaScript in a WebAssembly isolate.

QuickJS-NG, compiled to WebAssembly, runs each script in a fresh wasmtime
instance inside this process: no file system, no network, a memory cap, a
wall-clock budget enforced by epoch interruption, captured console output
and the script's value as JSON.
"""

from __future__ import annotations

from ._engine import EnginePool
from ._provider import PROVIDER_ID, SCHEMA_VERSION, SUPPORTED_CAPABILITIES, IsolateProvider
from ._runner import LANGUAGES, ScriptLimits, ScriptRunner

__all__ = [
    "LANGUAGES",
    "PROVIDER_ID",
    "SCHEMA_VERSION",
    "SUPPORTED_CAPABILITIES",
    "EnginePool",
    "IsolateProvider",
    "ScriptLimits",
    "ScriptRunner",
]
