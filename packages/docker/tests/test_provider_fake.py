"""Provider lifecycle, fail-closed paths and the shell, against the recording fake."""

from __future__ import annotations

import os
import pathlib

import pytest

import corral
import corral.provider
from corral_docker import (
    LABEL_WORKSPACE,
    DockerProvider,
    EngineError,
    EngineUnavailableError,
    ExecOutput,
    FakeDockerEngine,
)

pytestmark = pytest.mark.anyio

CONFIG = corral.ProviderConfig("docker", {"image": "corral-test:latest"})


def _provider(fake: FakeDockerEngine, root: str, **kw: object) -> DockerProvider:
    return DockerProvider(engine=fake, tmpdir_root=root, **kw)  # type: ignore[arg-type]


async def test_open_creates_one_hardened_labelled_container(
    fake: FakeDockerEngine, tmp_root: str
) -> None:
    provider = _provider(fake, tmp_root)
    opened = await provider.open(CONFIG, corral.SessionRef("sess/1"))
    ws = opened.workspace
    assert [m for m, _ in fake.calls[:2]] == ["ping", "ensure_image"]
    (spec,) = fake.specs.values()
    assert spec.image == "corral-test:latest"
    assert spec.network_mode == "none"
    assert spec.read_only_rootfs
    assert spec.init
    assert spec.labels[LABEL_WORKSPACE] == opened.ref.payload["workspace"]
    assert spec.labels["io.corral.session"] == "sess_1"
    assert spec.labels["io.corral.owner.pid"] == str(os.getpid())
    (mount,) = spec.mounts
    assert mount.kind == "bind"
    assert mount.target == "/workspace"
    assert pathlib.Path(mount.source).is_dir()
    assert all(fake.running.values())
    # The ref rebuilds the container; it never names one.
    assert opened.ref.schema_version == 2
    assert opened.ref.capabilities == {"fs", "shell", "snapshot"}
    text = corral.ref_to_json(opened.ref)
    (cid,) = fake.specs
    assert cid not in text
    assert corral.provider.describe_workspace(ws)["hardening"]["weakened"] == []
    await ws.close()
    assert fake.specs == {}
    assert not pathlib.Path(mount.source).exists()
    await ws.close()  # idempotent


async def test_fs_writes_land_in_the_bind_mounted_directory(
    fake: FakeDockerEngine, tmp_root: str
) -> None:
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    ws = opened.workspace
    assert ws.fs is not None
    await ws.fs.write_file("/d/x.txt", b"hi")
    (spec,) = fake.specs.values()
    host = pathlib.Path(spec.mounts[0].source) / "d" / "x.txt"
    assert host.read_bytes() == b"hi"
    if os.geteuid() == 0:
        uid, gid = (int(v) for v in spec.user.split(":"))
        assert (host.stat().st_uid, host.stat().st_gid) == (uid, gid)
        assert host.parent.stat().st_uid == uid
    await ws.close()


# Resolve joining or replacing containers: test_container_sharing.py.


async def test_no_daemon_fails_closed_with_advice(fake: FakeDockerEngine, tmp_root: str) -> None:
    fake.down = True
    with pytest.raises(corral.WorkspaceFailedError, match="start dockerd") as info:
        await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    assert info.value.transient is False
    assert fake.specs == {}
    assert os.listdir(tmp_root) == []


async def test_missing_image_fails_closed(fake: FakeDockerEngine, tmp_root: str) -> None:
    config = corral.ProviderConfig("docker", {"image": "nope:1"})
    with pytest.raises(corral.WorkspaceFailedError, match="could not be pulled"):
        await _provider(fake, tmp_root).open(config, corral.SessionRef("s"))
    fake.pullable.add("nope:1")
    opened = await _provider(fake, tmp_root).open(config, corral.SessionRef("s"))
    assert ("nope:1", True) in fake.called("ensure_image")
    await opened.workspace.close()


async def test_transient_daemon_error_is_marked_transient(
    fake: FakeDockerEngine, tmp_root: str
) -> None:
    fake.fail_next["start"] = EngineError("start container: Docker API error 500", transient=True)
    with pytest.raises(corral.WorkspaceFailedError) as info:
        await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    assert info.value.transient is True
    assert fake.specs == {}  # the half-made container was removed
    base = pathlib.Path(tmp_root) / f"corral-docker-{os.geteuid()}"
    assert [p.name for p in base.iterdir() if p.name.startswith("ws-")] == []


async def test_resolve_fails_closed_and_never_echoes_the_payload(
    fake: FakeDockerEngine, tmp_root: str
) -> None:
    provider = _provider(fake, tmp_root)
    opened = await provider.open(CONFIG, corral.SessionRef("s"))
    payload = dict(opened.ref.payload)
    bad = corral.WorkspaceRef("docker", {**payload, "workspace": "../../etc<secret>"}, {"fs"}, 2)
    with pytest.raises(corral.WorkspaceFailedError) as info:
        await provider.resolve(bad)
    assert "secret" not in str(info.value)
    extra = corral.WorkspaceRef("docker", {**payload, "container_id": "x"}, {"fs"}, 2)
    with pytest.raises(corral.WorkspaceFailedError, match="malformed"):
        await provider.resolve(extra)
    with pytest.raises(corral.WorkspaceFailedError, match="supports"):
        await provider.resolve(corral.WorkspaceRef("docker", payload, {"fs"}, 7))
    with pytest.raises(corral.WorkspaceFailedError, match="another provider"):
        await provider.resolve(corral.WorkspaceRef("local-bash", payload, {"fs"}, 2))
    fake.down = True
    with pytest.raises(corral.WorkspaceFailedError, match="start dockerd"):
        await provider.resolve(opened.ref)
    fake.down = False
    await opened.workspace.close()
    with pytest.raises(corral.WorkspaceFailedError, match="lost"):
        await provider.resolve(opened.ref)


