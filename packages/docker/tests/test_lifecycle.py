"""Crash, resume and gc against the real engine: no orphan containers survive."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

import corral
import corral.provider
from corral_docker import LABEL_WORKSPACE, DockerProvider, SdkEngine, collect_garbage

_CHILD = textwrap.dedent(
    """
    import sys, time, anyio, corral
    from corral_docker import DockerProvider

    async def main():
        provider = DockerProvider(image=sys.argv[1], tmpdir_root=sys.argv[2])
        opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("crash"))
        await opened.workspace.fs.write_file("/survivor.txt", b"still here")
        print(corral.ref_to_json(opened.ref), flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


def _crashed_workspace(image: str, tmp_root: str) -> corral.WorkspaceRef:
    """Open a workspace in a child process, then SIGKILL the child."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, image, tmp_root],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else ""
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    return corral.ref_from_json(line)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.anyio
async def test_crash_then_resolve_leaves_exactly_one_container(
    docker_ready: None, image: str, tmp_root: str, docker_ps: Callable[[str], list[str]]
) -> None:
    ref = _crashed_workspace(image, tmp_root)
    label = f"{LABEL_WORKSPACE}={ref.payload['workspace']}"
    (orphan,) = docker_ps(label)

    engine = SdkEngine()
    dry = await collect_garbage(engine, dry_run=True)
    assert any(reason == "owner process died" for _n, reason in dry.removed)
    assert docker_ps(label) == [orphan]  # a dry run removes nothing

    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    ws = await provider.resolve(ref)
    try:
        (current,) = docker_ps(label)
        assert not corral.provider.describe_workspace(ws)["container_id"].startswith(orphan)
        assert current != orphan
        assert ws.fs is not None
        assert ws.shell is not None
        assert await ws.fs.read_file("/survivor.txt") == b"still here"
        result = await ws.shell.run(corral.provider.CommandRequest("cat survivor.txt"))
        assert result.stdout == "still here"
        # gc keeps the container of a live owner.
        await collect_garbage(engine)
        assert docker_ps(label) == [current]
    finally:
        await ws.close()
        await provider.aclose()
    assert docker_ps(label) == []
    await engine.aclose()


@pytest.mark.docker
@pytest.mark.slow
def test_gc_command_removes_the_orphans_of_a_crash(
    docker_ready: None, image: str, tmp_root: str, docker_ps: Callable[[str], list[str]]
) -> None:
    ref = _crashed_workspace(image, tmp_root)
    label = f"{LABEL_WORKSPACE}={ref.payload['workspace']}"
    assert len(docker_ps(label)) == 1
    command = corral.load_plugins().commands["docker"]
    parser = argparse.ArgumentParser()
    command.configure(parser)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert command.run(parser.parse_args(["gc", "--dry-run"])) == 0
    assert "would remove" in out.getvalue()
    assert len(docker_ps(label)) == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert command.run(parser.parse_args(["gc"])) == 0
    assert "owner process died" in out.getvalue()
    assert docker_ps(label) == []
    # The directory survives a crash: a later resolve can still adopt it.
    root = os.path.join(ref.payload["base_dir"], ref.payload["workspace"])
    assert os.path.isfile(os.path.join(root, "survivor.txt"))


def test_gc_reports_an_unreachable_daemon() -> None:
    command = corral.load_plugins().commands["docker"]
    parser = argparse.ArgumentParser()
    command.configure(parser)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = command.run(parser.parse_args(["gc", "--base-url", "unix:///nonexistent.sock"]))
    assert code == 1
    assert "cannot reach the Docker daemon" in out.getvalue()
