"""Registers the ``corral`` sandbox with Inspect (the ``inspect_ai`` entry point loads this)."""

from __future__ import annotations

from inspect_ai.util import sandboxenv

from ._sandbox import CorralSandboxEnvironment

sandboxenv(name="corral")(CorralSandboxEnvironment)
