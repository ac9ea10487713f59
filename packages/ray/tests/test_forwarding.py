"""The ``process`` and ``code`` modules of local-bash, forwarded through ray on the real cluster."""

from __future__ import annotations

import pytest

from corral import ProviderConfig, SessionRef
from corral.provider import ProcessManager, ProcessRequest
from corral_ray import RayProvider
from corral_ray.testing import LocalCluster, processes_matching

pytestmark = [pytest.mark.anyio, pytest.mark.ray, pytest.mark.slow]


async def test_process_and_code_modules_are_forwarded(ray_cluster: LocalCluster) -> None:
    provider = RayProvider(
        address=ray_cluster.address,
        inner_options={"tmpdir_root": str(ray_cluster.root)},
        placement={"resource": "w1"},
    )
    opened = await provider.open(
        ProviderConfig(kind="ray"),
        SessionRef("forwarding"),
        frozenset({"fs", "shell", "code", "process"}),
    )
    ws = opened.workspace
    marker = "31.4159"
    try:
        processes = ws.module("process")
        assert processes is not None
        manager: ProcessManager = processes  # type: ignore[assignment]
        # A background process: its output read by cursor, then killed.
        info = await manager.start(
            ProcessRequest(command=f"echo one; sleep {marker}", allow_shell_syntax=True)
        )
        assert info.state == "running"
        first = await manager.read(info.process_id, cursor=0, wait_s=20)
        assert first.data == b"one\n"
        assert first.next_cursor == 4
        again = await manager.read(info.process_id, cursor=first.next_cursor, wait_s=0)
        assert (again.data, again.ended) == (b"", False)
        assert processes_matching(f"sleep {marker}")
        killed = await manager.kill(info.process_id)
        assert killed.state == "killed"
        assert [p.state for p in await manager.list() if p.process_id == info.process_id] == [
            "killed"
        ]
        assert not processes_matching(f"sleep {marker}")
        # A code context keeps its state between runs.
        code = ws.code
        assert code is not None
        assert "python" in code.languages
        context = await code.create_context("python")
        first_run = await code.run_in_context(context, "x = 41", timeout_s=60)
        assert first_run.exit_code == 0
        second = await code.run_in_context(context, "print(x + 1)", timeout_s=60)
        assert second.stdout.strip() == "42"
        await code.delete_context(context)
    finally:
        await ws.close()
    assert not processes_matching(f"sleep {marker}")
