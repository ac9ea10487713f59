"""Attached exec streams on the real engine: stdin of any size and bytes, streamed output.

The contract (``CommandRequest.stdin``): delivered exactly, as the bytes the
str stands for (lone surrogates are the bytes they escape, as on the POSIX
providers). Before attached streams docker carried stdin in an environment
variable: 64 KiB at most, NUL came back as exit 126, non-UTF-8 raised.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import anyio
import pytest

import corral
import corral.provider
from corral_docker import DockerProvider
from corral_docker._shell import DockerShell

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


@pytest.fixture(params=["local", "ssh"])
async def shell(
    request: pytest.FixtureRequest, docker_ready: None, image: str, tmp_root: str
) -> AsyncIterator[DockerShell]:
    if request.param == "ssh":
        if request.getfixturevalue("anyio_backend") != "asyncio":
            pytest.skip("the ssh transport runs on one anyio backend (asyncio) to save wall time")
        provider = DockerProvider(
            image=image, tmpdir_root=tmp_root, base_url=request.getfixturevalue("ssh_ready")
        )
    else:
        provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("attach"))
    try:
        assert isinstance(opened.workspace.shell, DockerShell)
        yield opened.workspace.shell
    finally:
        await opened.workspace.close()
        await provider.aclose()


def _req(command: str, **kw: object) -> corral.provider.CommandRequest:
    return corral.provider.CommandRequest(command, allow_shell_syntax=True, **kw)  # type: ignore[arg-type]


async def test_fifty_mib_of_binary_stdin_arrives_exactly(shell: DockerShell) -> None:
    data = (bytes(range(256)) * 4096 * 50)[: 50 << 20]
    text = data.decode("utf-8", "surrogateescape")
    result = await shell.run(_req("sha256sum", stdin=text, timeout_s=120))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split()[0] == hashlib.sha256(data).hexdigest()


_ODD_BYTES = (
    b"",
    b"\0",
    b"a\0b\0",
    b"\xff\xfe\x80 invalid utf-8",
    "h\u00e9llo \u2713\n".encode(),
    b"\r\n\x1b[A",
)


async def test_arbitrary_bytes_round_trip(shell: DockerShell) -> None:
    for data in _ODD_BYTES:
        text = data.decode("utf-8", "surrogateescape")
        result = await shell.run(_req("od -An -v -tx1 | tr -d ' \\n'", stdin=text))
        assert result.exit_code == 0, result.stderr
        assert result.stdout == data.hex(), data


async def test_stdin_that_stands_for_no_bytes_is_refused(shell: DockerShell) -> None:
    with pytest.raises(corral.OperationError) as bad:
        await shell.run(_req("cat", stdin="a\ud800b"))  # a surrogate, not an escaped byte
    assert bad.value.code == "invalid_argument"
    assert "\ud800" not in bad.value.message


async def test_no_stdin_reads_eof(shell: DockerShell) -> None:
    result = await shell.run(_req("cat; echo end"))
    assert (result.exit_code, result.stdout) == (0, "end\n")


async def test_output_streams_before_the_command_ends(shell: DockerShell) -> None:
    # The command cannot end before the test lets it: it waits for a file the
    # test creates only after it has seen the first output.
    seen: list[tuple[str, bytes]] = []
    first_seen = anyio.Event()
    results: list[corral.ExecResult] = []

    def on_output(name: str, data: bytes) -> None:
        seen.append((name, data))
        if b"first" in data:
            first_seen.set()

    async def run() -> None:
        results.append(
            await shell.run(
                _req(
                    "echo first; echo err >&2; "
                    "while [ ! -e /tmp/go ]; do sleep 0.05; done; echo last",
                    timeout_s=120,
                ),
                on_output=on_output,
            )
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(60):
            await first_seen.wait()
        assert not results  # still running: the output was streamed
        assert (await shell.run(_req("touch /tmp/go"))).exit_code == 0
    (result,) = results
    assert result.exit_code == 0
    assert result.stdout == "first\nlast\n"
    assert result.stderr == "err\n"
    assert b"".join(d for n, d in seen if n == "stdout") == b"first\nlast\n"


async def test_timeout_with_unread_stdin_kills_and_returns(shell: DockerShell) -> None:
    # The command never reads: the feeder blocks on a full pipe until the kill.
    result = await shell.run(_req("sleep 300", stdin="x" * (8 << 20), timeout_s=2))
    assert result.timed_out
    left = await shell.run(_req("ps -o args"))
    assert "sleep 300" not in left.stdout


async def test_command_that_ignores_stdin_still_reports(shell: DockerShell) -> None:
    result = await shell.run(_req("echo done; exit 4", stdin="y" * (4 << 20)))
    assert (result.exit_code, result.stdout) == (4, "done\n")


async def test_exit_codes_and_signals_keep_their_meaning(shell: DockerShell) -> None:
    missing = await shell.run(corral.provider.CommandRequest("no-such-program-x"))
    assert missing.exit_code == 127
    killed = await shell.run(_req("kill -TERM $$", stdin="z"))
    assert (killed.exit_code, killed.signal) == (None, 15)
    capped = await shell.run(_req("head -c 5000 /dev/zero", max_output_bytes=100, stdin=""))
    assert capped.stdout_truncated
    assert len(capped.stdout) == 100


async def test_cancelled_caller_kills_the_command(shell: DockerShell) -> None:
    with anyio.move_on_after(1.5):
        await shell.run(_req("sleep 301 & setsid sleep 302 & sleep 303", stdin="q", timeout_s=60))
    left = await shell.run(_req("ps -o args"))
    assert "sleep 30" not in left.stdout, left.stdout
