"""deepagents' absolute paths, mapped onto corral's one path namespace.

deepagents hands its backend absolute paths and expects a command to see a
written file at the very same path. A corral workspace declares where its
commands see its root (``details()["workspace_path"]``: ``/workspace`` inside
a bubblewrap sandbox or a container, the host directory for local-bash, ``/``
for a workspace that runs no commands), so:

* an absolute path under that mount path names the workspace file below it
  (``/workspace/src/a.py`` -> ``/src/a.py``);
* any other absolute path is refused: it is a file the commands see outside
  the workspace (``/tmp/x`` in the sandbox), which the file methods cannot
  reach -- silently writing ``/workspace/tmp/x`` instead would break the one
  namespace;
* a relative path is refused too (``invalid_path``), as deepagents' protocol
  requires absolute ones.

Results show workspace paths under the mount path again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

import corral
import corral.provider

__all__ = ["PathRefusedError", "WorkspacePaths"]

WORKSPACE_PATH_KEY: Final = "workspace_path"
"""The ``details()`` key under which a corral workspace declares its commands' view of its root."""


class PathRefusedError(Exception):
    """A path the backend cannot map onto the workspace; the message names no input.

    Attributes:
        code: deepagents' ``FileOperationError`` for it (always ``invalid_path``).
    """

    code: Final = "invalid_path"


@attrs.frozen
class WorkspacePaths:
    """How deepagents' absolute paths name the files of one workspace.

    Attributes:
        root: The mount path: where the workspace's commands see its root.
    """

    root: str = "/"

    @classmethod
    def of(cls, details: Mapping[str, Any]) -> WorkspacePaths:
        """The paths of a workspace from its ``details()`` (``/`` when it declares none).

        Only a canonical absolute path is taken: anything else falls back to
        ``/``, as corral's own tool layer does.
        """
        value = details.get(WORKSPACE_PATH_KEY)
        if not isinstance(value, str) or not value.startswith("/"):
            return cls()
        try:
            canonical = corral.provider.normalize_path(value)
        except corral.OperationError:
            return cls()
        return cls(canonical if canonical == value else "/")

    def to_workspace(self, path: str) -> str:
        """The canonical workspace path (``/``-rooted) that an absolute path names.

        Raises:
            PathRefusedError: The path is relative, malformed, or outside the
                workspace.
        """
        if not isinstance(path, str) or not path.startswith("/"):
            raise PathRefusedError("the path must be absolute")
        try:
            parts = corral.provider.path_parts(path)
        except corral.OperationError:
            raise PathRefusedError("the path is malformed") from None
        prefix = corral.provider.path_parts(self.root)
        if parts[: len(prefix)] != prefix:
            raise PathRefusedError(f"the path is outside the workspace, which is {self.root}")
        return "/" + "/".join(parts[len(prefix) :])

    def show(self, path: str) -> str:
        """The absolute path commands see for a workspace path (``/a`` -> ``/workspace/a``)."""
        if self.root == "/":
            return path
        return self.root if path == "/" else self.root + path
