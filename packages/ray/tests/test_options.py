"""Options are checked at construction, naming the option and never echoing the value."""

from __future__ import annotations

from typing import Any

import pytest

from corral.provider import ConfigError
from corral_ray import Placement, RayProvider, agent_name, parse_placement


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"inner": "in-memory"}, "inner"),
        ({"inner": "ray"}, "inner"),
        ({"inner_options": ["x"]}, "inner_options"),
        ({"inner_options": {"tmpdir_root": object()}}, "inner_options"),
        ({"placement": "random"}, "placement"),
        ({"placement": {"resource": 3}}, "placement"),
        ({"placement": {"labels": {"zone": 1}}}, "placement"),
        ({"placement": {"strategy": "spread", "extra": 1}}, "placement"),
        ({"max_workspaces_per_node": 0}, "max_workspaces_per_node"),
        ({"max_workspaces_per_node": True}, "max_workspaces_per_node"),
        ({"open_timeout_s": float("nan")}, "open_timeout_s"),
        ({"lease_s": -1}, "lease_s"),
        ({"min_free_memory_bytes": -5}, "min_free_memory_bytes"),
        ({"address": ""}, "address"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        RayProvider(**options)
    assert named in str(info.value)


def test_inner_options_are_checked_by_the_inner_provider() -> None:
    with pytest.raises(ConfigError) as info:
        RayProvider(inner="local-bash", inner_options={"no_such_option": 1})
    assert "inner_options" in str(info.value)
    assert "no_such_option" in str(info.value)  # the inner provider names the key it refuses


def test_placement_forms() -> None:
    assert parse_placement("pack") == Placement(strategy="pack")
    p = parse_placement({"resource": "gpu-box", "labels": {"zone": "a"}})
    assert p.admits({"Resources": {"gpu-box": 1.0}, "Labels": {"zone": "a"}})
    assert not p.admits({"Resources": {"gpu-box": 1.0}, "Labels": {"zone": "b"}})
    assert not p.admits({"Resources": {"CPU": 1.0}, "Labels": {"zone": "a"}})


def test_equal_configurations_share_agents_and_others_do_not() -> None:
    a = RayProvider(inner_options={"tmpdir_root": "/tmp/x"}).options.agent_tag()
    b = RayProvider(inner_options={"tmpdir_root": "/tmp/x"}, lease_s=5).options.agent_tag()
    c = RayProvider(inner_options={"tmpdir_root": "/tmp/y"}).options.agent_tag()
    assert a == b != c
    assert agent_name(a, "f" * 56).startswith("corral-agent-")


def test_importing_the_plugin_does_not_import_ray() -> None:
    import subprocess
    import sys

    code = "import sys, corral_ray._plugin; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
