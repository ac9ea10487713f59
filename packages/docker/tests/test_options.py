"""Options parsing and the hardened container spec (no daemon)."""

from __future__ import annotations

import os

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral
import corral_docker
from corral_docker import (
    DockerOptions,
    MountSpec,
    build_container_spec,
    hardening_details,
    parse_size,
    weakened,
)


def _spec(opts: DockerOptions) -> corral_docker.ContainerSpec:
    return build_container_spec(
        opts, name="n", labels={"a": "b"}, mount=MountSpec("bind", "/host/ws", "/workspace")
    )


def test_public_surface_is_exported() -> None:
    for name in corral_docker.__all__:
        assert getattr(corral_docker, name) is not None
    assert "DockerProvider" in corral_docker.__all__


def test_default_spec_is_hardened() -> None:
    spec = _spec(DockerOptions())
    assert spec.network_mode == "none"
    assert spec.read_only_rootfs is True
    assert spec.cap_drop == ("ALL",)
    assert spec.cap_add == ()
    assert spec.security_opt == ("no-new-privileges",)
    assert spec.init is True
    assert spec.pids_limit == 256
    assert spec.memory_bytes == spec.memory_swap_bytes == 512 * 1024**2
    assert spec.nano_cpus == 1_000_000_000
    assert {u.name for u in spec.ulimits} >= {"nofile", "fsize"}
    assert "noexec" in spec.tmpfs["/tmp"]
    assert "nosuid" in spec.tmpfs["/tmp"]
    uid = int(spec.user.split(":")[0])
    assert uid != 0
    assert spec.mounts == (MountSpec("bind", "/host/ws", "/workspace"),)
    assert not any("docker.sock" in m.source for m in spec.mounts)
    assert weakened(DockerOptions()) == []
    assert not hasattr(spec, "privileged")


def test_root_host_maps_to_unprivileged_user() -> None:
    user = DockerOptions().user
    if os.getuid() == 0:
        assert user == "65534:65534"
    else:
        assert user == f"{os.getuid()}:{os.getgid()}"


def test_weakening_is_explicit_and_reported() -> None:
    opts = DockerOptions.from_mapping(
        {"network": "bridge", "read_only_rootfs": False, "cap_add": ["NET_RAW"], "user": "0:0"}
    )
    assert sorted(weakened(opts)) == ["cap_add", "network", "read_only_rootfs", "user"]
    details = hardening_details(opts)
    assert details["weakened"] == weakened(opts)
    assert details["privileged"] is False
    spec = _spec(opts)
    assert spec.cap_add == ("NET_RAW",)
    assert spec.cap_drop == ("ALL",)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"memory": "lots"}, "memory"),
        ({"memory": 0}, "memory"),
        ({"cpus": 0}, "cpus"),
        ({"cpus": True}, "cpus"),
        ({"pids_limit": -1}, "pids_limit"),
        ({"user": "root"}, "user"),
        ({"network": "a b"}, "network"),
        ({"cap_add": "NET_RAW"}, "cap_add"),
        ({"cap_add": ["net raw"]}, "cap_add"),
        ({"read_only_rootfs": "no"}, "read_only_rootfs"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_options_name_the_key(values: dict[str, object], key: str) -> None:
    with pytest.raises(corral.ConfigError, match=key):
        DockerOptions.from_mapping(values)


def test_sizes() -> None:
    assert parse_size("512m", key="k") == 512 * 1024**2
    assert parse_size("1G", key="k") == 1024**3
    assert parse_size("64KiB", key="k") == 64 * 1024
    assert parse_size(4096, key="k") == 4096
    with pytest.raises(corral.ConfigError):
        parse_size(True, key="k")


def test_session_options_layer_over_defaults() -> None:
    base = DockerOptions.from_mapping({"image": "corral-test:latest", "pids_limit": 64})
    opts = DockerOptions.from_mapping({"memory": "128m"}, base=base)
    assert opts.image == "corral-test:latest"
    assert opts.pids_limit == 64
    assert opts.memory == 128 * 1024**2


@settings(max_examples=60, deadline=None)
@given(
    memory=st.integers(1, 2**40),
    cpus=st.floats(0.01, 64),
    pids=st.integers(1, 10**6),
    network=st.sampled_from(["none", "bridge", "mynet"]),
    ro=st.booleans(),
    nnp=st.booleans(),
)
def test_spec_never_privileged_and_reports_every_weakening(
    memory: int, cpus: float, pids: int, network: str, ro: bool, nnp: bool
) -> None:
    opts = DockerOptions(
        memory=memory,
        cpus=cpus,
        pids_limit=pids,
        network=network,
        read_only_rootfs=ro,
        no_new_privileges=nnp,
    )
    spec = _spec(opts)
    assert spec.cap_drop == ("ALL",)
    assert spec.memory_swap_bytes == spec.memory_bytes == memory
    assert spec.pids_limit == pids
    weak = set(weakened(opts))
    assert ("network" in weak) == (network != "none")
    assert ("read_only_rootfs" in weak) == (not ro)
    assert ("no_new_privileges" in weak) == (not nnp)
    assert ("no-new-privileges" in spec.security_opt) == nnp
    assert attrs.asdict(spec)["mounts"][0]["target"] == "/workspace"
