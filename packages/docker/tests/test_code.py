"""The ``code`` module in the container: the conformance rules, plots, bombs and boundaries.

Everything here runs on the real engine with the code image ci-setup.sh
builds (``corral-python:bookworm``: python3, matplotlib, numpy, node);
``CORRAL_REQUIRE_DOCKER=1`` turns a missing engine or image into a failure.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator

import anyio
import pytest

import corral
import corral.provider
from corral.provider import OperationError
from corral_conformance import check_provider
from corral_docker import DockerProvider

pytestmark = [pytest.mark.docker]

_CODE_RULES = {
    "code_state_is_kept_within_a_context",
    "code_contexts_share_nothing",
    "code_run_code_starts_fresh",
    "code_errors_carry_name_value_traceback",
    "code_result_and_streams",
    "code_timeout_interrupts_and_keeps_state",
    "code_ignored_interrupt_is_reported_lost",
    "code_dead_context_is_lost_not_replaced",
    "code_one_cell_per_context",
    "code_languages_are_real",
    "code_unknown_context_is_not_found",
}


@pytest.fixture
async def opened(
    python_image: str, tmp_root: str
) -> AsyncIterator[corral.provider.OpenedWorkspace]:
    provider = DockerProvider(image=python_image, pull=False, tmpdir_root=tmp_root)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("code"))
    try:
        yield opened
    finally:
        await opened.workspace.close()
        await provider.aclose()


def _code(opened: corral.provider.OpenedWorkspace) -> corral.provider.CodeContexts:
    code = opened.workspace.code
    assert isinstance(code, corral.provider.CodeContexts)
    return code


PythonContext = tuple[corral.provider.CodeContexts, str]


@pytest.fixture
async def python_context(opened: corral.provider.OpenedWorkspace) -> PythonContext:
    """The workspace's code module and a fresh python context in it."""
    code = _code(opened)
    return code, await code.create_context("python")


async def _sh(opened: corral.provider.OpenedWorkspace, command: str) -> corral.ExecResult:
    shell = opened.workspace.shell
    assert shell is not None
    return await shell.run(corral.provider.CommandRequest(command, allow_shell_syntax=True))


def _container(opened: corral.provider.OpenedWorkspace) -> str:
    return str(corral.provider.describe_workspace(opened.workspace)["container_id"])


def test_code_rules_pass_in_the_container(python_image: str, tmp_root: str) -> None:
    report = check_provider(
        lambda: DockerProvider(image=python_image, pull=False, tmpdir_root=tmp_root),
        rules=("code",),
        shrink=False,
        max_examples=3,
    )
    assert report.ok, {r.rule: r.reason for r in report.failed}
    ran = {r.rule for r in report.results if r.status == "pass"}
    assert ran >= _CODE_RULES, sorted(_CODE_RULES - ran)


@pytest.mark.anyio
async def test_languages_are_probed_from_the_image(
    opened: corral.provider.OpenedWorkspace,
) -> None:
    code = _code(opened)
    assert code.languages == {"python", "bash", "javascript"}
    details = corral.provider.describe_workspace(opened.workspace)
    assert details["code_languages"] == ["bash", "javascript", "python"]
    ctx = await code.create_context("javascript")
    result = await code.run_in_context(ctx, "6 * 7", timeout_s=30)
    assert result.result_json == "42", result
    shell = await code.create_context("bash")
    said = await code.run_in_context(shell, "cd /tmp && pwd", timeout_s=30)
    assert said.stdout == "/tmp\n", said
    assert (await code.run_in_context(shell, "pwd", timeout_s=30)).stdout == "/tmp\n"


@pytest.mark.anyio
async def test_an_image_without_python_says_what_is_missing(image: str, tmp_root: str) -> None:
    provider = DockerProvider(image=image, pull=False, tmpdir_root=tmp_root)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("busybox"))
    try:
        code = _code(opened)
        assert code.languages == frozenset()
        for attempt in (
            code.create_context("python"),
            code.run_code("python", "1", timeout_s=10),
        ):
            with pytest.raises(OperationError) as caught:
                await attempt
            assert caught.value.code == "invalid_argument"
            assert "python3" in caught.value.message, caught.value.message
        details = corral.provider.describe_workspace(opened.workspace)
        assert "python3" in details["code_unavailable"]
    finally:
        await opened.workspace.close()
        await provider.aclose()


