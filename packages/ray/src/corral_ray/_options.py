"""The ray provider's options: inner provider, placement, capacity, timeouts."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from corral.provider import ConfigError

from ._agent import AgentSpec

__all__ = ["INNER_KINDS", "Placement", "RayOptions", "agent_name", "parse_placement"]

INNER_KINDS: Final = frozenset({"local-bash", "local-sandbox", "docker"})
"""Inner providers whose workspaces live in node-local storage an agent can host."""

_AGENT_PREFIX: Final = "corral-agent-"


@attrs.frozen(kw_only=True)
class Placement:
    """Where new workspaces go.

    Attributes:
        strategy: ``spread`` (the node with the fewest workspaces) or
            ``pack`` (the fullest node that still has room).
        resource: A custom resource a node must offer (``ray start --resources``).
        labels: Node labels a node must carry, all of them.
    """

    strategy: Literal["spread", "pack"] = "spread"
    resource: str | None = None
    labels: Mapping[str, str] = attrs.field(factory=dict)

    def admits(self, node: Mapping[str, Any]) -> bool:
        """Whether a node (an entry of ``ray.nodes()``) satisfies the requirements."""
        if self.resource is not None and (node.get("Resources") or {}).get(self.resource, 0) <= 0:
            return False
        labels = node.get("Labels") or {}
        return all(labels.get(k) == v for k, v in self.labels.items())


def parse_placement(value: object) -> Placement:
    """A placement from ``"spread"``, ``"pack"`` or ``{"strategy", "resource", "labels"}``.

    Raises:
        ConfigError: Any other shape (the message names the option, not the value).
    """
    if value in ("spread", "pack"):
        return Placement(strategy=value)
    bad = ConfigError(
        'ray provider option placement: expected "spread", "pack" or an object with '
        '"strategy" ("spread"/"pack"), "resource" (a name) and/or "labels" (names to values)'
    )
    if not isinstance(value, Mapping) or set(value) - {"strategy", "resource", "labels"}:
        raise bad
    strategy = value.get("strategy", "spread")
    resource = value.get("resource")
    labels = value.get("labels", {})
    if strategy not in ("spread", "pack"):
        raise bad
    if resource is not None and (not isinstance(resource, str) or not resource):
        raise bad
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise bad
    return Placement(strategy=strategy, resource=resource, labels=dict(labels))


def _positive_number(name: str, value: object, *, integer: bool = False) -> Any:
    ok_type = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type) or not math.isfinite(value):
        raise ConfigError(f"ray provider option {name}: expected a positive number")
    if value <= 0:
        raise ConfigError(f"ray provider option {name}: expected a positive number")
    return value


@attrs.frozen(kw_only=True)
class RayOptions:
    """The ray provider's validated options (see :class:`corral_ray.RayProvider`)."""

    inner: str
    inner_options: Mapping[str, Any]
    placement: Placement
    address: str
    max_workspaces_per_node: int
    min_free_memory_bytes: int
    open_timeout_s: float
    lease_s: float

    @classmethod
    def parse(
        cls,
        *,
        inner: object,
        inner_options: object,
        placement: object,
        address: object,
        max_workspaces_per_node: object,
        min_free_memory_bytes: object,
        open_timeout_s: object,
        lease_s: object,
    ) -> RayOptions:
        """Validate every option.

        Raises:
            ConfigError: A bad value; the message names the option.
        """
        if not isinstance(inner, str) or inner not in INNER_KINDS:
            raise ConfigError(
                "ray provider option inner: expected one of " + ", ".join(sorted(INNER_KINDS))
            )
        if inner_options is None:
            inner_options = {}
        if not isinstance(inner_options, Mapping):
            raise ConfigError("ray provider option inner_options: expected an object")
        try:
            # The options travel to every node and name the agent: JSON values only.
            json.dumps(inner_options, sort_keys=True)
        except (TypeError, ValueError):
            raise ConfigError(
                "ray provider option inner_options: expected JSON values only"
            ) from None
        if not isinstance(address, str) or not address:
            raise ConfigError("ray provider option address: expected a Ray address or 'auto'")
        if isinstance(min_free_memory_bytes, bool) or not isinstance(min_free_memory_bytes, int):
            raise ConfigError("ray provider option min_free_memory_bytes: expected an integer")
        if min_free_memory_bytes < 0:
            raise ConfigError("ray provider option min_free_memory_bytes: expected 0 or more")
        return cls(
            inner=inner,
            inner_options=dict(inner_options),
            placement=parse_placement(placement),
            address=address,
            max_workspaces_per_node=_positive_number(
                "max_workspaces_per_node", max_workspaces_per_node, integer=True
            ),
            min_free_memory_bytes=min_free_memory_bytes,
            open_timeout_s=float(_positive_number("open_timeout_s", open_timeout_s)),
            lease_s=float(_positive_number("lease_s", lease_s)),
        )

    def agent_spec(self) -> AgentSpec:
        """What every agent of this configuration is built with."""
        return AgentSpec(
            inner_kind=self.inner,
            inner_options=self.inner_options,
            max_workspaces=self.max_workspaces_per_node,
            min_free_memory_bytes=self.min_free_memory_bytes,
        )

    def agent_tag(self) -> str:
        """A short hash of the agent spec: providers configured alike share agents."""
        spec = self.agent_spec()
        text = json.dumps(
            [spec.inner_kind, spec.inner_options, spec.max_workspaces, spec.min_free_memory_bytes],
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def agent_name(tag: str, node_id: str) -> str:
    """The detached actor name of the agent of one configuration on one node."""
    return f"{_AGENT_PREFIX}{tag}-{node_id}"
