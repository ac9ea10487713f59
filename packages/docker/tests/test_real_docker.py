"""The real engine: hardening seen by `docker inspect`, escape attempts, timeouts."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

import corral
import corral.provider
from corral_docker import DockerProvider

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


@pytest.fixture
async def ws(
    docker_ready: None, image: str, tmp_root: str
) -> AsyncIterator[corral.provider.Workspace]:
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("real"))
    try:
        yield opened.workspace
    finally:
        await opened.workspace.close()
        await provider.aclose()


async def sh(ws: corral.provider.Workspace, command: str, **kw: object) -> corral.ExecResult:
    assert ws.shell is not None
    return await ws.shell.run(
        corral.provider.CommandRequest(command, allow_shell_syntax=True, **kw)
    )  # type: ignore[arg-type]


def _inspect(container_id: str) -> dict[str, object]:
    out = subprocess.run(
        ["docker", "inspect", container_id], capture_output=True, text=True, check=True, timeout=30
    )
    doc = json.loads(out.stdout)[0]
    assert isinstance(doc, dict)
    return doc


async def test_hardening_as_the_engine_reports_it(ws: corral.provider.Workspace) -> None:
    details = corral.provider.describe_workspace(ws)
    doc = _inspect(details["container_id"])
    host = doc["HostConfig"]
    config = doc["Config"]
    assert isinstance(host, dict)
    assert isinstance(config, dict)
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert not host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert not any("unconfined" in opt for opt in host["SecurityOpt"])
    assert host["Init"] is True
    assert host["PidsLimit"] == 256
    assert host["Memory"] == host["MemorySwap"] == 512 * 1024**2
    assert host["NanoCpus"] == 1_000_000_000
    assert host["Privileged"] is False
    for ns in ("PidMode", "IpcMode", "UTSMode", "UsernsMode", "CgroupnsMode"):
        assert host.get(ns, "") != "host", ns
    assert host["NetworkMode"] != "host"
    assert "/tmp" in host["Tmpfs"]
    assert {u["Name"] for u in host["Ulimits"]} >= {"nofile", "fsize"}
    user = str(config["User"])
    assert user.split(":", maxsplit=1)[0] not in ("", "0", "root")
    mounts = doc["Mounts"]
    assert isinstance(mounts, list)
    assert [m["Destination"] for m in mounts] == ["/workspace"]
    home = os.path.expanduser("~")
    for m in mounts:
        assert "docker.sock" not in m["Source"]
        assert m["Source"] not in ("/", home, "/var/run", "/run")
    assert details["hardening"]["weakened"] == []


async def test_writes_outside_the_workspace_fail(ws: corral.provider.Workspace) -> None:
    for target in ("/etc/evil", "/evil", "/usr/bin/evil", "/home/evil"):
        result = await sh(ws, f"echo x > {target}")
        assert result.exit_code != 0, target
    ok = await sh(ws, "echo x > /tmp/scratch && cp /bin/busybox /tmp/bb && /tmp/bb true")
    assert ok.exit_code != 0  # /tmp is writable but noexec
    assert "denied" in ok.stderr.lower()
    seen = await sh(ws, "ls /")
    assert "work" not in seen.stdout.split()
    status = await sh(ws, "grep -E '^(NoNewPrivs|CapEff|Uid)' /proc/self/status")
    fields = dict(line.split(":", 1) for line in status.stdout.splitlines())
    assert fields["NoNewPrivs"].strip() == "1"
    assert int(fields["CapEff"].strip(), 16) == 0
    assert "0" not in fields["Uid"].split()


@pytest.fixture
def host_listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP listener on every host address; records who connected."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen()
    server.settimeout(0.2)
    hits: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except OSError:
                continue
            hits.append(addr[0])
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], hits
    stop.set()
    thread.join(5)
    server.close()


async def test_no_network_reaches_the_host(
    ws: corral.provider.Workspace, host_listener: tuple[int, list[str]]
) -> None:
    port, hits = host_listener
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # the listener works from the host
    gateway = "172.17.0.1"
    for addr in ("127.0.0.1", gateway, socket.gethostname()):
        result = await sh(ws, f"nc -w 2 {addr} {port} </dev/null", timeout_s=15)
        assert result.exit_code != 0, addr
    links = await sh(ws, "ls /sys/class/net")
    assert links.stdout.split() == ["lo"]
    assert hits == ["127.0.0.1"]


async def test_planted_setuid_root_binary_grants_nothing(ws: corral.provider.Workspace) -> None:
    root = corral.provider.describe_workspace(ws)["root"]
    busybox = shutil.which("busybox")
    if os.geteuid() != 0 or busybox is None:
        pytest.skip("planting a setuid-root file needs root and busybox on the host")
    planted = pathlib.Path(root) / "sh"  # busybox picks its applet from argv[0]
    shutil.copy(busybox, planted)
    os.chown(planted, 0, 0)
    os.chmod(planted, 0o4755)
    result = await sh(ws, "./sh -c 'id -u; grep -E \"^(Uid|CapEff)\" /proc/$$/status'")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] != "0"
    assert "\t0\t" not in lines[1] + "\t"
    assert int(lines[2].split(":")[1], 16) == 0


async def test_timeout_kills_the_whole_tree(ws: corral.provider.Workspace) -> None:
    result = await sh(
        ws,
        "sleep 301 & setsid sleep 302 & (sleep 303 &) ; sleep 304",
        timeout_s=1.5,
    )
    assert result.timed_out
    assert result.exit_code is None
    left = await sh(ws, "ps -o pid,args")
    assert not [line for line in left.stdout.splitlines() if "sleep 30" in line], left.stdout


async def test_output_cap_and_exit_codes(ws: corral.provider.Workspace) -> None:
    result = await sh(
        ws, "head -c 100000 /dev/zero | tr '\\0' a; echo done >&2; exit 7", max_output_bytes=1000
    )
    assert result.exit_code == 7
    assert result.stdout_truncated
    assert len(result.stdout) == 1000
    assert result.stderr == "done\n"


async def test_missing_cwd_is_not_found(ws: corral.provider.Workspace) -> None:
    assert ws.shell is not None
    with pytest.raises(corral.OperationError) as info:
        await ws.shell.run(corral.provider.CommandRequest("true", cwd="/nope"))
    assert info.value.code == "not_found"


async def test_missing_image_fails_closed(docker_ready: None, tmp_root: str) -> None:
    provider = DockerProvider(image="corral-absent:never", tmpdir_root=tmp_root)
    with pytest.raises(corral.WorkspaceFailedError, match="could not be pulled") as info:
        await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("x"))
    assert info.value.transient is False
    await provider.aclose()


async def test_no_daemon_fails_closed(tmp_root: str) -> None:
    provider = DockerProvider(base_url="unix:///nonexistent/docker.sock", tmpdir_root=tmp_root)
    with pytest.raises(corral.WorkspaceFailedError, match="start dockerd"):
        await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("x"))
    await provider.aclose()
