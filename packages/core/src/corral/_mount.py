"""One path namespace for the model: where commands see the workspace, and how tools say it.

A provider whose commands see the workspace root at some absolute path (its
*mount path*: ``/workspace`` inside a bubblewrap sandbox or a container, the
real host directory for local-bash) declares it in its workspace's
``details()`` under :data:`WORKSPACE_PATH`. The tool layer then keeps every
path the model sees meaning the same file everywhere:

* A path argument that is absolute and lies under the mount path
  (``/workspace/src/a.py``) names the workspace-relative file (``/src/a.py``)
  -- a path copied from a command's output works in a file tool.
* Every other path is workspace-relative, as always (``src/a.py`` and
  ``/src/a.py`` name the same file).
* Tool results show paths under the mount path (``/workspace/src/a.py``), so
  the model can paste them into a command, whose working directory is the
  mount path.

A workspace that declares nothing (or ``/``), such as in-memory's, which runs
no commands, keeps the plain ``/``-rooted view.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping
from typing import Any, Final

import attrs

from ._errors import OperationError
from ._paths import normalize_path
from ._schema import Arg

__all__ = ["WORKSPACE_PATH", "PathView", "path_fields", "paths_note", "workspace_path_of"]

WORKSPACE_PATH: Final = "workspace_path"
"""The ``details()`` key under which a workspace declares its commands' view of its root."""


def workspace_path_of(details: Mapping[str, Any]) -> str:
    """The mount path a workspace declares in its details, ``/`` when absent or unusable.

    Only a canonical absolute path is taken: anything else would let a
    provider bug turn into paths the model cannot use, so it falls back to
    the plain view.
    """
    value = details.get(WORKSPACE_PATH)
    if not isinstance(value, str) or not value.startswith("/"):
        return "/"
    try:
        canonical = normalize_path(value)
    except OperationError:
        return "/"
    return canonical if canonical == value else "/"


@attrs.frozen
class PathView:
    """How the model names the paths of one workspace.

    Attributes:
        root: The mount path: where the workspace's commands see its root
            (``/`` for a workspace without commands).
    """

    root: str = "/"

    def show(self, path: str) -> str:
        """The model's name of a canonical workspace path (``/a`` -> ``/workspace/a``)."""
        if self.root == "/":
            return path
        return self.root if path == "/" else self.root + path

    def accept(self, value: str) -> str | None:
        """The workspace path an absolute path under the mount path names, else None.

        ``/workspace/a/../b`` -> ``/b``; ``/workspace`` -> ``/``. A relative
        path, or an absolute one elsewhere, is not under the mount path: it
        stays workspace-relative (None).

        Raises:
            OperationError: ``invalid_path`` for a malformed path.
        """
        if self.root == "/" or not value.startswith("/"):
            return None
        # Canonical strings (both cached): a component-wise prefix test is a
        # string prefix test ending at a "/". Runs on every path argument.
        path = normalize_path(value)
        root = normalize_path(self.root)
        if root == "/":  # a root spelled oddly (``/a/..``): everything is under it
            return path
        if path == root:
            return "/"
        if path.startswith(root) and path[len(root)] == "/":
            return path[len(root) :]
        return None


@functools.cache
def path_fields(args_type: type) -> tuple[str, ...]:
    """Names of an arguments class's fields declared as workspace paths (``Arg(path=True)``)."""
    try:
        hints = typing.get_type_hints(args_type, include_extras=True)
    except Exception:  # an unresolvable annotation: its paths stay as they are
        return ()
    found: list[str] = []
    for field in attrs.fields(args_type):
        hint = hints.get(field.name)
        metadata = getattr(hint, "__metadata__", ())
        if any(isinstance(m, Arg) and m.path for m in metadata):
            found.append(field.alias or field.name)
    return tuple(found)


def paths_note(root: str | None) -> str:
    """The sentence that tells the model where the workspace is (None: not known yet)."""
    if root is None:
        return (
            " Paths are relative to the workspace root, which is the shell's working "
            "directory; paths in tool results can be used as-is in commands."
        )
    if root == "/":
        return ""
    return (
        f" The workspace is the directory {root}, also the shell's working directory; "
        "tool results show paths under it, usable as-is in commands (a relative path "
        "like src/a.py works in both)."
    )
