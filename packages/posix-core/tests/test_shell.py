"""SubprocessShell with real subprocesses: I/O, cwd, env, limits, tree killing."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import attrs
import pytest

from corral.provider import CommandRequest, ExecResult, OperationError, Shell, WorkspaceEvictedError
from corral_posix import (
    IDENTITY_WRAPPER,
    CommandChecker,
    ProcessLimits,
    SubprocessShell,
    WrapContext,
    WrappedCommand,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def shell(tmp_path: Path) -> AsyncIterator[SubprocessShell]:
    sh = SubprocessShell(tmp_path)
    yield sh
    await sh.aclose()


async def run(sh: SubprocessShell, command: str, **kw: object) -> ExecResult:
    return await sh.run(CommandRequest(command, **kw))  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead but still has a pid until its parent reaps it.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or gone between open and read
        return False


async def test_is_a_corral_shell(shell: SubprocessShell) -> None:
    assert isinstance(shell, Shell)


async def test_exit_codes_and_streams(shell: SubprocessShell) -> None:
    ok = await run(shell, "echo hello")
    assert (ok.exit_code, ok.stdout, ok.stderr, ok.signal, ok.timed_out) == (
        0,
        "hello\n",
        "",
        None,
        False,
    )
    assert ok.duration_ms > 0
    mixed = await run(shell, "echo out; echo err >&2; exit 3", allow_shell_syntax=True)
    assert (mixed.exit_code, mixed.stdout, mixed.stderr) == (3, "out\n", "err\n")
    assert (await run(shell, "false")).exit_code == 1


async def test_signal_reported(shell: SubprocessShell) -> None:
    result = await run(shell, "kill -TERM $$", allow_shell_syntax=True)
    assert (result.exit_code, result.signal) == (None, 15)


async def test_missing_program_is_127(shell: SubprocessShell) -> None:
    result = await run(shell, "no-such-program-xyz arg")
    assert result.exit_code == 127
    assert result.stderr == "no-such-program-xyz: command not found\n"


async def test_stdin_given_or_empty(shell: SubprocessShell) -> None:
    assert (await run(shell, "cat", stdin="piped\nin")).stdout == "piped\nin"
    assert (await run(shell, "cat")).stdout == ""
    big = "x" * 1_000_000
    assert len((await run(shell, "wc -c", stdin=big)).stdout.strip()) == 7


async def test_stdin_not_read_does_not_hang(shell: SubprocessShell) -> None:
    result = await run(shell, "true", stdin="y" * 5_000_000, timeout_s=10)
    assert result.exit_code == 0
    assert not result.timed_out


async def test_invalid_utf8_is_replaced(shell: SubprocessShell) -> None:
    result = await run(shell, r"printf 'a\377b'", allow_shell_syntax=True)
    assert result.stdout == "a\ufffdb"


async def test_cwd(shell: SubprocessShell, tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "inner").symlink_to("sub")
    assert (await run(shell, "pwd")).stdout.strip() == str(tmp_path)
    assert (await run(shell, "pwd", cwd="/sub/deeper")).stdout.strip() == str(
        tmp_path / "sub/deeper"
    )
    assert (await run(shell, "pwd -P", cwd="inner")).stdout.strip() == str(tmp_path / "sub")


@pytest.mark.parametrize(
    ("cwd", "code"),
    [
        ("..", "invalid_path"),
        ("/sub/../..", "invalid_path"),
        ("/out", "invalid_path"),
        ("/out_rel", "invalid_path"),
        ("/missing", "not_found"),
        ("/file", "not_a_directory"),
    ],
)
async def test_cwd_escapes_refused(
    shell: SubprocessShell, tmp_path: Path, cwd: str, code: str
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "out").symlink_to("/tmp")
    (tmp_path / "out_rel").symlink_to("../..")
    with pytest.raises(OperationError) as info:
        await run(shell, "pwd", cwd=cwd)
    assert info.value.code == code


async def test_environment_is_minimal_and_scrubbed(
    shell: SubprocessShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_FAKE_SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("INNOCENT_PARENT_VAR", "parent")
    result = await run(shell, "env", env={"FOO": "bar"})
    env = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert "hunter2" not in result.stdout
    assert "INNOCENT_PARENT_VAR" not in env
    assert env["HOME"] == str(tmp_path)
    assert env["LANG"] == "C.UTF-8"
    assert env["FOO"] == "bar"
    assert set(env) <= {"PATH", "HOME", "LANG", "TMPDIR", "FOO", "PWD", "SHLVL", "_"}
    assert all(p.startswith("/") for p in env["PATH"].split(":"))


async def test_a_command_sees_the_path_of_the_moment(
    shell: SubprocessShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start environment is reused between commands, and rebuilt when PATH changes."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "corral-probe-tool").write_text("#!/bin/sh\necho probe\n")
    (tools / "corral-probe-tool").chmod(0o755)
    assert (await run(shell, "corral-probe-tool")).exit_code == 127
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    assert (await run(shell, "corral-probe-tool")).stdout == "probe\n"


async def test_base_env_and_denied_request_env(tmp_path: Path) -> None:
    sh = SubprocessShell(tmp_path, base_env={"OPERATOR_SETTING": "1"})
    try:
        result = await run(sh, "printenv OPERATOR_SETTING")
        assert result.stdout == "1\n"
        with pytest.raises(OperationError) as info:
            await run(sh, "env", env={"LD_PRELOAD": "/evil.so"})
        assert info.value.code == "policy_denied"
        assert "/evil.so" not in info.value.message
    finally:
        await sh.aclose()


async def test_no_controlling_terminal(shell: SubprocessShell) -> None:
    tty = await run(shell, "tty")
    assert tty.exit_code == 1
    assert tty.stdout == "not a tty\n"
    devtty = await run(shell, "sh -c ': </dev/tty'")
    assert devtty.exit_code != 0
    sid = await run(shell, "sh -c 'echo $$; ps -o sid= -p $$'")
    pid, session = sid.stdout.split()
    assert pid == session  # the command leads its own session


async def test_timeout_kills_background_tree(shell: SubprocessShell) -> None:
    started = time.monotonic()
    result = await run(
        shell, "sleep 100 & echo $!; sleep 100", allow_shell_syntax=True, timeout_s=1
    )
    assert result.timed_out
    assert result.exit_code is None
    assert time.monotonic() - started < 10
    child = int(result.stdout.split()[0])
    assert not alive(child)


DAEMON = (
    "setsid sh -c 'sleep 300 & echo $! > daemon.pid; sleep 300' </dev/null >/dev/null 2>&1 & "
    "while [ ! -s daemon.pid ]; do sleep 0.01; done; cat daemon.pid"
)


async def test_setsid_double_forked_daemon_dies_when_command_returns(
    shell: SubprocessShell,
) -> None:
    result = await run(shell, DAEMON, allow_shell_syntax=True, timeout_s=20)
    assert result.exit_code == 0
    assert not result.timed_out
    assert not alive(int(result.stdout))


async def test_setsid_daemon_dies_on_timeout(shell: SubprocessShell) -> None:
    result = await run(shell, DAEMON + "; sleep 100", allow_shell_syntax=True, timeout_s=2)
    assert result.timed_out
    assert not alive(int(result.stdout))


async def test_cancellation_kills_tree(shell: SubprocessShell, tmp_path: Path) -> None:
    with anyio.move_on_after(1.5) as scope:
        await run(shell, DAEMON + "; sleep 100", allow_shell_syntax=True, timeout_s=60)
    assert scope.cancelled_caught
    pid = int((tmp_path / "daemon.pid").read_text())
    assert not alive(pid)


async def test_output_flood_is_capped(shell: SubprocessShell) -> None:
    result = await run(shell, "yes", timeout_s=2, max_output_bytes=10_000)
    assert result.timed_out
    assert result.stdout_truncated
    assert not result.stderr_truncated
    body, marker = result.stdout.rsplit("\n[", 1)
    assert len(body) == 10_000
    assert set(body) == {"y", "\n"}
    assert marker == "... output truncated at 10000 bytes]"


async def test_large_output_that_ends_is_complete_or_marked(shell: SubprocessShell) -> None:
    result = await run(shell, "head -c 3000000 /dev/zero", max_output_bytes=4_000_000)
    assert len(result.stdout) == 3_000_000
    assert not result.stdout_truncated
    capped = await run(shell, "head -c 3000000 /dev/zero", max_output_bytes=100)
    assert capped.exit_code == 0
    assert capped.stdout_truncated
    assert capped.stdout == "\0" * 100 + "\n[... output truncated at 100 bytes]"


async def test_truncation_does_not_split_utf8(shell: SubprocessShell) -> None:
    result = await run(shell, "printf 'aé'", allow_shell_syntax=True, max_output_bytes=2)
    assert result.stdout == "a\n[... output truncated at 2 bytes]"


async def test_rlimits_applied(tmp_path: Path) -> None:
    sh = SubprocessShell(tmp_path, limits=ProcessLimits(open_files=64, file_size_bytes=4096))
    try:
        result = await run(sh, "sh -c 'ulimit -n; ulimit -c; ulimit -f'")
        assert result.stdout.split() == ["64", "0", "8"]  # -f is in 512-byte blocks
        big = await run(sh, "head -c 10000 /dev/zero", stdin=None, allow_shell_syntax=False)
        assert big.exit_code == 0
        wrote = await run(sh, "head -c 10000 /dev/zero > f", allow_shell_syntax=True)
        assert wrote.signal == 25 or wrote.exit_code != 0  # SIGXFSZ
    finally:
        await sh.aclose()
    with pytest.raises(ValueError, match="open_files must be at least 16"):
        ProcessLimits(open_files=3)


async def test_evicted_root(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    sh = SubprocessShell(root, provider_id="local-bash")
    shutil.rmtree(root)
    with pytest.raises(WorkspaceEvictedError) as info:
        await run(sh, "true")
    assert info.value.provider_id == "local-bash"


async def test_aclose_kills_running_and_refuses_later(tmp_path: Path) -> None:
    sh = SubprocessShell(tmp_path)
    results: list[ExecResult] = []

    async def runner() -> None:
        results.append(await run(sh, "sleep 100", timeout_s=60))

    async with anyio.create_task_group() as tg:
        tg.start_soon(runner)
        await anyio.sleep(0.5)
        await sh.aclose()
    assert results[0].signal == 9
    with pytest.raises(OperationError) as info:
        await run(sh, "true")
    assert info.value.code == "closed"


async def test_concurrent_runs(shell: SubprocessShell) -> None:
    outputs: dict[int, str] = {}

    async def one(i: int) -> None:
        outputs[i] = (await run(shell, f"echo {i}")).stdout

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i)
    assert outputs == {i: f"{i}\n" for i in range(8)}


async def test_policy_denied_before_launch(
    shell: SubprocessShell, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral.shell.audit")
    with pytest.raises(OperationError) as info:
        await run(shell, "curl example.com", allowed_commands={"ls"})
    assert info.value.message == "command 'curl' is not in the allowed commands"
    assert (await run(shell, "ls", allowed_commands={"ls"})).exit_code == 0
    events = [r.corral_audit["event"] for r in caplog.records]  # type: ignore[attr-defined]
    assert events == ["rejected", "accepted"]


@attrs.define
class RecordingWrapper:
    """Prefixes ``env -i MARK=1`` and records what it was given."""

    seen: list[tuple[tuple[str, ...], WrapContext]] = attrs.field(factory=list)

    def wrap(self, argv: Sequence[str], ctx: WrapContext) -> WrappedCommand:
        self.seen.append((tuple(argv), ctx))
        return WrappedCommand(argv=("env", "-i", "WRAPPED=1", *argv), env=dict(ctx.env))


async def test_custom_wrapper_runs_after_guards(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    wrapper = RecordingWrapper()
    sh = SubprocessShell(tmp_path, wrapper=wrapper, checker=CommandChecker())
    try:
        result = await run(sh, "env", cwd="/sub", env={"FOO": "1"})
        assert result.stdout == "WRAPPED=1\n"  # the wrapper's argv is what ran
        ((argv, ctx),) = wrapper.seen
        assert argv == ("env",)
        assert ctx.root == str(tmp_path)
        assert ctx.cwd == str(tmp_path / "sub")
        assert ctx.env["FOO"] == "1"
        assert ctx.env["HOME"] == str(tmp_path)
        with pytest.raises(OperationError):
            await run(sh, "env", env={"LD_PRELOAD": "x"})
        with pytest.raises(OperationError):
            await run(sh, "ls | cat")
        assert len(wrapper.seen) == 1  # refused commands never reach the wrapper
    finally:
        await sh.aclose()


async def test_wrapper_cwd_and_pass_fds(tmp_path: Path) -> None:
    r, w = os.pipe()
    os.write(w, b"from-fd")
    os.close(w)

    class FdWrapper:
        def wrap(self, argv: Sequence[str], ctx: WrapContext) -> WrappedCommand:
            return WrappedCommand(
                argv=("sh", "-c", f"pwd; cat /proc/self/fd/{r}"),
                env=ctx.env,
                pass_fds=(r,),
                cwd="/",
            )

    sh = SubprocessShell(tmp_path, wrapper=FdWrapper())
    try:
        result = await run(sh, "true")
        assert result.stdout == "/\nfrom-fd"
    finally:
        os.close(r)
        await sh.aclose()


def test_identity_wrapper() -> None:
    ctx = WrapContext(root="/r", cwd="/r/x", env={"A": "1"})
    wrapped = IDENTITY_WRAPPER.wrap(["ls", "-l"], ctx)
    assert wrapped == WrappedCommand(argv=("ls", "-l"), env={"A": "1"})
