"""Resolve joins the container a live handle uses and replaces only orphans (fake engine).

Derived from the contract that a ref resolved while another handle of the
same workspace is open gives a second working handle: on a remote engine
the file system itself goes through the container, so replacing it would
break the first handle outright.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import attrs
import pytest

import corral
import corral.provider
from corral_docker import (
    ContainerSpec,
    DockerProvider,
    FakeDockerEngine,
    MountSpec,
    collect_garbage,
)
from corral_docker._container import WorkspaceContainer
from corral_docker._labels import (
    LABEL_OWNER_HOST,
    LABEL_OWNER_NS,
    LABEL_OWNER_PID,
    LABEL_SPEC,
    owned_here,
    owner_alive,
    owner_labels,
    pid_namespace,
)
from corral_docker._options import DockerOptions

pytestmark = pytest.mark.anyio

CONFIG = corral.ProviderConfig("docker", {"image": "corral-test:latest"})


def _provider(fake: FakeDockerEngine, root: str) -> DockerProvider:
    return DockerProvider(engine=fake, tmpdir_root=root)


def _relabel(fake: FakeDockerEngine, cid: str, **labels: str) -> None:
    spec = fake.specs[cid]
    fake.specs[cid] = attrs.evolve(spec, labels={**spec.labels, **labels})


def _cid(ws: corral.provider.Workspace) -> str:
    return str(corral.provider.describe_workspace(ws)["container_id"])


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
async def test_resolve_while_open_joins_the_same_container(tmp_root: str, remote: bool) -> None:
    fake = FakeDockerEngine(images=["corral-test:latest"], remote=remote)
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    (first,) = fake.specs
    again = await _provider(fake, tmp_root).resolve(opened.ref)
    assert list(fake.specs) == [first]
    assert _cid(again) == _cid(opened.workspace) == first
    assert (first,) not in fake.called("remove")
    assert opened.workspace.fs is not None
    assert again.fs is not None
    await again.fs.write_file("/x", b"from the second handle")
    if not remote:  # the fake cannot run the container-side file system
        assert await opened.workspace.fs.read_file("/x") == b"from the second handle"
    await opened.workspace.close()
    assert fake.specs == {}
    await again.close()


@pytest.mark.parametrize("orphan", ["owner died", "stopped", "recycled pid"])
async def test_resolve_replaces_orphaned_containers(
    fake: FakeDockerEngine, tmp_root: str, orphan: str
) -> None:
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    (old,) = fake.specs
    if orphan == "owner died":
        _relabel(fake, old, **{LABEL_OWNER_PID: "999999999"})
    elif orphan == "stopped":
        fake.running[old] = False
    else:
        _relabel(fake, old, **{"io.corral.owner.start": "1"})
    again = await _provider(fake, tmp_root).resolve(opened.ref)
    (new,) = fake.specs
    assert new != old
    assert _cid(again) == new
    assert (old,) in fake.called("remove")
    await again.close()
    assert fake.specs == {}


@pytest.mark.parametrize("where", ["other host", "other pid namespace"])
async def test_a_container_whose_owner_cannot_be_checked_here_is_joined_not_removed(
    fake: FakeDockerEngine, tmp_root: str, where: str
) -> None:
    """A pid is a host-local fact: an owner elsewhere may be alive and using its container."""
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    (theirs,) = fake.specs
    if where == "other host":
        foreign = {LABEL_OWNER_HOST: socket.gethostname() + "-elsewhere"}
    else:
        foreign = {LABEL_OWNER_NS: "another-boot/pid:[1]"}
    _relabel(fake, theirs, **foreign, **{LABEL_OWNER_PID: "999999999"})
    assert owner_alive(fake.specs[theirs].labels) is None
    again = await _provider(fake, tmp_root).resolve(opened.ref)
    assert list(fake.specs) == [theirs]
    assert _cid(again) == theirs
    await again.close()  # closing destroys the workspace, and its containers with it
    assert fake.specs == {}
    await opened.workspace.close()


def _box(fake: FakeDockerEngine, labels: dict[str, str]) -> WorkspaceContainer:
    return WorkspaceContainer(
        fake,
        DockerOptions.from_mapping({}),
        workspace="ws-s-00000000",
        labels=labels,
        mount=MountSpec("volume", "corral-ws-s-00000000", "/workspace"),
    )


async def test_the_container_goes_with_the_last_handle_of_its_owner(
    fake: FakeDockerEngine,
) -> None:
    first, second = _box(fake, owner_labels()), _box(fake, owner_labels())
    cid = await first.replace()
    assert await second.join_or_start() == cid
    await first.remove()
    assert cid in fake.specs  # the second handle still uses it
    await second.remove()
    assert fake.specs == {}


async def test_another_process_container_is_left_to_its_owner(fake: FakeDockerEngine) -> None:
    theirs = _box(fake, {**owner_labels(), LABEL_OWNER_NS: "another-boot/pid:[1]"})
    cid = await theirs.replace()
    mine = _box(fake, owner_labels())
    assert await mine.join_or_start() == cid
    await mine.remove()
    assert cid in fake.specs
    await theirs.remove()  # that owner holds it in this test's process table
    assert fake.specs == {}


async def test_a_container_with_other_options_is_never_joined(
    fake: FakeDockerEngine, tmp_root: str
) -> None:
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    (first,) = fake.specs
    _relabel(fake, first, **{LABEL_SPEC: "0" * 32})
    again = await _provider(fake, tmp_root).resolve(opened.ref)
    assert _cid(again) != first
    assert first in fake.specs  # a live owner's container is left alone
    await again.close()


def test_owner_labels_name_this_process_and_its_pid_namespace() -> None:
    me = owner_labels()
    assert owner_alive(me) is True
    assert owned_here(me)
    assert me[LABEL_OWNER_NS] == pid_namespace() != ""
    assert not owned_here({**me, LABEL_OWNER_PID: "1"})
    legacy = {k: v for k, v in me.items() if k != LABEL_OWNER_NS}
    assert owner_alive(legacy) is True


@pytest.mark.docker
async def test_on_a_real_engine_both_handles_keep_their_shell(
    docker_ready: None,
    image: str,
    tmp_root: str,
    docker_ps: Callable[[str], list[str]],
) -> None:
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("s"))
    label = f"io.corral.workspace={opened.ref.payload['workspace']}"
    try:
        again = await DockerProvider(image=image, tmpdir_root=tmp_root).resolve(opened.ref)
        assert len(docker_ps(label)) == 1
        for ws in (opened.workspace, again):
            assert ws.shell is not None
            result = await ws.shell.run(corral.provider.CommandRequest("echo alive"))
            assert result.stdout.strip() == "alive"
    finally:
        await opened.workspace.close()
        await provider.aclose()
    assert docker_ps(label) == []


async def test_gc_never_judges_a_pid_from_another_pid_namespace(fake: FakeDockerEngine) -> None:
    """Pid 999999999 is dead here, but the owner ran in another namespace: keep its container."""
    await fake.create_volume("corral-ws-r-00000000", {})
    labels = {
        **owner_labels(),
        LABEL_OWNER_NS: "another-boot/pid:[1]",
        LABEL_OWNER_PID: "999999999",
        "io.corral.managed": "1",
        "io.corral.workspace": "ws-r-00000000",
    }
    spec = ContainerSpec(
        image="corral-test:latest", name="theirs", command=(), user="1:1", working_dir="/"
    )
    cid = await fake.create(attrs.evolve(spec, labels=labels))
    result = await collect_garbage(fake)
    assert result.removed == ()
    assert cid in fake.specs
