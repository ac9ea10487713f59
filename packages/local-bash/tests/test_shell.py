"""The shell of a local-bash workspace runs real subprocesses in the workspace directory."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import anyio
import pytest

from corral.provider import CommandRequest, OperationError, ProviderConfig, SessionRef
from corral_local_bash import LocalBashProvider

CONFIG = ProviderConfig(kind="local-bash")


@pytest.mark.anyio
async def test_shell_runs_in_the_workspace(
    make_provider: Callable[..., LocalBashProvider],
) -> None:
    provider = make_provider(
        base_env={"CORRAL_TEST_MARK": "yes"}, shell_limits={"file_size_bytes": 1 << 20}
    )
    opened = await provider.open(CONFIG, SessionRef("sh"))
    ws = opened.workspace
    assert ws.shell is not None
    assert ws.fs is not None
    root = provider.layout.workspace_path(opened.ref.payload["workspace"])
    pwd = await ws.shell.run(CommandRequest("pwd"))
    assert pwd.exit_code == 0
    assert pwd.stdout.strip() == root
    env = await ws.shell.run(CommandRequest("env"))
    assert "CORRAL_TEST_MARK=yes" in env.stdout
    probe = "import resource; print(resource.getrlimit(resource.RLIMIT_FSIZE)[0])"
    limit = await ws.shell.run(CommandRequest(f"{sys.executable} -c '{probe}'"))
    assert limit.stdout.strip() == str(1 << 20), limit
    made = await ws.shell.run(CommandRequest("touch made-by-shell"))
    assert made.exit_code == 0
    assert [e.name for e in await ws.fs.ls("/")] == ["made-by-shell"]
    await ws.close()


@pytest.mark.anyio
async def test_close_stops_running_commands(provider: LocalBashProvider) -> None:
    opened = await provider.open(CONFIG, SessionRef("sh"), frozenset({"shell"}))
    ws = opened.workspace
    assert ws.shell is not None
    assert ws.fs is None
    shell = ws.shell
    results = []

    async def long_command() -> None:
        results.append(await shell.run(CommandRequest("sleep 30", timeout_s=60)))

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(long_command)
        await anyio.sleep(0.3)
        await ws.close()
    assert time.monotonic() - started < 10
    assert results
    assert results[0].exit_code != 0
    with pytest.raises(OperationError) as closed:
        await shell.run(CommandRequest("true"))
    assert closed.value.code == "closed"


def test_bad_shell_options_are_rejected(make_provider: Callable[..., LocalBashProvider]) -> None:
    with pytest.raises(ValueError, match="shell_limits"):
        make_provider(shell_limits={"bogus": 1})
    with pytest.raises(ValueError, match="base_env"):
        make_provider(base_env={"A": 1})
