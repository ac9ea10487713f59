"""Attacks through the ``code`` module: the interpreter lives in the same sandbox as the shell.

Real bubblewrap. Each test is an attack the shell tests already make,
made again from inside a Python context: a context must not be a way
around the mounts, the network policy, the process and memory limits, or
another context's process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.provider

pytestmark = [pytest.mark.bwrap, pytest.mark.anyio]

MIB = 1024 * 1024


def _code(ws: corral.provider.Workspace) -> corral.provider.CodeContexts:
    code = ws.code
    assert isinstance(code, corral.provider.CodeContexts)
    return code


async def _value(code: corral.provider.CodeContexts, ctx: str, cell: str) -> Any:
    result = await code.run_in_context(ctx, cell, timeout_s=30)
    assert result.error is None, result.error
    return json.loads(result.result_json or "null")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or gone between open and read
        return False


async def test_context_sees_the_workspace_and_nothing_of_the_host(
    open_ws: Any, tmp_path: Path
) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host secret")
    async with open_ws() as ws:
        code = _code(ws)
        assert "python" in ws.details()["code_languages"]
        ctx = await code.create_context("python")
        assert await _value(code, ctx, "import os\nos.getcwd()") == "/workspace"
        await _value(code, ctx, "open('made-by-code.txt', 'w').write('hi')")
        assert (Path(ws.details()["root"]) / "made-by-code.txt").read_text() == "hi"
        for path in (str(secret), os.path.expanduser("~/.bashrc"), "/etc/shadow"):
            result = await code.run_in_context(ctx, f"open({path!r}).read()", timeout_s=30)
            assert result.error is not None, path
            assert result.error.name in {"FileNotFoundError", "PermissionError"}
        outside = await code.run_in_context(ctx, "open('/usr/evil', 'w')", timeout_s=30)
        assert outside.error is not None
        assert outside.error.name in {"OSError", "PermissionError"}


async def test_context_has_no_network(open_ws: Any) -> None:
    async with open_ws() as ws:
        code = _code(ws)
        result = await code.run_code(
            "python",
            "import socket\ns = socket.socket()\ns.settimeout(3)\ns.connect(('1.1.1.1', 80))",
            timeout_s=30,
        )
        assert result.error is not None
        assert result.error.name == "OSError"
        interfaces = await code.run_code(
            "python", "import socket\n[n for _, n in socket.if_nameindex()]", timeout_s=30
        )
        assert json.loads(interfaces.result_json or "[]") in ([], ["lo"])


async def test_fork_bomb_is_bounded_and_the_context_survives(open_ws: Any) -> None:
    async with open_ws(limits={"processes": 64}) as ws:
        code = _code(ws)
        ctx = await code.create_context("python")
        await _value(code, ctx, "marker = 'still here'")
        bomb = (
            "import os, time\n"
            "children = 0\n"
            "try:\n"
            "    for _ in range(10_000):\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(30)\n"
            "            os._exit(0)\n"
            "        children += 1\n"
            "except OSError as exc:\n"
            "    refused = exc.errno\n"
            "children"
        )
        forked = await _value(code, ctx, bomb)
        assert forked < 64
        assert await _value(code, ctx, "marker") == "still here"


async def test_memory_bomb_loses_the_context_and_says_so(open_ws: Any) -> None:
    async with open_ws(limits={"memory_bytes": 256 * MIB}) as ws:
        code = _code(ws)
        ctx = await code.create_context("python")
        bomb = "blocks = []\nwhile True:\n    blocks.append(b'\\x01' * (32 << 20))"
        result = await code.run_in_context(ctx, bomb, timeout_s=60)
        if result.error is not None and result.error.name == "MemoryError":
            assert result.state == "kept"  # the allocator refused first: the context lives
            return
        assert result.state == "lost"
        with pytest.raises(corral.OperationError) as caught:
            await code.run_in_context(ctx, "1", timeout_s=30)
        assert caught.value.code == "lost"
        assert "SIGKILL" in caught.value.message
        # The workspace and its other contexts are unharmed.
        other = await code.create_context("python")
        assert await _value(code, other, "1 + 1") == 2


async def test_contexts_cannot_see_each_other(open_ws: Any) -> None:
    async with open_ws() as ws:
        code = _code(ws)
        a = await code.create_context("python")
        b = await code.create_context("python")
        await _value(code, a, "import subprocess\np = subprocess.Popen(['sleep', '1234.5'])\n0")
        scan = (
            "import os\n"
            "found = []\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try:\n"
            "        found.append(open(f'/proc/{pid}/cmdline', 'rb').read().decode())\n"
            "    except OSError:\n"
            "        pass\n"
            "[c for c in found if '1234.5' in c]"
        )
        assert await _value(code, b, scan) == []
        # process_vm_readv (syscall 310 on x86-64) is refused by seccomp.
        peek = (
            "import ctypes, errno, platform\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "nr = 310 if platform.machine() == 'x86_64' else 270\n"
            "[libc.syscall(nr, 1, 0, 0, 0, 0, 0), ctypes.get_errno() == errno.EPERM]"
        )
        assert await _value(code, b, peek) == [-1, True]


async def test_close_kills_every_context_process(open_ws: Any) -> None:
    async with open_ws() as ws:
        code = _code(ws)
        for _ in range(2):
            ctx = await code.create_context("python")
            await _value(
                code,
                ctx,
                "import subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\n0",
            )
        procs = [
            int(pid)
            for path in ws.details()["cgroups"]
            for pid in Path(path, "cgroup.procs").read_text().split()
        ]
        if not procs:
            pytest.skip("no workspace cgroup to find the sandboxed processes by")
        assert all(_alive(pid) for pid in procs)
    assert not any(_alive(pid) for pid in procs)


async def test_disk_quota_holds_for_code_too(open_ws: Any) -> None:
    async with open_ws(limits={"disk_bytes": 64 * MIB}) as ws:
        code = _code(ws)
        ctx = await code.create_context("python")
        fill = "for i in range(3):\n    open(f'f{i}', 'wb').write(b'x' * (30 << 20))"
        result = await code.run_in_context(ctx, fill, timeout_s=60)
        assert "disk quota" in result.stderr
        with pytest.raises(corral.OperationError) as caught:
            await code.run_in_context(ctx, "1", timeout_s=30)
        assert caught.value.code == "policy_denied"
        with pytest.raises(corral.OperationError) as refused:
            await code.create_context("python")
        assert refused.value.code == "policy_denied"


async def test_bash_context_is_sandboxed_too(open_ws: Any, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host secret")
    async with open_ws() as ws:
        code = _code(ws)
        ctx = await code.create_context("bash")
        where = await code.run_in_context(ctx, "pwd", timeout_s=30)
        assert where.stdout == "/workspace\n"
        peek = await code.run_in_context(ctx, f"cat {secret}", timeout_s=30)
        assert peek.exit_code != 0
        assert "host secret" not in peek.stdout
        net = await code.run_in_context(ctx, "exec 3<>/dev/tcp/1.1.1.1/80", timeout_s=30)
        assert net.exit_code != 0
        assert net.state == "kept"


async def test_javascript_context_is_sandboxed_too(open_ws: Any, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host secret")
    async with open_ws() as ws:
        code = _code(ws)
        if "javascript" not in code.languages:
            pytest.skip("node is not installed")
        ctx = await code.create_context("javascript")
        assert await _value(code, ctx, "process.cwd()") == "/workspace"
        peek = await code.run_in_context(
            ctx, f"require('fs').readFileSync({str(secret)!r}, 'utf8')", timeout_s=30
        )
        assert peek.error is not None
        assert "host secret" not in (peek.result_json or "")
        net = await code.run_in_context(
            ctx,
            "new Promise((ok, no) => require('net').connect(80, '1.1.1.1', ok).on('error', no))",
            timeout_s=30,
        )
        assert net.error is not None
        assert net.state == "kept"
