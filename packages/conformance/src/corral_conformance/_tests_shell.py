"""Rule 8: the shell module (where advertised)."""

from __future__ import annotations

import math
import os
import secrets
import time
from typing import Any

import anyio
import pytest

from corral import ExecResult, OperationError
from corral.provider import CommandRequest, Shell

from ._harness import Harness
from ._rules import define, rule

__all__ = ["AbstractShellTests"]

_S = "Shell.run"
_R = "corral._data.ExecResult"
_C = "corral._data.CommandRequest"
EXIT_STATUS = define(
    "shell.exit.status",
    _R,
    "exit_code is the command's exit status as the OS reports it (0-255; exit 256 is 0).",
)
EXIT_SIGNAL = define(
    "shell.exit.signal",
    _R,
    "exit_code is None when the process was killed by a signal; signal then names it.",
)
EXIT_NOT_FOUND = define(
    "shell.exit.not_found", _R, "A program that does not exist exits with 127 (not an exception)."
)
EXIT_NOT_EXEC = define(
    "shell.exit.not_executable",
    _R,
    "A program that exists but cannot be executed exits with 126 (not an exception).",
)
STREAMS = define(
    "shell.output.streams",
    _R,
    "stdout and stderr are captured separately and completely, as UTF-8 text.",
)
CAP = define(
    "shell.output.cap",
    _C,
    "max_output_bytes caps each stream; stdout_truncated / stderr_truncated are set exactly "
    "when that stream produced more than max_output_bytes bytes (output of exactly the cap is "
    "kept whole and not flagged); a note of at most 200 bytes may follow cut output.",
)
STDIN = define(
    "shell.stdin.exact",
    _C,
    "stdin is delivered exactly (empty included); None gives the command an empty stdin "
    "(EOF at once). Up to 64 KiB must be delivered; more may be refused with invalid_argument "
    "or too_large, never silently cut. Text that stands for no bytes (a lone surrogate) is "
    "invalid_argument.",
)
CWD = define(
    "shell.cwd.semantics",
    _C,
    "Commands start at the workspace root, or in cwd (an agent path, relative or absolute).",
)
CWD_OUTSIDE = define(
    "shell.cwd.contained",
    _C,
    "A cwd outside the workspace, or missing, is an OperationError; nothing runs.",
)
ENV_GIVEN = define(
    "shell.env.given",
    _C,
    "Every variable in env reaches the command with exactly its value (spaces, newlines, unicode).",
)
ENV_HOST = define(
    "shell.env.host_absent",
    _C,
    "The command never sees variables of the process hosting the provider beyond the "
    "provider's base environment; env is the only way in.",
)
TIMEOUT = define(
    "shell.timeout.kills_tree",
    _S,
    "A timeout is not an exception: the result has timed_out=True (exit_code None) and the "
    "whole process tree has been killed.",
)
ALLOWLIST = define(
    "shell.policy.allowlist",
    _S,
    "A command the policy refuses raises OperationError(code='policy_denied') before anything "
    "runs: with allowed_commands set, a program not in it -- also any program after a pipe, "
    "&&, || or ; when shell syntax is allowed -- is refused by the shell itself.",
)
SYNTAX = define(
    "shell.policy.syntax",
    _S,
    "With allow_shell_syntax=False, a command using shell syntax (pipes, lists, redirections, "
    "substitutions, globs) raises OperationError(code='policy_denied') and nothing runs.",
)
DURATION = define(
    "shell.result.duration",
    _R,
    "duration_ms is the command's wall time in milliseconds: finite, at least 0, and at least "
    "the time the command itself slept.",
)

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


async def _names(h: Harness, shell: Shell) -> list[str]:
    """The workspace root's entries, listed without any policy."""
    listing = await _run(h, shell, "ls -a", allow_shell_syntax=False)
    assert listing.exit_code == 0, f"ls -a failed: {listing!r}"
    return listing.stdout.split()


