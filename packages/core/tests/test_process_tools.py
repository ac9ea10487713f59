"""The ``process`` capability's tools over a scripted ProcessManager (see _process_fake).

The tools' contract: arguments (types, limits, the policy's allowlist, key
names) are checked before the manager is touched; output is read by byte
cursor and decoded without cutting a character in two, so resuming from
``next_cursor`` loses and repeats nothing; an expired cursor is an error
naming the earliest one; the terminal tools show the rendered screen.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import hypothesis
import pytest
from hypothesis import strategies as st

import corral
from corral import ConfigError, ProcessPolicy, WorkspaceSession
from corral._builtin_capabilities import PROCESS
from corral._process_tools import decode_chunk
from corral.provider import ModularWorkspace

from ._process_fake import FakeProcessManager
from .conftest import FakeProvider

pytestmark = pytest.mark.anyio


class ProcessProvider(FakeProvider):
    """The fake provider with a scripted process module."""

    def __init__(self) -> None:
        super().__init__(("fs", "process"))
        self.manager = FakeProcessManager()

    def _build(self, ws_id: str) -> ModularWorkspace:
        plain = super()._build(ws_id)
        ws = ModularWorkspace(
            ws_id, fs=plain.fs, extra_modules={"process": self.manager}, on_close=plain.close
        )
        self.workspaces[ws_id] = ws
        return ws


@asynccontextmanager
async def session(policy: Any = True) -> AsyncIterator[tuple[WorkspaceSession, FakeProcessManager]]:
    provider = ProcessProvider()
    async with corral.open_workspace(
        provider, {"process": policy}, plugins=corral.load_plugins(entrypoints=False)
    ) as ws:
        yield ws, provider.manager


def _io_calls(manager: FakeProcessManager) -> list[str]:
    return [c for c in manager.calls if c not in ("list",)]


# -- policy -------------------------------------------------------------------------


def test_policy_defaults_and_refusals() -> None:
    policy = PROCESS.parse_policy(True)
    assert isinstance(policy, ProcessPolicy)
    assert policy.terminal
    assert policy.timeout_s <= policy.max_timeout_s
    for bad in (
        {"timeout_s": 10.0, "max_timeout_s": 5.0},
        {"max_read_bytes": 3},
        {"max_processes": 0},
        {"max_processes": True},
        {"allowed_commands": "sh"},
        {"terminal": "yes"},
    ):
        with pytest.raises(ConfigError, match=r"capabilities\.process"):
            PROCESS.parse_policy(bad)


def test_terminal_tools_follow_the_policy() -> None:
    names = {t.name for t in PROCESS.tools(ProcessPolicy())}
    assert "workspace_terminal_send" in names
    assert "workspace_start_process" in names
    without = {t.name for t in PROCESS.tools(ProcessPolicy(terminal=False))}
    assert not without & {
        "workspace_open_terminal",
        "workspace_terminal_send",
        "workspace_terminal_screen",
    }


# -- decoding ------------------------------------------------------------------------


def test_a_split_character_is_held_back_whole() -> None:
    data = "aé".encode()  # b"a\xc3\xa9"
    assert decode_chunk(data[:2], ended=False) == ("a", 1)
    assert decode_chunk(data[1:], ended=False) == ("é", 2)
    # Once the stream ended nothing more can complete it: replaced, consumed.
    assert decode_chunk(data[:2], ended=True) == ("a\ufffd", 2)
    # Invalid bytes in the middle are replaced and consumed, never held.
    assert decode_chunk(b"\xffz", ended=False) == ("\ufffdz", 2)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    text=st.text(min_size=0, max_size=60),
    sizes=st.lists(st.integers(min_value=4, max_value=9), min_size=1, max_size=40),
    pieces=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=20),
)
def test_reading_by_cursor_loses_and_repeats_nothing(
    text: str, sizes: list[int], pieces: list[int]
) -> None:
    """Output arrives in arbitrary pieces; reads of arbitrary sizes rebuild it exactly."""

    async def body() -> None:
        async with session() as (ws, manager):
            started = await ws.call("workspace_start_process", {"command": "srv", "wait_s": 0})
            pid = started.data["process_id"]
            data = text.encode()
            got: list[str] = []
            cursor, at, i, finished = 0, 0, 0, False
            while True:
                if at < len(data):  # the process writes its next piece
                    step = pieces[i % len(pieces)]
                    manager.emit(pid, "stdout", data[at : at + step])
                    at += step
                elif not finished:
                    manager.finish(pid, 0)
                    finished = True
                out = await ws.call(
                    "workspace_read_process_output",
                    {"process_id": pid, "cursor": cursor, "max_bytes": sizes[i % len(sizes)]},
                    raise_on_error=True,
                )
                i += 1
                assert out.data["cursor"] == cursor
                assert out.data["next_cursor"] >= cursor
                got.append(out.data["text"])
                cursor = out.data["next_cursor"]
                if out.data["ended"]:
                    break
            assert "".join(got) == text
            assert cursor == len(data)

    anyio.run(body)


async def test_an_expired_cursor_names_the_earliest() -> None:
    async with session({"retained_bytes": 10}) as (ws, manager):
        pid = (await ws.call("workspace_start_process", {"command": "srv", "wait_s": 0})).data[
            "process_id"
        ]
        manager.emit(pid, "stdout", b"0123456789abcdef")
        result = await ws.call("workspace_read_process_output", {"process_id": pid, "cursor": 2})
        assert result.is_error
        assert result.error_code == "cursor_expired"
        assert "earliest available cursor is 6" in result.content
        ok = await ws.call("workspace_read_process_output", {"process_id": pid, "cursor": 6})
        assert ok.data["text"] == "6789abcdef"


async def test_start_returns_the_handle_and_first_output() -> None:
    async with session({"env": {"A": "1"}, "retained_bytes": 4096}) as (ws, manager):
        result = await ws.call(
            "workspace_start_process",
            {"command": "echo hi", "env": {"B": "2"}, "timeout_s": 5},
            raise_on_error=True,
        )
        data = result.data
        assert data["state"] == "exited"
        assert data["exit_code"] == 0
        assert data["stdout"] == {"text": "hi\n", "cursor": 0, "next_cursor": 3, "ended": True}
        assert data["stderr"]["ended"]
        assert not result.content.startswith("{")
        assert "hi" in result.content
        request = manager.requests[0]
        assert dict(request.env) == {"A": "1", "B": "2"}
        assert request.timeout_s == 5
        assert request.retained_bytes == 4096
        assert request.terminal is None


async def test_first_output_on_either_stream_ends_the_start_wait() -> None:
    async with session() as (ws, _manager):
        # A correct start returns at once; a start that waits on stdout alone
        # would sit out its whole wait_s (30 s) first.
        with anyio.fail_after(20):
            result = await ws.call(
                "workspace_start_process", {"command": "warn", "wait_s": 30}, raise_on_error=True
            )
        assert result.data["stderr"]["text"] == "warn\n"
        assert result.data["state"] == "running"


@pytest.mark.parametrize(
    ("policy", "args", "code"),
    [
        (True, {"command": "srv", "env": {"1BAD": "x"}}, "invalid_argument"),
        (True, {"command": "srv", "timeout_s": 10**9}, "invalid_argument"),
        (True, {"command": "srv", "wait_s": 31}, "invalid_argument"),
        (True, {"command": "srv", "wait_s": "1"}, "invalid_argument"),
        (True, {"command": "   "}, "invalid_argument"),
        (True, {"command": 7}, "invalid_argument"),
        ({"allowed_commands": ["ls"]}, {"command": "rm -rf /"}, "policy_denied"),
        ({"allowed_commands": ["ls"]}, {"command": "/bin/ls"}, "policy_denied"),
    ],
)
async def test_bad_start_arguments_touch_nothing(policy: Any, args: Any, code: str) -> None:
    async with session(policy) as (ws, manager):
        result = await ws.call("workspace_start_process", args)
        assert result.is_error
        assert result.error_code == code, result.content
        assert "rm -rf" not in result.content
        assert "start" not in manager.calls


async def test_the_running_limit_counts_running_processes_only() -> None:
    async with session({"max_processes": 2}) as (ws, manager):
        first = await ws.call("workspace_start_process", {"command": "srv", "wait_s": 0})
        await ws.call("workspace_start_process", {"command": "srv", "wait_s": 0})
        refused = await ws.call("workspace_start_process", {"command": "srv", "wait_s": 0})
        assert refused.error_code == "busy"
        assert manager.calls.count("start") == 2
        killed = await ws.call(
            "workspace_kill_process", {"process_id": first.data["process_id"], "forget": True}
        )
        assert killed.data["state"] == "killed"
        assert killed.data["forgotten"]
        again = await ws.call("workspace_start_process", {"command": "srv", "wait_s": 0})
        assert not again.is_error
        listed = await ws.call("workspace_list_processes", {})
        assert len(listed.data["processes"]) == 2
        assert "process p2 (running)" in listed.content


async def test_input_is_sent_and_closed() -> None:
    async with session() as (ws, manager):
        pid = (await ws.call("workspace_start_process", {"command": "cat", "wait_s": 0})).data[
            "process_id"
        ]
        empty = await ws.call("workspace_write_process_input", {"process_id": pid})
        assert empty.error_code == "invalid_argument"
        sent = await ws.call(
            "workspace_write_process_input",
            {"process_id": pid, "text": "héllo\n", "close_stdin": True},
            raise_on_error=True,
        )
        assert sent.data == {"process_id": pid, "bytes_written": 7, "stdin_open": False}
        assert manager.written == ["héllo\n".encode()]
        out = await ws.call("workspace_read_process_output", {"process_id": pid})
        assert out.data["text"] == "héllo\n"


async def test_read_arguments_are_bounded_by_the_policy() -> None:
    async with session({"max_read_bytes": 16}) as (ws, manager):
        pid = (await ws.call("workspace_start_process", {"command": "srv", "wait_s": 0})).data[
            "process_id"
        ]
        before = len(manager.calls)
        for args in (
            {"process_id": pid, "max_bytes": 17},
            {"process_id": pid, "max_bytes": 3},
            {"process_id": pid, "cursor": -1},
            {"process_id": pid, "stream": "stdin"},
            {"process_id": pid, "wait_s": 1e9},
        ):
            result = await ws.call("workspace_read_process_output", args)
            assert result.error_code == "invalid_argument", args
        assert len(manager.calls) == before


# -- terminals -----------------------------------------------------------------------


async def test_a_terminal_shows_the_rendered_screen() -> None:
    async with session() as (ws, manager):
        opened = await ws.call(
            "workspace_open_terminal", {"cols": 40, "rows": 10, "wait_s": 0}, raise_on_error=True
        )
        tid = opened.data["terminal_id"]
        assert manager.requests[0].command == "sh"
        assert manager.requests[0].terminal == corral.provider.TerminalSize(40, 10)
        # A full-screen program clears the screen and draws at a position.
        manager.emit(tid, "stdout", b"noise\x1b[2J\x1b[3;5Hhello \x1b[31mred\x1b[0m")
        screen = await ws.call("workspace_terminal_screen", {"terminal_id": tid})
        assert screen.data["screen"] == "\n\n    hello red"
        assert (screen.data["cursor_row"], screen.data["cursor_col"]) == (2, 13)
        assert "\x1b" not in screen.content
        sent = await ws.call(
            "workspace_terminal_send",
            {"terminal_id": tid, "text": "ls", "keys": ["Enter", "Ctrl-C", "Up"], "wait_s": 0},
            raise_on_error=True,
        )
        assert manager.written[-1] == b"ls\r\x03\x1b[A"
        assert "hello red" in sent.data["screen"]
        resized = await ws.call(
            "workspace_resize_terminal", {"terminal_id": tid, "cols": 100, "rows": 30}
        )
        assert resized.data == {"terminal_id": tid, "cols": 100, "rows": 30}
        after = await ws.call("workspace_terminal_screen", {"terminal_id": tid})
        assert (after.data["cols"], after.data["rows"]) == (100, 30)
        closed = await ws.call("workspace_close_terminal", {"terminal_id": tid})
        assert closed.data["closed"]
        listed = await ws.call("workspace_list_processes", {})
        assert listed.data["processes"] == []


async def test_terminal_arguments_are_checked_first() -> None:
    async with session() as (ws, manager):
        tid = (await ws.call("workspace_open_terminal", {"wait_s": 0})).data["terminal_id"]
        plain = (await ws.call("workspace_start_process", {"command": "srv", "wait_s": 0})).data[
            "process_id"
        ]
        before = list(manager.calls)
        for args in (
            {"terminal_id": tid, "keys": ["F13"]},
            {"terminal_id": tid, "keys": "Enter"},
            {"terminal_id": tid},
            {"terminal_id": tid, "text": ""},
        ):
            result = await ws.call("workspace_terminal_send", args)
            assert result.error_code == "invalid_argument", args
            assert "F13" not in result.content
        assert manager.written == []
        assert "write_stdin" not in manager.calls[len(before) :]
        for tool in ("workspace_terminal_screen", "workspace_close_terminal"):
            result = await ws.call(tool, {"terminal_id": plain})
            assert result.error_code == "invalid_argument"
        bad_size = await ws.call(
            "workspace_resize_terminal", {"terminal_id": tid, "cols": 0, "rows": 5}
        )
        assert bad_size.error_code == "invalid_argument"


async def test_the_screen_without_pyte_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    async with session() as (ws, manager):
        monkeypatch.setitem(sys.modules, "pyte", None)
        result = await ws.call("workspace_open_terminal", {"wait_s": 0})
        assert result.is_error
        assert result.error_code == "unsupported"
        assert "pip install 'corral-core[terminal]'" in result.content
        assert "start" not in manager.calls


async def test_a_screen_behind_the_window_is_rebuilt_and_says_so() -> None:
    async with session({"retained_bytes": 8}) as (ws, manager):
        tid = (await ws.call("workspace_open_terminal", {"wait_s": 0})).data["terminal_id"]
        manager.emit(tid, "stdout", b"abc")
        first = await ws.call("workspace_terminal_screen", {"terminal_id": tid})
        assert first.data["screen"] == "abc"
        assert not first.data["partial"]
        manager.emit(tid, "stdout", b"\r\n0123456789")
        later = await ws.call("workspace_terminal_screen", {"terminal_id": tid})
        assert later.data["partial"]
        assert later.data["screen"] == "23456789"
        assert later.data["next_cursor"] == 15