async def test_shell_guards_on_host_then_execs(fake: FakeDockerEngine, tmp_root: str) -> None:
    fake.exec_handler = lambda call: ExecOutput(exit_code=3, stdout=b"out", stderr=b"err")
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    shell = opened.workspace.shell
    assert shell is not None
    result = await shell.run(corral.provider.CommandRequest("echo hi", cwd="/sub", env={"A": "1"}))
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out", "err")
    (call,) = fake.execs
    assert call.argv[-2:] == ("echo", "hi")
    assert "/workspace/sub" in call.argv
    assert call.env["A"] == "1"
    assert "CORRAL_EXEC" in call.env
    assert call.user == next(iter(fake.specs.values())).user
    with pytest.raises(corral.OperationError) as info:
        await shell.run(corral.provider.CommandRequest("echo hi; rm -rf /"))
    assert info.value.code == "policy_denied"
    with pytest.raises(corral.OperationError):
        await shell.run(corral.provider.CommandRequest("env", env={"LD_PRELOAD": "/x.so"}))
    assert len(fake.execs) == 1  # refused commands never reach the engine
    await opened.workspace.close()
    with pytest.raises(corral.OperationError) as closed:
        await shell.run(corral.provider.CommandRequest("true"))
    assert closed.value.code == "closed"


async def test_timeout_kills_by_marker(fake: FakeDockerEngine, tmp_root: str) -> None:
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    shell = opened.workspace.shell
    assert shell is not None
    fake.exec_delay_s = 2
    result = await shell.run(corral.provider.CommandRequest("sleep 100", timeout_s=0.2))
    assert result.timed_out
    assert result.exit_code is None
    run, kill = fake.execs
    assert kill.argv[-1] == run.env["CORRAL_EXEC"]
    assert "kill -9" in kill.argv[2]
    fake.exec_delay_s = 0
    await opened.workspace.close()


async def test_vanished_container_evicts(fake: FakeDockerEngine, tmp_root: str) -> None:
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    fake.specs.clear()
    shell = opened.workspace.shell
    assert shell is not None
    with pytest.raises(corral.WorkspaceEvictedError):
        await shell.run(corral.provider.CommandRequest("true"))
    await opened.workspace.close()


async def test_exec_engine_error_is_an_operation_error(
    fake: FakeDockerEngine, tmp_root: str
) -> None:
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    fake.fail_next["exec"] = EngineUnavailableError("exec: cannot reach the Docker daemon")
    shell = opened.workspace.shell
    assert shell is not None
    with pytest.raises(corral.OperationError) as info:
        await shell.run(corral.provider.CommandRequest("true"))
    assert info.value.code == "failed"
    await opened.workspace.close()


async def test_declared_capabilities(fake: FakeDockerEngine, tmp_root: str) -> None:
    provider = _provider(fake, tmp_root)
    opened = await provider.open(CONFIG, corral.SessionRef("s"), frozenset({"shell"}))
    assert opened.workspace.fs is None
    assert opened.ref.capabilities == {"shell"}
    await opened.workspace.close()
    with pytest.raises(corral.WorkspaceFailedError, match="code"):
        await provider.open(CONFIG, corral.SessionRef("s"), frozenset({"code"}))


async def test_bad_session_option_is_a_config_error(fake: FakeDockerEngine, tmp_root: str) -> None:
    bad = corral.ProviderConfig("docker", {"memory": "lots"})
    with pytest.raises(corral.ConfigError, match="memory"):
        await _provider(fake, tmp_root).open(bad, corral.SessionRef("s"))
    assert fake.calls == []


async def test_remote_mode_uses_a_volume(tmp_root: str) -> None:
    fake = FakeDockerEngine(remote=True)
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    (spec,) = fake.specs.values()
    (mount,) = spec.mounts
    assert mount.kind == "volume"
    assert mount.source in fake.volumes
    init = [a[0] for a in fake.called("create") if "io.corral.init" in a[0].labels]
    assert init
    assert init[0].cap_add == ("CHOWN", "FOWNER")
    assert init[0].network_mode == "none"
    assert opened.ref.payload["remote"] is True
    again = await _provider(fake, tmp_root).resolve(opened.ref)
    assert len(fake.specs) == 1
    await again.close()
    assert fake.volumes == {}
    with pytest.raises(corral.WorkspaceFailedError, match="lost"):
        await _provider(fake, tmp_root).resolve(opened.ref)
    local = FakeDockerEngine()
    with pytest.raises(corral.WorkspaceFailedError, match="different kind"):
        await _provider(local, tmp_root).resolve(opened.ref)


async def test_pool_members_are_adopted(fake: FakeDockerEngine, tmp_root: str) -> None:
    provider = _provider(fake, tmp_root, pool_size=2, image="corral-test:latest")
    assert await provider.warm(timeout_s=10)
    assert len(fake.specs) == 2
    creates = len(fake.called("create"))
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("s"))
    assert corral.provider.describe_workspace(opened.workspace)["pooled"] is True
    cid = corral.provider.describe_workspace(opened.workspace)["container_id"]
    assert cid in fake.specs
    custom = await provider.open(
        corral.ProviderConfig("docker", {"pids_limit": 10}), corral.SessionRef("t")
    )
    assert corral.provider.describe_workspace(custom.workspace)["pooled"] is False
    assert await provider.warm(timeout_s=10)
    assert len(fake.called("create")) >= creates + 2
    await opened.workspace.close()
    await custom.workspace.close()
    await provider.aclose()
    assert fake.specs == {}
    assert fake.closed
