"""Agent-view paths: lexical normalisation and glob matching shared by providers."""

from __future__ import annotations

import functools
import re
from typing import Final

from ._errors import OperationError

__all__ = [
    "BINARY_SNIFF_BYTES",
    "MAX_COMPONENT_LENGTH",
    "MAX_PATH_LENGTH",
    "glob_match",
    "is_binary",
    "join_path",
    "normalize_path",
    "path_parts",
]

MAX_PATH_LENGTH: Final = 4096
MAX_COMPONENT_LENGTH: Final = 255
BINARY_SNIFF_BYTES: Final = 8192


@functools.lru_cache(maxsize=1024)  # worst case ~8 MB of 4 KiB paths
def _clean_parts(path: str) -> tuple[str, ...]:
    return _split(path)


def path_parts(path: str) -> tuple[str, ...]:
    """Split an agent path into clean components (``()`` for the root).

    ``.`` and repeated slashes vanish; ``..`` pops one component and may
    never climb above the root.

    Raises:
        OperationError: ``code="invalid_path"`` for a path that is not a
            string, holds NUL or an unencodable character, is too long, or
            climbs above the root.
    """
    if not isinstance(path, str):
        raise OperationError("path must be a string", code="invalid_path")
    if type(path) is not str:  # a str subclass could hash or compare oddly: no cache
        return _split(str.__str__(path))
    # Agents repeat paths constantly; results are immutable, failures are not cached.
    return _clean_parts(path)


def _split(path: str) -> tuple[str, ...]:
    if "\x00" in path:
        raise OperationError("path contains a NUL byte", code="invalid_path")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise OperationError("path is not valid Unicode", code="invalid_path") from None
    if len(encoded) > MAX_PATH_LENGTH:
        raise OperationError(f"path is longer than {MAX_PATH_LENGTH} bytes", code="invalid_path")
    parts: list[str] = []
    for comp in path.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if not parts:
                raise OperationError("path escapes the workspace root", code="invalid_path")
            parts.pop()
            continue
        if len(comp.encode("utf-8")) > MAX_COMPONENT_LENGTH:
            raise OperationError(
                f"a path component is longer than {MAX_COMPONENT_LENGTH} bytes", code="invalid_path"
            )
        parts.append(comp)
    return tuple(parts)


@functools.lru_cache(maxsize=1024)
def _normalized(path: str) -> str:
    return "/" + "/".join(_clean_parts(path))


def normalize_path(path: str) -> str:
    """Return the canonical agent-view form of a path: ``/a/b``, or ``/``."""
    if type(path) is str:
        # Every tool call normalises its paths in validation and again in the
        # provider: cached like the parts (failures are not cached).
        return _normalized(path)
    return "/" + "/".join(path_parts(path))


def join_path(parent: str, name: str) -> str:
    """Join a normalised directory path and an entry name."""
    return f"/{name}" if parent == "/" else f"{parent}/{name}"


@functools.lru_cache(maxsize=256)
def _compile_glob(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    comps = [c for c in pattern.split("/") if c not in ("", ".")]
    for idx, comp in enumerate(comps):
        last = idx == len(comps) - 1
        if comp == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        i = 0
        piece: list[str] = []
        while i < len(comp):
            ch = comp[i]
            if ch == "*":
                piece.append("[^/]*")
            elif ch == "?":
                piece.append("[^/]")
            elif ch == "[":
                end = comp.find("]", i + 2 if comp[i + 1 : i + 2] in ("!", "]") else i + 1)
                if end < 0:
                    piece.append(re.escape(ch))
                else:
                    body = comp[i + 1 : end]
                    if body.startswith("!"):
                        body = "^" + body[1:]
                    piece.append("[" + body.replace("\\", "\\\\").replace("/", "") + "]")
                    i = end
            else:
                piece.append(re.escape(ch))
            i += 1
        out.append("".join(piece) + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def glob_match(pattern: str, relpath: str) -> bool:
    """Whether a ``/``-separated relative path matches a glob.

    ``*``, ``?`` and ``[...]`` stay within one component; ``**`` as a whole
    component matches any number of components, including none.
    """
    return _compile_glob(pattern).match(relpath) is not None


def is_binary(head: bytes) -> bool:
    """The grep heuristic: a NUL byte in the first 8 KiB means binary."""
    return b"\x00" in head[:BINARY_SNIFF_BYTES]
