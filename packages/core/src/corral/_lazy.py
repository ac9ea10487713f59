"""Lazy attributes for a plugin package whose public names pull heavy imports.

A corral plugin package is imported by every ``corral`` CLI start (the
entry points load it); a package whose public API needs pytest,
hypothesis or an SDK would make every start pay for them. It names those
attributes here and resolves each on first use (PEP 562), once.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, lazy: Mapping[str, str], public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` that import ``lazy`` names on first use.

    Args:
        package: The package's ``__name__``.
        lazy: Attribute name -> relative module (``"._suites"``) that defines it.
        public: The package's ``__all__``.

    Returns:
        ``(__getattr__, __dir__)`` to assign at module level; a resolved
        attribute is cached in the package's namespace.
    """

    def getattr_(name: str) -> Any:
        module = lazy.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        vars(sys.modules[package])[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(public)

    return getattr_, dir_
