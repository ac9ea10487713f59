"""corral-local-bash: a host tmpdir and a subprocess shell (no isolation: trusted code only).

Register it by installing the package (entry point ``local-bash``) or pass a
:class:`LocalBashProvider` instance explicitly.
"""

from __future__ import annotations

from ._provider import LocalBashProvider

__all__ = ["LocalBashProvider"]