async def _denied(h: Harness, shell: Shell, command: str, **kwargs: Any) -> None:
    """The request must be refused with policy_denied (and run nothing)."""
    try:
        result = await _run(h, shell, command, **kwargs)
    except OperationError as exc:
        code: str = exc.code
    else:
        raise AssertionError(f"{command!r} ({kwargs}) was not refused: it ran and gave {result!r}")
    assert code == "policy_denied", (
        f"{command!r} ({kwargs}) was refused with code {code!r}, expected policy_denied"
    )


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

    @rule(EXIT_STATUS)
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
                ("exit 2", True, 2),
                ("exit 7", True, 7),
                ("exit 255", True, 255),
                ("exit 256", True, 0),
                ("exit 257", True, 1),
            ):
                result = await _run(h, shell, command, allow_shell_syntax=syntax)
                assert result.exit_code == code, (
                    f"{command!r}: exit code {result.exit_code!r}, expected {code}"
                )
                assert not result.timed_out, f"{command!r} reported a timeout"
                assert result.signal is None, f"{command!r} reported signal {result.signal!r}"

    @rule(STREAMS)
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

    @rule(STDIN)
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

    @rule(CWD)
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

    @rule(CWD_OUTSIDE)
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

    @rule(ENV_GIVEN)
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

    @rule(TIMEOUT)
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

    @rule(CAP)
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

    @rule(EXIT_SIGNAL)
    @pytest.mark.anyio
    async def test_shell_death_by_signal(self, conformance: Harness) -> None:
        """A command killed by a signal has ``exit_code`` None and ``signal`` set."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            for command, number in (("kill -KILL $$", 9), ("kill -TERM $$", 15)):
                result = await _run(h, shell, command)
                assert (result.exit_code, result.signal) == (None, number), (
                    f"{command!r}: exit_code {result.exit_code!r}, signal {result.signal!r}; "
                    f"expected exit_code None and signal {number}"
                )
                assert not result.timed_out, f"{command!r} reported a timeout"

    @rule(EXIT_NOT_FOUND, EXIT_NOT_EXEC)
    @pytest.mark.anyio
    async def test_shell_missing_and_non_executable_programs(self, conformance: Harness) -> None:
        """Missing program: exit 127; present but not executable: exit 126."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            made = await _run(
                h,
                shell,
                "printf '#!/bin/sh\\necho ran\\n' > noexec.sh && chmod 644 noexec.sh"
                " && mkdir -p adir",
            )
            assert made.exit_code == 0, f"setup failed: {made!r}"
            for command, syntax, code in (
                ("corral-no-such-program-7f3a", False, 127),
                ("corral-no-such-program-7f3a", True, 127),
                ("./noexec.sh", False, 126),
                ("./noexec.sh", True, 126),
                ("./adir", False, 126),
            ):
                try:
                    result = await _run(h, shell, command, allow_shell_syntax=syntax)
                except OperationError as exc:
                    raise AssertionError(
                        f"{command!r}: raised OperationError({exc.code!r}); expected exit {code}"
                    ) from exc
                assert result.exit_code == code, (
                    f"{command!r} (shell syntax {syntax}): exit code {result.exit_code!r}, "
                    f"expected {code}"
                )
                assert "ran" not in result.stdout, f"{command!r} ran a non-executable file"

    @rule(CAP, STREAMS)
    @pytest.mark.anyio
    async def test_shell_output_cap_boundaries(self, conformance: Harness) -> None:
        """Exactly the cap is kept whole and unflagged; one byte over is flagged."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            for out_n, err_n in (
                (_CAP - 1, 0),
                (_CAP, _CAP),
                (_CAP + 1, 5),
                (3, _CAP + 1),
                (0, 0),
            ):
                command = (
                    f"head -c {out_n} /dev/zero | tr '\\0' o; "
                    f"head -c {err_n} /dev/zero | tr '\\0' e >&2"
                )
                result = await _run(h, shell, command, max_output_bytes=_CAP)
                what = f"{out_n} bytes to stdout, {err_n} to stderr under a {_CAP}-byte cap"
                for stream, n, text, flag, mine, other in (
                    ("stdout", out_n, result.stdout, result.stdout_truncated, "o", "e"),
                    ("stderr", err_n, result.stderr, result.stderr_truncated, "e", "o"),
                ):
                    assert flag == (n > _CAP), f"{what}: {stream}_truncated is {flag}"
                    if n <= _CAP:
                        assert text == mine * n, (
                            f"{what}: {stream} is {len(text)} chars, expected all {n} bytes"
                        )
                    else:
                        _check_capped(stream, text, mine, other)
            utf8 = await _run(h, shell, "printf 'h\\303\\251llo \\346\\227\\245'")
            assert utf8.stdout == "héllo 日", f"UTF-8 output came back as {utf8.stdout!r}"

    @rule(STDIN)
    @pytest.mark.anyio
    async def test_shell_stdin_exact(self, conformance: Harness) -> None:
        """stdin arrives byte for byte: empty, absent, unicode, no final newline, 60 KiB."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            big = "".join(f"{i:07d}\n" for i in range(60 * 1024 // 8))
            for data in ("", None, "héllo\n日本\r\n", "no newline", big):
                result = await _run(
                    h, shell, "cat", stdin=data, allow_shell_syntax=False, timeout_s=20.0
                )
                assert not result.timed_out, f"cat with stdin={data is None and 'None'} hung"
                assert result.exit_code == 0, f"cat failed: {result!r}"
                assert result.stdout == (data or ""), (
                    f"stdin of {len(data or '')} chars came back as {len(result.stdout)} chars"
                    f" (first difference near {_first_diff(result.stdout, data or '')})"
                )
            with pytest.raises(OperationError) as lone:
                await _run(h, shell, "cat", stdin="a\ud800b", allow_shell_syntax=False)
            assert lone.value.code == "invalid_argument", (
                f"stdin with a lone surrogate refused with code {lone.value.code!r}"
            )
            huge = "y" * (1 << 20)
            refused: str | None = None
            try:
                result = await _run(
                    h, shell, "wc -c", stdin=huge, allow_shell_syntax=False, timeout_s=20.0
                )
            except OperationError as exc:
                refused = exc.code
            if refused is not None:
                assert refused in ("invalid_argument", "too_large"), (
                    f"1 MiB of stdin refused with code {refused!r}"
                )
            else:
                assert result.stdout.split() == [str(1 << 20)], (
                    f"1 MiB of stdin arrived as {result.stdout.strip()!r} bytes; it must be "
                    "delivered whole or refused"
                )

    @rule(ENV_GIVEN, ENV_HOST)
    @pytest.mark.anyio
    async def test_shell_env_exact_and_host_env_absent(self, conformance: Harness) -> None:
        """Given variables arrive exactly; the host process's variables never do."""
        h = conformance
        h.require("shell")
        canary_name = f"CORRAL_HOST_CANARY_{secrets.token_hex(4).upper()}"
        canary_value = f"host-canary-{secrets.token_hex(8)}"
        os.environ[canary_name] = canary_value
        try:
            async with h.session("shell") as opened:
                shell = _shell(opened)
                env = {
                    "CORRAL_SPACES": "  two  spaces ",
                    "CORRAL_LINES": "line one\nline two\n",
                    "CORRAL_UNICODE": "日本 é \u202e",
                    "CORRAL_EMPTY": "",
                    "corral_lower": "Case",
                }
                listing = await _run(h, shell, "env", env=env, allow_shell_syntax=False)
                assert listing.exit_code == 0, f"env failed: {listing!r}"
                for name, value in env.items():
                    assert f"\n{name}={value}\n" in "\n" + listing.stdout, (
                        f"{name} did not reach the command with exactly its value {value!r}"
                    )
                assert canary_value not in listing.stdout, (
                    "a variable of the process hosting the provider reached the command"
                )
                assert canary_name not in listing.stdout, (
                    "a variable of the process hosting the provider reached the command"
                )
                bare = await _run(h, shell, "env", allow_shell_syntax=False)
                assert "CORRAL_SPACES" not in bare.stdout, (
                    "a variable given to an earlier command leaked into a later one"
                )
        finally:
            os.environ.pop(canary_name, None)

    @rule(ALLOWLIST)
    @pytest.mark.anyio
    async def test_shell_enforces_allowed_commands(self, conformance: Harness) -> None:
        """The shell itself refuses programs outside ``allowed_commands``, anywhere in a line."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            allowed = frozenset({"echo", "cat"})
            ok = await _run(h, shell, "echo hi", allowed_commands=allowed, allow_shell_syntax=False)
            assert ok.stdout == "hi\n", f"an allowed command did not run: {ok!r}"
            piped = await _run(h, shell, "echo hi | cat", allowed_commands=allowed)
            assert piped.stdout == "hi\n", f"an allowed pipeline did not run: {piped!r}"
            await _denied(h, shell, "touch m0", allowed_commands=allowed, allow_shell_syntax=False)
            for idx, line in enumerate(
                (
                    "touch m{i}",
                    "echo a | touch m{i}",
                    "echo a && touch m{i}",
                    "echo a || touch m{i}; touch m{i}",
                    "echo a; touch m{i}",
                    "cat /dev/null\ntouch m{i}",
                    "echo $(touch m{i})",
                ),
                start=1,
            ):
                await _denied(h, shell, line.format(i=idx), allowed_commands=allowed)
            names = await _names(h, shell)
            ran = sorted(n for n in names if n.startswith("m") and n[1:].isdigit())
            assert not ran, f"refused commands ran anyway and created {ran}"

    @rule(SYNTAX)
    @pytest.mark.anyio
    async def test_shell_refuses_syntax_when_not_allowed(self, conformance: Harness) -> None:
        """Without ``allow_shell_syntax``, pipes, lists, redirections and globs are refused."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            for idx, line in enumerate(
                (
                    "echo a; touch s{i}",
                    "echo a && touch s{i}",
                    "echo a | touch s{i}",
                    "echo a > s{i}",
                    "touch s{i} &",
                    "echo $(touch s{i})",
                    "echo `touch s{i}`",
                    "touch s{i}*",
                )
            ):
                await _denied(h, shell, line.format(i=idx), allow_shell_syntax=False)
            names = await _names(h, shell)
            ran = sorted(n for n in names if n.startswith("s") and n[1:2].isdigit())
            assert not ran, f"refused shell syntax ran anyway and created {ran}"
            plain = await _run(h, shell, "echo 'a;b' \"c|d\"", allow_shell_syntax=False)
            assert plain.stdout == "a;b c|d\n", f"quoted arguments were mangled: {plain!r}"

    @rule(DURATION)
    @pytest.mark.anyio
    async def test_shell_duration(self, conformance: Harness) -> None:
        """``duration_ms`` is a plausible wall time: never negative, at least the sleep."""
        h = conformance
        h.require("shell")
        async with h.session("shell") as opened:
            shell = _shell(opened)
            quick = await _run(h, shell, "true", allow_shell_syntax=False)
            assert math.isfinite(quick.duration_ms), f"duration_ms is {quick.duration_ms!r}"
            assert quick.duration_ms >= 0, f"duration_ms is {quick.duration_ms!r}"
            slow = await _run(h, shell, "sleep 0.3", allow_shell_syntax=False)
            assert slow.duration_ms >= 290, (
                f"sleep 0.3 reported duration_ms={slow.duration_ms!r}; expected milliseconds"
            )


def _first_diff(a: str, b: str) -> int:
    for idx, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return idx
    return min(len(a), len(b))
