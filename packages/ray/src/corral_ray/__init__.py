"""corral-ray: workspaces of an inner provider placed across the nodes of a Ray cluster.

One detached, named agent actor per node (namespace ``corral``) hosts that
node's workspaces through the inner provider (local-bash, local-sandbox or
docker) and serves their module calls; refs are plain descriptors any
driver attached to the cluster resolves. See the package README.
"""

from __future__ import annotations

from ._agent import AgentSpec, NodeAgent
from ._options import INNER_KINDS, Placement, RayOptions, agent_name, parse_placement
from ._provider import NAMESPACE, SCHEMA_VERSION, RayProvider, RayRefPayload, shutdown_agents

__all__ = [
    "INNER_KINDS",
    "NAMESPACE",
    "SCHEMA_VERSION",
    "AgentSpec",
    "NodeAgent",
    "Placement",
    "RayOptions",
    "RayProvider",
    "RayRefPayload",
    "agent_name",
    "parse_placement",
    "shutdown_agents",
]
