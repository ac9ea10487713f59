"""gc decisions and SDK error translation, without a daemon."""

from __future__ import annotations

import os
import pathlib
import socket

import docker.errors
import pytest
import requests.exceptions

import corral
from corral_docker import (
    ContainerNotFoundError,
    ContainerSpec,
    EngineError,
    EngineUnavailableError,
    FakeDockerEngine,
    ImageNotFoundError,
    collect_garbage,
)
from corral_docker._labels import owner_labels, process_start
from corral_docker._sdk import _translate

pytestmark = pytest.mark.anyio


def _spec(name: str, labels: dict[str, str]) -> ContainerSpec:
    return ContainerSpec(
        image="corral-test:latest",
        name=name,
        command=("sleep", "1"),
        user="1:1",
        working_dir="/workspace",
        labels={"io.corral.managed": "1", **labels},
    )


async def test_gc_removes_closed_and_ownerless_containers(
    fake: FakeDockerEngine, tmp_path: pathlib.Path
) -> None:
    live_dir = tmp_path / "live"
    live_dir.mkdir()
    me = owner_labels()
    dead = {**me, "io.corral.owner.pid": "999999999"}
    recycled = {**me, "io.corral.owner.start": "1"}
    elsewhere = {**me, "io.corral.owner.host": socket.gethostname() + "-other"}
    cases = {
        "live": {**me, "io.corral.root": str(live_dir), "io.corral.workspace": "ws-a-00000000"},
        "closed": {
            **me,
            "io.corral.root": str(tmp_path / "gone"),
            "io.corral.workspace": "ws-b-00000000",
        },
        "dead": {**dead, "io.corral.root": str(live_dir)},
        "recycled": {**recycled, "io.corral.root": str(live_dir)},
        "other-host": {**elsewhere, "io.corral.root": "/not/here"},
    }
    ids = {}
    for name, labels in cases.items():
        ids[name] = await fake.create(_spec(name, labels))
    unmanaged = await fake.create(
        ContainerSpec(image="corral-test:latest", name="x", command=(), user="1", working_dir="/")
    )

    dry = await collect_garbage(fake, dry_run=True)
    assert dict(dry.removed) == {
        "closed": "workspace closed",
        "dead": "owner process died",
        "recycled": "owner process died",
    }
    assert len(fake.specs) == 6
    result = await collect_garbage(fake)
    assert sorted(result.kept) == ["live", "other-host"]
    assert set(fake.specs) == {ids["live"], ids["other-host"], unmanaged}


async def test_gc_removes_containers_of_deleted_volumes(fake: FakeDockerEngine) -> None:
    labels = {**owner_labels(), "io.corral.workspace": "ws-r-00000000"}
    await fake.create_volume("corral-ws-r-00000000", {})
    cid = await fake.create(_spec("remote", labels))
    assert (await collect_garbage(fake)).removed == ()
    await fake.remove_volume("corral-ws-r-00000000")
    assert (await collect_garbage(fake)).removed == (("remote", "workspace closed"),)
    assert cid not in fake.specs


def test_process_start_identifies_this_process() -> None:
    assert process_start(os.getpid()) == process_start(os.getpid()) != ""
    assert process_start(999_999_999) == ""


@pytest.mark.parametrize(
    ("exc", "kind", "transient"),
    [
        (docker.errors.ImageNotFound("x"), ImageNotFoundError, False),
        (docker.errors.NotFound("x"), ContainerNotFoundError, False),
        (requests.exceptions.ReadTimeout(), EngineError, True),
        (requests.exceptions.ConnectionError(), EngineUnavailableError, False),
        (FileNotFoundError(), EngineUnavailableError, False),
        (docker.errors.DockerException("x"), EngineUnavailableError, False),
        (ValueError("x"), EngineError, False),
    ],
)
def test_sdk_errors_are_translated(exc: Exception, kind: type, transient: bool) -> None:
    out = _translate(exc, "op")
    assert isinstance(out, kind)
    assert out.transient is transient


@pytest.mark.parametrize(
    ("status", "transient"), [(500, True), (503, True), (409, True), (400, False)]
)
def test_api_errors_by_status(status: int, transient: bool) -> None:
    response = requests.Response()
    response.status_code = status
    out = _translate(docker.errors.APIError("x", response=response), "op")
    assert out.transient is transient
    assert str(status) in out.message


def test_plugin_registers_provider_and_command() -> None:
    plugins = corral.load_plugins()
    spec = plugins.provider("docker")
    assert spec.capabilities == {"fs", "shell", "process", "code", "script", "snapshot"}
    assert spec.distribution == "corral-docker"
    assert "docker" in plugins.commands
