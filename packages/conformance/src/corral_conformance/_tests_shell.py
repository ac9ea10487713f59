"""Rule 8: the shell module (where advertised)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from corral import CommandRequest, ExecResult, OperationError, Shell

from ._harness import Harness

__all__ = ["AbstractShellTests"]

_LATE_CHILD = "late-child.txt"
_LATE_DETACHED = "late-detached.txt"
_CAP = 1000
_NOTE_MAX = 200
"""A capped stream may end with a short truncation note for the model."""


def _req(command: str, **kwargs: Any) -> CommandRequest:
    kwargs.setdefault("timeout_s", 30.0)
    kwargs.setdefault("allow_shell_syntax", True)
    return CommandRequest(command, **kwargs)


async def _run(h: Harness, shell: Shell, command: str, **kwargs: Any) -> ExecResult:
    return await h.call(shell.run, _req(command, **kwargs))


def _shell(opened: Any) -> Shell:
    shell = opened.workspace.shell
    assert shell is not None
    return shell  # type: ignore[no-any-return]


def _check_capped(stream: str, text: str, mine: str, other: str) -> None:
    """At most the cap of the command's own bytes, then at most a short note."""
    body = len(text) - len(text.lstrip(mine))
    note = text[body:]
    assert 0 < body <= _CAP, f"{stream} kept {body} bytes of output under a {_CAP}-byte cap"
    assert len(note.encode()) <= _NOTE_MAX, f"{stream}: {len(note)} chars follow the capped output"
    assert mine * 8 not in note, f"{stream}: output continues after the truncation note"
    assert other * 8 not in text, f"{stream} holds the other stream's output"


class AbstractShellTests:
    """Rule 8 for providers that advertise ``shell``."""

    @pytest.mark.anyio
    async def test_shell_exit_codes(self, conformance: Harness) -> None:
        """Exit statuses come back as they are."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            for command, syntax, code in (
                ("true", False, 0),
                ("false", False, 1),
                ("exit 7", True, 7),
            ):
                result = await _run(h, shell, command, allow_shell_syntax=syntax)
                assert result.exit_code == code, (
                    f"{command!r}: exit code {result.exit_code!r}, expected {code}"
                )
                assert not result.timed_out, f"{command!r} reported a timeout"

    @pytest.mark.anyio
    async def test_shell_separates_stdout_and_stderr(self, conformance: Harness) -> None:
        """stdout and stderr are captured separately and completely."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            result = await _run(h, _shell(opened), "echo out-text; echo err-text >&2")
            assert result.stdout == "out-text\n", f"stdout was {result.stdout!r}"
            assert result.stderr == "err-text\n", f"stderr was {result.stderr!r}"
            assert not result.stdout_truncated, "small stdout marked truncated"
            assert not result.stderr_truncated, "small stderr marked truncated"

    @pytest.mark.anyio
    async def test_shell_stdin(self, conformance: Harness) -> None:
        """``stdin`` reaches the command."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            result = await _run(
                h, _shell(opened), "cat", stdin="from stdin\n", allow_shell_syntax=False
            )
            assert result.stdout == "from stdin\n", f"stdout was {result.stdout!r}"

    @pytest.mark.anyio
    async def test_shell_cwd(self, conformance: Harness) -> None:
        """Commands start at the workspace root, or in ``cwd`` (an agent path)."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            made = await _run(
                h, shell, "mkdir -p sub/deeper && echo x > sub/marker.txt && echo y > top.txt"
            )
            assert made.exit_code == 0, f"setup failed: {made!r}"
            root = await _run(h, shell, "ls")
            assert "top.txt" in root.stdout.split(), (
                f"default cwd is not the workspace root: {root.stdout!r}"
            )
            for cwd in ("/sub", "sub", "/sub/deeper/.."):
                inside = await _run(h, shell, "ls", cwd=cwd)
                assert inside.stdout.split() == ["deeper", "marker.txt"], (
                    f"cwd={cwd!r}: ls printed {inside.stdout!r}"
                )

    @pytest.mark.anyio
    async def test_shell_cwd_outside_workspace_rejected(self, conformance: Harness) -> None:
        """A ``cwd`` outside the workspace, or missing, is an ``OperationError``."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            for cwd in ("/..", "../..", "/missing-dir", "/a\x00b"):
                with pytest.raises(OperationError):
                    await _run(h, shell, "ls", cwd=cwd)

    @pytest.mark.anyio
    async def test_shell_env(self, conformance: Harness) -> None:
        """``env`` entries reach the command."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            env = {"CORRAL_CONFORMANCE_VAR": "value-42"}
            result = await _run(
                h,
                _shell(opened),
                "env",
                env=env,
                allow_shell_syntax=False,
            )
            lines = result.stdout.splitlines()
            assert "CORRAL_CONFORMANCE_VAR=value-42" in lines, "env did not list the variable"

    @pytest.mark.anyio
    async def test_shell_timeout_kills_process_tree(self, conformance: Harness) -> None:
        """A timeout returns ``timed_out=True`` promptly and kills every descendant."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            command = (
                f"(sleep 1.5; echo late > {_LATE_CHILD}) & "
                "if command -v setsid >/dev/null 2>&1; then "
                f"setsid sh -c 'sleep 1.5; echo late > {_LATE_DETACHED}' & fi; sleep 30"
            )
            started = time.monotonic()
            result = await _run(h, shell, command, timeout_s=0.5)
            elapsed = time.monotonic() - started
            assert result.timed_out, f"a 30 s command under a 0.5 s timeout returned {result!r}"
            assert result.exit_code is None, (
                f"a timed-out command has exit code {result.exit_code!r}"
            )
            assert elapsed < 10, f"the timed-out command took {elapsed:.1f} s to return"
            await anyio.sleep(2.5)
            listing = await _run(h, shell, "ls -a")
            names = listing.stdout.split()
            assert _LATE_CHILD not in names, "a background child survived the timeout"
            assert _LATE_DETACHED not in names, (
                "a descendant that called setsid survived the timeout"
            )

    @pytest.mark.anyio
    async def test_shell_output_is_capped(self, conformance: Harness) -> None:
        """Output beyond ``max_output_bytes`` is cut per stream and flagged.

        A short note (up to 200 bytes) may follow the kept output.
        """
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            command = (
                "head -c 300000 /dev/zero | tr '\\0' o; head -c 300000 /dev/zero | tr '\\0' e >&2"
            )
            result = await _run(h, shell, command, max_output_bytes=_CAP)
            assert not result.timed_out, "capped output made the command hang"
            assert result.stdout_truncated, "stdout truncation not flagged"
            assert result.stderr_truncated, "stderr truncation not flagged"
            _check_capped("stdout", result.stdout, "o", "e")
            _check_capped("stderr", result.stderr, "e", "o")
