"""Attacks through ``script``: each call is a fresh container with nothing of the workspace.

The boundary under test: no mount (the workspace's files are out of reach),
``--network none`` even when the workspace has a network, the workspace's
memory and pids limits, a timeout that removes the whole container, and
nothing left behind -- neither files for the next call nor containers.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest

import corral
import corral.provider
from corral.provider import CodeInterpreter, Workspace
from corral_conformance import (
    script_allocation_bomb_scenario,
    script_fork_bomb_scenario,
    script_leaves_nothing_scenario,
    script_output_cap_scenario,
)
from corral_docker import DockerProvider

TEST_IMAGE = os.environ.get("CORRAL_DOCKER_IMAGE", "corral-test:latest")

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

_SLACK_S = 20.0

OpenScript = Callable[..., AbstractAsyncContextManager[Workspace]]


@pytest.fixture
def open_script(tmp_root: str, python_image: str) -> OpenScript:
    """``async with open_script(**options) as ws``: a docker workspace with script and fs."""

    @asynccontextmanager
    async def opener(**options: Any) -> AsyncIterator[Workspace]:
        options.setdefault("image", python_image)
        provider = DockerProvider(pull=False, tmpdir_root=tmp_root, **options)
        opened = await provider.open(
            corral.ProviderConfig("docker"),
            corral.SessionRef("script"),
            frozenset({"script", "fs"}),
        )
        try:
            yield opened.workspace
        finally:
            await opened.workspace.close()

    return opener


def _script(ws: Workspace) -> CodeInterpreter:
    assert ws.script is not None
    return ws.script


def _langs(ws: Workspace) -> list[str]:
    return sorted(_script(ws).languages)


async def _script_boxes(ws: Workspace) -> list[str]:
    """Script containers of this workspace still on the engine."""
    name = corral.provider.describe_workspace(ws)["workspace"]
    listed = await anyio.run_process(
        [
            "docker",
            "ps",
            "-aq",
            "--filter",
            "label=io.corral.script=1",
            "--filter",
            f"label=io.corral.workspace={name}",
        ]
    )
    return listed.stdout.decode().split()


async def test_languages_are_probed_from_the_image(open_script: OpenScript) -> None:
    async with open_script() as ws:
        assert _langs(ws) == ["javascript", "python"]
        assert corral.provider.describe_workspace(ws)["script_languages"] == _langs(ws)
    async with open_script(image=TEST_IMAGE) as bare:
        # busybox: no interpreter; the module is there and says why it cannot run.
        assert _langs(bare) == []
        with pytest.raises(corral.OperationError) as info:
            await _script(bare).run_code("python", "1", timeout_s=5)
        assert info.value.code == "invalid_argument"
        assert "neither python3 nor node" in str(info.value)


async def test_script_sees_nothing_of_the_workspace(open_script: OpenScript) -> None:
    async with open_script() as ws:
        assert ws.fs is not None
        await ws.fs.write_file("ws-secret.txt", b"canary-workspace-93ab")
        root = corral.provider.describe_workspace(ws)["root"]
        for path in ("ws-secret.txt", "/workspace/ws-secret.txt", f"{root}/ws-secret.txt"):
            result = await _script(ws).run_code(
                "python", f"open({json.dumps(path)}).read()", timeout_s=30
            )
            assert "canary" not in f"{result.stdout}{result.stderr}{result.result_json}", path
            assert result.error is not None, f"{path}: {result!r}"
        mounts = await _script(ws).run_code(
            "python", "[l.split()[1] for l in open('/proc/mounts')]", timeout_s=30
        )
        assert mounts.result_json is not None, mounts
        assert "/workspace" not in json.loads(mounts.result_json), mounts.result_json


async def test_network_is_none_even_when_the_workspace_has_one(open_script: OpenScript) -> None:
    async with open_script(network="bridge") as ws:
        for lang, code in {
            "python": "lines = open('/proc/net/dev').readlines()[2:]\n"
            "sorted(line.split(':')[0].strip() for line in lines)",
            "javascript": "Object.keys(require('os').networkInterfaces()).sort()",
        }.items():
            result = await _script(ws).run_code(lang, code, timeout_s=30)
            assert result.result_json == '["lo"]', f"{lang}: {result!r}"


async def test_infinite_loop_removes_the_container(open_script: OpenScript) -> None:
    async with open_script() as ws:
        for lang, code in {"python": "while True: pass", "javascript": "for (;;) {}"}.items():
            started = time.monotonic()
            result = await _script(ws).run_code(lang, code, timeout_s=1.0)
            elapsed = time.monotonic() - started
            assert result.timed_out, f"{lang}: {result!r}"
            assert result.exit_code is None, f"{lang}: {result!r}"
            assert elapsed < 1.0 + _SLACK_S, f"{lang}: took {elapsed:.1f} s"
        assert await _script_boxes(ws) == [], "a timed-out script's container is still there"


async def test_allocation_bomb_meets_the_memory_limit(open_script: OpenScript) -> None:
    async with open_script(memory=256 * 1024**2) as ws:
        await script_allocation_bomb_scenario(ws, budget_s=60)


async def test_fork_bomb_is_bounded(open_script: OpenScript) -> None:
    async with open_script(pids_limit=32) as ws:
        await script_fork_bomb_scenario(ws, max_processes=32, budget_s=30)
        assert await _script_boxes(ws) == [], "the fork bomb's container is still there"


async def test_nothing_persists_between_calls(open_script: OpenScript) -> None:
    async with open_script() as ws:
        await script_leaves_nothing_scenario(ws)


async def test_output_is_capped_and_the_result_still_arrives(open_script: OpenScript) -> None:
    # The result frame follows 3 MiB of stderr: the host finds it in the stream's tail.
    async with open_script() as ws:
        await script_output_cap_scenario(ws)
