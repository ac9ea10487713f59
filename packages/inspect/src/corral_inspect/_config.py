"""The ``corral`` sandbox's configuration, as Inspect passes it to every hook."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class CorralSandboxConfig(BaseModel):
    """Which corral provider runs each sample, and how.

    ``sandbox=("corral", {"provider": "docker", "options": {"image": "python:3.12"}})``
    in a task or sample; a plain ``sandbox="corral"`` means local-sandbox with
    its defaults. Unknown keys are refused, so a misspelled option fails at
    task start instead of being ignored.

    Attributes:
        provider: The corral provider kind (``local-sandbox``, ``docker``,
            ``local-bash``, or a third party's with ``fs`` and ``shell``).
        options: Keyword options of that provider's factory (for docker:
            ``image``, ``base_url``, ``network``...; for local-sandbox:
            ``network``, ``memory_bytes``...). Checked by the provider itself.
        timeout_s: The timeout of an ``exec`` called without one. Inspect
            means "no limit" by ``None``; corral always bounds a command, so
            this is the bound.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str = "local-sandbox"
    options: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(default=3600.0, gt=0)

    def __hash__(self) -> int:
        """Hash the JSON form: Inspect keys its sandbox caches by config."""
        return hash(self.model_dump_json())
