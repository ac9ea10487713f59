"""The provider a suite run targets, handed from the runner to the suite's fixtures."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import pytest

import corral
import corral.provider
from corral import WorkspaceRef
from corral.provider import Workspace, WorkspaceProvider

from ._harness import _same_ref

__all__ = ["HOST_DIR_KEYS", "TARGET_KEY", "Target", "host_dir_from_details"]

HOST_DIR_KEYS: Final = ("host_dir", "root", "path", "directory")
"""``details()`` keys the plugin reads a workspace's host directory from."""


def host_dir_from_details(ws: Workspace) -> Path | None:
    """The host directory a workspace reports in ``details()``, if it is one."""
    details = corral.provider.describe_workspace(ws)
    for key in HOST_DIR_KEYS:
        value = details.get(key)
        if isinstance(value, str | Path) and Path(value).is_absolute() and Path(value).is_dir():
            return Path(value)
    return None


@attrs.frozen
class Target:
    """What the shipped suite runs against.

    Attributes:
        factory: Builds a fresh provider for each test.
        options: ``ProviderConfig.options`` for every open.
        host_dir: Maps a workspace to its host directory (or None).
        downgrade_ref: Makes a valid N-1 ref from a current one.
        spec_capabilities: What the plugin's ProviderSpec advertises, if known.
        backends: anyio backends every async rule runs on.
        kind: The plugin kind the provider was loaded by, if it was.
        factory_options: The factory's keyword options (with ``kind``).
        data_paths: Maps a workspace to the host paths holding its data
            (None: its host directory).
    """

    factory: Callable[[], WorkspaceProvider]
    options: Mapping[str, Any] = attrs.field(factory=dict)
    host_dir: Callable[[Workspace], Path | None] = host_dir_from_details
    downgrade_ref: Callable[[WorkspaceRef], WorkspaceRef] = _same_ref
    spec_capabilities: frozenset[str] | None = None
    backends: tuple[str, ...] = ("asyncio",)
    kind: str | None = None
    factory_options: Mapping[str, Any] = attrs.field(factory=dict)
    data_paths: Callable[[Workspace], Sequence[Path]] | None = None


TARGET_KEY: Final = pytest.StashKey[Target]()
