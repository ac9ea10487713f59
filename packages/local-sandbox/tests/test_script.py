"""Attacks through ``script``: each call is a fresh bubblewrap box with nothing of the workspace.

The boundary under test: no workspace or host file visible, no network even
when the workspace has one, the workspace's memory and process limits on a
cgroup of the box's own, a timeout that ends the whole box, and nothing left
behind -- neither files for the next call nor processes or cgroups on the host.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.provider
from corral.provider import CodeInterpreter, Workspace
from corral_conformance import (
    loopback_listener,
    script_allocation_bomb_scenario,
    script_fork_bomb_scenario,
    script_leaves_nothing_scenario,
    script_output_cap_scenario,
)
from corral_local_sandbox import LocalSandboxProvider
from corral_local_sandbox._cgroup import CGROUP_PREFIX, base_tag, find_placements

pytestmark = [pytest.mark.bwrap, pytest.mark.anyio]

_SLACK_S = 15.0
_MIB = 1 << 20

OpenScript = Callable[..., AbstractAsyncContextManager[tuple[Workspace, LocalSandboxProvider]]]


@pytest.fixture
def open_script(tmp_path: Path) -> OpenScript:
    """``async with open_script(**provider_options) as (ws, provider)`` with script and fs."""

    @asynccontextmanager
    async def opener(**options: Any) -> AsyncIterator[tuple[Workspace, LocalSandboxProvider]]:
        options.setdefault("tmpdir_root", str(tmp_path / "ws"))
        os.makedirs(options["tmpdir_root"], exist_ok=True)
        provider = LocalSandboxProvider(**options)
        opened = await provider.open(
            corral.ProviderConfig("local-sandbox"),
            corral.SessionRef("script"),
            frozenset({"script", "fs", "shell"}),
        )
        try:
            yield opened.workspace, provider
        finally:
            await opened.workspace.close()

    return opener


def _script(ws: Workspace) -> CodeInterpreter:
    assert ws.script is not None
    return ws.script


def _langs(ws: Workspace) -> list[str]:
    return sorted(_script(ws).languages)


def _everything(result: corral.ExecResult) -> str:
    return f"{result.stdout}{result.stderr}{result.result_json}{result.error}"


def _box_cgroups(ws: Workspace, provider: LocalSandboxProvider) -> list[str]:
    """Script-box cgroups of this provider still on the host (the workspace's own excluded)."""
    prefix = f"{CGROUP_PREFIX}{base_tag(provider.layout.base_dir)}-"
    own = {os.path.basename(p) for p in corral.provider.describe_workspace(ws)["cgroups"]}
    placements, _ = find_placements({"memory", "pids"})
    found = []
    for placement in placements:
        with os.scandir(placement.parent) as entries:
            found += [e.name for e in entries if e.name.startswith(prefix)]
    return sorted(set(found) - own)


async def test_languages_are_probed_and_described(open_script: OpenScript) -> None:
    async with open_script() as (ws, _):
        langs = _langs(ws)
        assert "python" in langs
        assert ("javascript" in langs) == (shutil.which("node", path="/usr/bin:/bin") is not None)
        details = corral.provider.describe_workspace(ws)
        assert details["script_languages"] == langs
        with pytest.raises(corral.OperationError) as info:
            await _script(ws).run_code("ruby", "1", timeout_s=5)
        assert info.value.code == "invalid_argument"
        assert all(lang in str(info.value) for lang in langs)


async def test_script_sees_no_workspace_and_no_host_files(
    open_script: OpenScript, tmp_path: Path
) -> None:
    canary = "canary-host-7d1f"
    host_secret = tmp_path / "host-secret.txt"
    host_secret.write_text(canary)
    async with open_script() as (ws, _):
        assert ws.fs is not None
        await ws.fs.write_file("ws-secret.txt", b"canary-workspace-93ab")
        root = corral.provider.describe_workspace(ws)["root"]
        paths = [
            str(host_secret),
            "ws-secret.txt",
            "/workspace/ws-secret.txt",
            f"{root}/ws-secret.txt",
            "/etc/shadow",
            f"/proc/{os.getpid()}/environ",
        ]
        for path in paths:
            result = await _script(ws).run_code(
                "python",
                f"open({json.dumps(path)}, 'rb').read()[:64].decode(errors='replace')",
                timeout_s=20,
            )
            seen = _everything(result)
            assert "canary" not in seen, f"{path}: the script read it: {result!r}"
            assert result.result_json in (None, '""'), f"{path}: the script read {result!r}"
        listing = await _script(ws).run_code(
            "python", "import os\n[os.getcwd(), os.listdir('.'), os.listdir('/tmp')]", timeout_s=20
        )
        assert listing.result_json is not None, listing
        assert json.loads(listing.result_json)[1:] == [[], []], listing.result_json


async def test_script_has_no_network_even_when_the_workspace_does(
    open_script: OpenScript,
) -> None:
    with loopback_listener() as witness:
        port = witness.port
        attempts = {
            "python": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "'connected'",
            "javascript": "new Promise((ok, no) => { const s = require('net').connect("
            f"{port}, '127.0.0.1', () => ok('connected')); s.on('error', no) }})",
        }
        async with open_script(network="on") as (ws, _):
            # The workspace's shell has the network here; its scripts must not.
            for lang in _langs(ws):
                result = await _script(ws).run_code(lang, attempts[lang], timeout_s=10)
                assert result.result_json != '"connected"', f"{lang}: {result!r}"
                assert result.error is not None, f"{lang}: {result!r}"
            interfaces = await _script(ws).run_code(
                "python",
                "lines = open('/proc/net/dev').readlines()[2:]\n"
                "sorted(line.split(':')[0].strip() for line in lines)",
                timeout_s=10,
            )
            assert interfaces.result_json == '["lo"]', interfaces
    assert not witness.accepted, "a script reached a server on the host's loopback"


async def test_infinite_loops_end_within_the_budget(open_script: OpenScript) -> None:
    loops = {"python": "print('begun')\nwhile True: pass", "javascript": "for (;;) {}"}
    async with open_script() as (ws, provider):
        for lang in _langs(ws):
            started = time.monotonic()
            result = await _script(ws).run_code(lang, loops[lang], timeout_s=1.0)
            elapsed = time.monotonic() - started
            assert result.timed_out, f"{lang}: {result!r}"
            assert result.exit_code is None, f"{lang}: {result!r}"
            assert elapsed < 1.0 + _SLACK_S, f"{lang}: took {elapsed:.1f} s"
        assert _box_cgroups(ws, provider) == [], "a timed-out box left its cgroup behind"


async def test_allocation_bomb_meets_the_memory_limit(open_script: OpenScript) -> None:
    async with open_script(limits={"memory_bytes": 256 * _MIB}) as (ws, _):
        await script_allocation_bomb_scenario(ws, budget_s=30)


async def test_fork_bomb_is_bounded_and_dies_with_the_box(open_script: OpenScript) -> None:
    async with open_script(limits={"processes": 32}) as (ws, provider):
        await script_fork_bomb_scenario(ws, max_processes=32, budget_s=20)
        # The sleepers died with the box: no cgroup (nor any process in it) is left.
        assert _box_cgroups(ws, provider) == [], "the fork bomb's cgroup is still there"


async def test_nothing_persists_between_calls(open_script: OpenScript) -> None:
    async with open_script() as (ws, _):
        await script_leaves_nothing_scenario(ws)


async def test_closed_workspace_refuses_scripts(open_script: OpenScript) -> None:
    async with open_script() as (ws, _):
        script = _script(ws)
    with pytest.raises(corral.OperationError) as info:
        await script.run_code("python", "1", timeout_s=5)
    assert info.value.code == "closed"


async def test_output_is_capped_and_the_result_still_arrives(open_script: OpenScript) -> None:
    async with open_script() as (ws, _):
        await script_output_cap_scenario(ws)