@pytest.mark.anyio
async def test_a_matplotlib_figure_comes_back_as_png(
    python_context: PythonContext,
) -> None:
    code, ctx = python_context
    cell = "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\n'drawn'"
    result = await code.run_in_context(ctx, cell, timeout_s=120)
    assert result.error is None, result.error
    pngs = [o.data["image/png"] for o in result.outputs if "image/png" in o.data]
    assert len(pngs) == 1, result.outputs
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
    assert result.result_json == '"drawn"'


@pytest.mark.anyio
async def test_contexts_run_in_the_workspace_as_the_shell_user(
    opened: corral.provider.OpenedWorkspace,
) -> None:
    code = _code(opened)
    assert opened.workspace.fs is not None
    await opened.workspace.fs.mkdir("/sub")
    ctx = await code.create_context("python", cwd="/sub")
    where = await code.run_in_context(
        ctx, "import os\n[os.getcwd(), os.getuid(), os.getgid()]", timeout_s=30
    )
    shell = await _sh(opened, "id -u; id -g")
    uid, gid = (int(x) for x in shell.stdout.split())
    assert json.loads(where.result_json or "null") == ["/workspace/sub", uid, gid]
    with pytest.raises(OperationError) as missing:
        await code.create_context("python", cwd="/nowhere")
    assert missing.value.code == "not_found"


# The image has no ps: count the sleepers from /proc.
_COUNT_SLEEPERS = (
    "for p in /proc/[0-9]*; do tr '\\000' ' ' < $p/cmdline 2>/dev/null; echo; done "
    "| grep -c '^sleep 4242' || true"
)


@pytest.mark.anyio
async def test_deleting_a_context_kills_what_it_started(
    opened: corral.provider.OpenedWorkspace, python_context: PythonContext
) -> None:
    code, ctx = python_context
    started = await code.run_in_context(
        ctx,
        "import subprocess\np = subprocess.Popen(['sleep', '4242'], start_new_session=True)\np.pid",
        timeout_s=30,
    )
    assert started.error is None, started.error
    before = await _sh(opened, _COUNT_SLEEPERS)
    assert before.stdout.strip() == "1", before
    await code.delete_context(ctx)
    after = await _sh(opened, _COUNT_SLEEPERS)
    assert after.stdout.strip() == "0", after
    assert await code.list_contexts() == []


@pytest.mark.anyio
async def test_a_memory_bomb_loses_the_context_not_the_workspace(
    opened: corral.provider.OpenedWorkspace, python_context: PythonContext
) -> None:
    code, ctx = python_context
    await code.run_in_context(ctx, "kept = 1", timeout_s=30)
    with anyio.fail_after(120):
        bomb = await code.run_in_context(ctx, "b = bytearray(2 << 30)\nlen(b)", timeout_s=60)
    if bomb.state == "kept":
        # The allocation was refused outright: an error, and the context lives on.
        assert bomb.error is not None, bomb
        assert bomb.error.name == "MemoryError", bomb
        assert (await code.run_in_context(ctx, "kept", timeout_s=30)).result_json == "1"
    else:
        assert bomb.state == "lost", bomb
        assert bomb.error is not None, bomb
        assert "SIGKILL" in bomb.error.value, bomb.error
        with pytest.raises(OperationError) as lost:
            await code.run_in_context(ctx, "kept", timeout_s=30)
        assert lost.value.code == "lost"
    # The container (and its shell) is unharmed.
    assert (await _sh(opened, "echo fine")).stdout == "fine\n"


