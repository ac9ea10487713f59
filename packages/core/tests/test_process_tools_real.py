"""The process tools over real process modules: a background command read by cursor,
an interactive interpreter driven through a terminal's rendered screen."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import corral
from corral import WorkspaceSession

from ._real_providers import provider_options, require

pytestmark = pytest.mark.anyio


def _provider(kind: str, tmp_path: Path) -> Any:
    """The provider, with its process module advertised (the posix ones build it already)."""
    options = provider_options(kind, tmp_path)
    if kind == "local-bash":
        from corral_local_bash import LocalBashProvider as base
    elif kind == "local-sandbox":
        from corral_local_sandbox import LocalSandboxProvider as base
    else:
        return kind
    if "process" in base.capabilities:
        return kind

    class WithProcesses(base):  # type: ignore[valid-type,misc]
        capabilities = frozenset(base.capabilities | {"process"})

    return WithProcesses(**options)


@pytest.fixture(params=["local-bash", "local-sandbox", "docker"])
def kind(request: pytest.FixtureRequest) -> str:
    require(str(request.param))
    return str(request.param)


@asynccontextmanager
async def session(kind: str, tmp_path: Path) -> AsyncIterator[WorkspaceSession]:
    provider = _provider(kind, tmp_path)
    options = provider_options(kind, tmp_path) if isinstance(provider, str) else None
    try:
        async with corral.open_workspace(
            provider,
            {"process": {"allow_shell_syntax": True, "max_read_bytes": 16}},
            provider_options=options,
        ) as ws:
            yield ws
    except corral.ConfigError as exc:
        if "cannot populate" in str(exc):
            pytest.skip(f"{kind} has no process module yet")
        raise


async def test_background_output_is_read_by_cursor(kind: str, tmp_path: Path) -> None:
    script = "i=0; while [ $i -lt 6 ]; do echo line-$i-é; i=$((i+1)); sleep 0.05; done"
    async with session(kind, tmp_path) as ws:
        started = await ws.call("workspace_start_process", {"command": script, "wait_s": 0})
        assert not started.is_error, started.content
        pid = started.data["process_id"]
        cursor, text = 0, ""
        for _ in range(1000):
            out = await ws.call(
                "workspace_read_process_output",
                {"process_id": pid, "cursor": cursor, "wait_s": 5},
                raise_on_error=True,
            )
            text += out.data["text"]
            cursor = out.data["next_cursor"]
            if out.data["ended"]:
                break
        assert text == "".join(f"line-{i}-é\n" for i in range(6))
        assert (out.data["state"], out.data["exit_code"]) == ("exited", 0)


async def test_an_interpreter_is_driven_through_the_screen(kind: str, tmp_path: Path) -> None:
    local = kind != "docker"  # the test image has no python: a shell there
    command = "python3 -q -i" if local else "sh"
    async with session(kind, tmp_path) as ws:
        opened = await ws.call(
            "workspace_open_terminal",
            {"command": command, "cols": 50, "rows": 10, "wait_s": 5},
            raise_on_error=True,
        )
        tid = opened.data["terminal_id"]
        sent = await ws.call(
            "workspace_terminal_send",
            {"terminal_id": tid, "text": "6*7" if local else "echo $((6*7))", "keys": ["Enter"]},
            raise_on_error=True,
        )
        for _ in range(50):
            if "42" in sent.data["screen"]:
                break
            sent = await ws.call(
                "workspace_terminal_screen",
                {"terminal_id": tid, "wait_s": 0.2},
                raise_on_error=True,
            )
        assert "42" in sent.data["screen"], sent.content
        assert "\x1b" not in sent.data["screen"]
        await ws.call("workspace_terminal_send", {"terminal_id": tid, "keys": ["Ctrl-D"]})
        closed = await ws.call("workspace_close_terminal", {"terminal_id": tid})
        assert closed.data["closed"], closed.content
        listed = await ws.call("workspace_list_processes", {})
        assert tid not in [p["process_id"] for p in listed.data["processes"]]
