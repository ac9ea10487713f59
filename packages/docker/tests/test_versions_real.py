"""Docker's versions against the real engine: in place under the live bind mount,
owned by the container user, and no command writing while a restore runs."""

from __future__ import annotations

import os
import pathlib
from collections.abc import AsyncIterator

import anyio
import pytest

import corral
import corral.provider
from corral_docker import DockerProvider

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


@pytest.fixture
async def opened(
    docker_ready: None, image: str, tmp_root: str
) -> AsyncIterator[tuple[DockerProvider, corral.provider.OpenedWorkspace]]:
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    got = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("versions"))
    try:
        yield provider, got
    finally:
        await got.workspace.close()
        await provider.aclose()


async def sh(ws: corral.provider.Workspace, command: str, **kw: float) -> corral.ExecResult:
    assert ws.shell is not None
    return await ws.shell.run(
        corral.provider.CommandRequest(command, allow_shell_syntax=True, **kw)
    )  # type: ignore[arg-type]


async def test_restore_in_place_keeps_the_container_and_its_user(
    opened: tuple[DockerProvider, corral.provider.OpenedWorkspace],
) -> None:
    provider, got = opened
    ws = got.workspace
    snap = ws.snapshot
    assert isinstance(snap, corral.provider.Versions)
    details = corral.provider.describe_workspace(ws)
    root = pathlib.Path(details["root"])
    made = await sh(ws, "mkdir -p src/pkg && echo v1 > src/pkg/a.txt && ln -s a.txt src/pkg/l")
    assert made.exit_code == 0, made.stderr
    v1 = await snap.snapshot("v1")
    changed = await sh(ws, "echo v2 > src/pkg/a.txt && rm -r src/pkg && echo new > extra.txt")
    assert changed.exit_code == 0, changed.stderr
    await snap.restore(v1.snapshot_id)
    # The same container saw it all happen through the bind mount.
    assert corral.provider.describe_workspace(ws)["container_id"] == details["container_id"]
    seen = await sh(ws, "cat src/pkg/a.txt; readlink src/pkg/l; ls")
    assert seen.stdout == "v1\na.txt\nsrc\n"
    # Recreated entries belong to the container user, who can change them again.
    uid, gid = got.ref.payload["options"]["user"].split(":")
    for rel in ("src", "src/pkg", "src/pkg/a.txt", "src/pkg/l"):
        st = os.lstat(root / rel)
        assert (st.st_uid, st.st_gid) == (int(uid), int(gid)), rel
    again = await sh(ws, "echo v3 > src/pkg/a.txt && mkdir src/pkg/sub && rm src/pkg/l")
    assert again.exit_code == 0, again.stderr
    # The root keeps the shared-group mode that lets the container user write it.
    assert os.stat(root).st_mode & 0o7777 == 0o2770 if os.geteuid() == 0 else True
    assert [c.path for c in await snap.diff(v1.snapshot_id)] == [
        "/src/pkg/a.txt",
        "/src/pkg/l",
        "/src/pkg/sub",
    ]
    branch = await provider.resolve(await snap.branch(v1.snapshot_id))
    try:
        got_branch = await sh(branch, "cat src/pkg/a.txt && echo b > src/pkg/a.txt")
        assert got_branch.stdout == "v1\n", got_branch.stderr
    finally:
        await branch.close()
    assert await snap.read_file_at(v1.snapshot_id, "/src/pkg/a.txt") == b"v1\n"


async def test_a_command_writing_during_a_restore_is_stopped(
    opened: tuple[DockerProvider, corral.provider.OpenedWorkspace],
) -> None:
    _provider, got = opened
    ws = got.workspace
    snap = ws.snapshot
    assert snap is not None
    assert ws.fs is not None
    await ws.fs.write_file("/keep.txt", b"keep\n")
    v1 = await snap.snapshot()
    results: list[corral.ExecResult] = []

    async def writer() -> None:
        # Backgrounded too: the kill must reach what the command left behind.
        results.append(
            await sh(
                ws,
                "(while :; do echo x >> bg.txt; sleep 0.02; done) & "
                "while :; do echo x >> fg.txt; sleep 0.02; done",
                timeout_s=120,
            )
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer)
        with anyio.fail_after(60):
            while not [e for e in await ws.fs.ls("/") if e.name == "bg.txt"]:
                await anyio.sleep(0.05)
        await snap.restore(v1.snapshot_id)
    (result,) = results
    assert result.exit_code is None  # killed, not timed out
    assert not result.timed_out
    await anyio.sleep(0.3)
    assert sorted(e.name for e in await ws.fs.ls("/")) == ["keep.txt"]
    # Commands run normally after the restore.
    assert (await sh(ws, "cat keep.txt")).stdout == "keep\n"
