"""corral-docker: workspaces in hardened per-session Docker containers.

The provider talks to Docker only through the :class:`DockerEngine` protocol;
:class:`SdkEngine` wraps the Docker SDK (local socket, ``tcp://`` or
``ssh://`` engines) and :class:`FakeDockerEngine` drives tests without a
daemon. Hardening defaults live in :class:`DockerOptions`; see the README.
"""

from __future__ import annotations

from ._container import WorkspaceContainer
from ._engine import (
    ContainerInfo,
    ContainerNotFoundError,
    ContainerSpec,
    DockerEngine,
    EngineError,
    EngineUnavailableError,
    ExecOutput,
    ImageNotFoundError,
    MountSpec,
    PullProgress,
    Ulimit,
)
from ._fake import ExecCall, FakeDockerEngine
from ._gc import GcResult, collect_garbage
from ._labels import LABEL_MANAGED, LABEL_WORKSPACE
from ._options import (
    DEFAULT_IMAGE,
    DockerOptions,
    build_container_spec,
    hardening_details,
    parse_size,
    weakened,
)
from ._provider import DockerProvider, DockerRefPayload
from ._remote_fs import ContainerFileSystem
from ._sdk import SdkEngine
from ._shell import DockerShell

__all__ = [
    "DEFAULT_IMAGE",
    "LABEL_MANAGED",
    "LABEL_WORKSPACE",
    "ContainerFileSystem",
    "ContainerInfo",
    "ContainerNotFoundError",
    "ContainerSpec",
    "DockerEngine",
    "DockerOptions",
    "DockerProvider",
    "DockerRefPayload",
    "DockerShell",
    "EngineError",
    "EngineUnavailableError",
    "ExecCall",
    "ExecOutput",
    "FakeDockerEngine",
    "GcResult",
    "ImageNotFoundError",
    "MountSpec",
    "PullProgress",
    "SdkEngine",
    "Ulimit",
    "WorkspaceContainer",
    "build_container_spec",
    "collect_garbage",
    "hardening_details",
    "parse_size",
    "weakened",
]