@pytest.mark.anyio
async def test_a_fork_bomb_is_bounded_by_the_pids_limit(
    opened: corral.provider.OpenedWorkspace, python_context: PythonContext
) -> None:
    code, ctx = python_context
    bomb = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.05)\n"
    )
    began = time.monotonic()
    with anyio.fail_after(60):
        result = await code.run_in_context(ctx, bomb, timeout_s=3)
    assert result.timed_out, result
    assert time.monotonic() - began < 45
    pids = subprocess.run(
        ["docker", "stats", "--no-stream", "--format", "{{.PIDs}}", _container(opened)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert 0 < int(pids.stdout.strip()) <= 256, pids.stdout
    with anyio.fail_after(60):
        await code.delete_context(ctx)


@pytest.mark.anyio
async def test_another_workspaces_files_cannot_be_read(
    opened: corral.provider.OpenedWorkspace, python_image: str, tmp_root: str
) -> None:
    provider = DockerProvider(image=python_image, pull=False, tmpdir_root=tmp_root)
    other = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("victim"))
    try:
        assert other.workspace.fs is not None
        await other.workspace.fs.write_file("/secret.txt", b"the-other-secret")
        victim_root = corral.provider.describe_workspace(other.workspace)["root"]
        probe = textwrap.dedent(
            f"""
            import glob, os
            found = []
            for path in [{victim_root!r} + "/secret.txt", *glob.glob("/proc/*/root/workspace/*")]:
                try:
                    with open(path, "rb") as fh:
                        if b"the-other-secret" in fh.read():
                            found.append(path)
                except OSError:
                    pass
            for top, _dirs, files in os.walk("/", onerror=None):
                if top.startswith(("/proc", "/sys")):
                    continue
                if "secret.txt" in files:
                    found.append(os.path.join(top, "secret.txt"))
            found
            """
        )
        result = await _code(opened).run_code("python", probe, timeout_s=120)
        assert result.error is None, result.error
        assert json.loads(result.result_json or "null") == []
    finally:
        await other.workspace.close()
        await provider.aclose()


_CHILD = textwrap.dedent(
    """
    import sys, anyio, corral
    from corral_docker import DockerProvider

    async def main():
        provider = DockerProvider(image=sys.argv[1], pull=False, tmpdir_root=sys.argv[2])
        opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("crash"))
        ctx = await opened.workspace.code.create_context("python")
        await opened.workspace.code.run_in_context(ctx, "x = 1", timeout_s=30)
        print(corral.ref_to_json(opened.ref), ctx, flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


@pytest.mark.anyio
async def test_resolve_after_a_crash_reports_the_contexts_lost(
    python_image: str, tmp_root: str
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, python_image, tmp_root],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = await anyio.to_thread.run_sync(child.stdout.readline)
        assert line, child.stderr.read() if child.stderr else ""
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    raw, ctx = line.rsplit(" ", 1)
    ctx = ctx.strip()
    provider = DockerProvider(image=python_image, pull=False, tmpdir_root=tmp_root)
    ws = await provider.resolve(corral.ref_from_json(raw))
    try:
        code = ws.code
        assert isinstance(code, corral.provider.CodeContexts)
        [info] = await code.list_contexts()
        assert (info.context_id, info.status) == (ctx, "lost")
        assert info.lost_reason is not None
        assert "ended with the container" in info.lost_reason
        with pytest.raises(OperationError) as caught:
            await code.run_in_context(ctx, "x", timeout_s=10)
        assert caught.value.code == "lost"
        await code.delete_context(ctx)
        fresh = await code.create_context("python")
        assert (await code.run_in_context(fresh, "1+1", timeout_s=30)).result_json == "2"
    finally:
        await ws.close()
        await provider.aclose()


@pytest.mark.anyio
async def test_a_cell_that_corrupts_its_channel_loses_the_context(
    python_context: PythonContext,
) -> None:
    code, ctx = python_context
    garbage = (
        "import gc, os\n"
        "[ch] = [o for o in gc.get_objects() if type(o).__name__ == '_Channel']\n"
        "os.write(ch.write_fd, (5).to_bytes(4, 'big') + b'{bad}')\n"
        "import time; time.sleep(5)"
    )
    result = await code.run_in_context(ctx, garbage, timeout_s=30)
    assert result.state == "lost", result
    assert result.error is not None
    assert "corrupted" in result.error.value
    [info] = await code.list_contexts()
    assert info.status == "lost"


@pytest.mark.anyio
async def test_a_second_handle_leaves_the_first_ones_contexts_alone(
    python_image: str, tmp_root: str
) -> None:
    provider = DockerProvider(image=python_image, pull=False, tmpdir_root=tmp_root)
    first = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("twice"))
    try:
        code = _code(first)
        ctx = await code.create_context("python")
        await code.run_in_context(ctx, "x = 7", timeout_s=30)
        second = await provider.resolve(first.ref)
        try:
            other = second.code
            assert isinstance(other, corral.provider.CodeContexts)
            [info] = await other.list_contexts()
            assert (info.context_id, info.status) == (ctx, "lost")
            assert info.lost_reason is not None
            assert "another open handle" in info.lost_reason
            # The first handle's interpreter was neither replaced nor killed.
            assert (await code.run_in_context(ctx, "x", timeout_s=30)).result_json == "7"
        finally:
            await second.close()
    finally:
        await first.workspace.close()
        await provider.aclose()
