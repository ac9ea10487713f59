"""A deepagents sandbox backend on any corral workspace.

``CorralBackend(session)`` implements deepagents' ``SandboxBackendProtocol``
(files, shell, upload and download) on an open corral session::

    import corral.sync
    from deepagents import create_deep_agent
    from corral_deepagents import CorralBackend

    with corral.sync.open_workspace("local-sandbox", {"fs": True, "shell": True}) as ws:
        agent = create_deep_agent(model=..., backend=CorralBackend(ws))
        agent.invoke({"messages": [{"role": "user", "content": "..."}]})
"""

from __future__ import annotations

from ._backend import DEFAULT_MAX_FILE_BYTES, CorralBackend
from ._files import MAX_GLOB_MATCHES, MAX_GREP_MATCHES

__all__ = ["DEFAULT_MAX_FILE_BYTES", "MAX_GLOB_MATCHES", "MAX_GREP_MATCHES", "CorralBackend"]
