"""One fs suite, two modes: the bind-mounted host directory and the in-container volume.

Every operation runs against the docker workspace and against posix-core's
TmpdirFileSystem on a plain directory (the reference); results and error
codes must agree.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

import corral
import corral.provider
from corral_docker import DockerProvider
from corral_posix import TmpdirFileSystem

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

_RE = corral.get_regex_engine()


def _grep(
    pattern: str, **kw: Any
) -> tuple[str, corral.provider.Matcher, corral.provider.GrepOptions]:
    return ("grep", _RE.compile(pattern), corral.provider.GrepOptions(**kw))


OPS: list[tuple[Any, ...]] = [
    ("write_file", "/a.txt", b"hello\nworld\n"),
    ("read_file", "/a.txt"),
    ("write_file", "/d1/d2/b.txt", b"bee\n"),
    ("write_file", "/d1/c.py", b"print('hello')\n"),
    ("read_file", "/d1/d2/b.txt"),
    ("read_file", "/missing"),
    ("read_file", "/d1"),
    ("read_file", "/"),
    ("read_file", "/../etc/passwd"),
    ("write_file", "/d1", b"x"),
    ("write_file", "/a.txt/x", b"x"),
    ("write_file", "/", b"x"),
    ("edit_file", "/a.txt", "world", "there", False),
    ("read_file", "/a.txt"),
    ("edit_file", "/a.txt", "absent", "x", False),
    ("edit_file", "/a.txt", "", "x", False),
    ("write_file", "/dup.txt", b"aa aa aa"),
    ("edit_file", "/dup.txt", "aa", "b", False),
    ("edit_file", "/dup.txt", "aa", "b", True),
    ("read_file", "/dup.txt"),
    ("write_file", "/name with spaces & $dollar.txt", b"odd\n"),
    ("write_file", "/-dash.txt", b"dash\n"),
    ("read_file", "/-dash.txt"),
    ("ls", "/"),
    ("ls", "/d1"),
    ("ls", "/a.txt"),
    ("ls", "/nope"),
    ("glob", "**/*.txt", "/"),
    ("glob", "*.txt", "/"),
    ("glob", "d1/*", "/"),
    ("glob", "*", "/d1"),
    ("glob", "*.py", "/d1/c.py"),
    ("write_file", "/bin.dat", b"\x00\x01\x02hello"),
    _grep("hello"),
    _grep("HELLO", ignore_case=True, glob="*.py"),
    _grep("e", path="/d1", glob="d2/*.txt"),
    _grep("[a-z]", max_results=2),
    _grep("hello", path="/a.txt"),
    _grep("x", path="/nope"),
    ("stat", "/a.txt"),
    ("stat", "/d1"),
    ("stat", "/"),
    ("stat", "/nope"),
    ("mkdir", "/d1", False),
    ("mkdir", "/d1", True),
    ("mkdir", "/x/y", False),
    ("mkdir", "/x/y", True),
    ("mkdir", "/a.txt", True),
    ("mkdir", "/a.txt/z", True),
    ("ls", "/x"),
    ("rm", "/d1", False),
    ("rm", "/x/y", False),
    ("rm", "/nope", False),
    ("rm", "/", True),
    ("rm", "/d1", True),
    ("rm", "/a.txt", False),
    ("ls", "/"),
    ("symlink", "/etc", "/link"),
    ("symlink", "/workspace/x", "/inner"),
    ("stat", "/link"),
    ("read_file", "/link/passwd"),
    ("write_file", "/link/evil", b"x"),
    ("read_file", "/link"),
    ("ls", "/link"),
    ("glob", "**", "/"),
    ("rm", "/link", False),
    ("ls", "/"),
]


def _norm(value: Any) -> Any:
    if isinstance(value, corral.FileStat):
        return ("stat", value.path, value.type, value.size)
    if isinstance(value, corral.GrepResult):
        return attr_tuple(value)
    if isinstance(value, list | tuple):
        return [_norm(v) for v in value]
    return value


def attr_tuple(result: corral.GrepResult) -> tuple[Any, ...]:
    return (
        [(m.path, m.line_number, m.line) for m in result.matches],
        list(result.skipped_paths),
        list(result.skipped_binary_paths),
        result.truncated,
    )


async def _apply(fs: Any, op: tuple[Any, ...], symlink: Any) -> Any:
    name, *args = op
    try:
        if name == "symlink":
            await symlink(*args)
            return None
        if name == "grep":
            return _norm(await fs.grep(args[0], args[1]))
        if name in ("mkdir", "rm"):
            kw = {"parents": args[1]} if name == "mkdir" else {"recursive": args[1]}
            return await getattr(fs, name)(args[0], **kw)
        if name == "edit_file":
            return await fs.edit_file(*args[:3], replace_all=args[3])
        return _norm(await getattr(fs, name)(*args))
    except corral.OperationError as exc:
        return ("error", exc.code)


@pytest.fixture(params=["local", pytest.param("remote", marks=[pytest.mark.ssh, pytest.mark.slow])])
async def docker_ws(
    request: pytest.FixtureRequest,
    docker_ready: None,
    image: str,
    tmp_root: str,
    anyio_backend: str,
) -> AsyncIterator[corral.provider.Workspace]:
    base_url = None
    if request.param == "remote":
        if anyio_backend != "asyncio":
            # Every engine call runs in a worker thread, so the event loop adds
            # nothing here; one backend keeps the ssh suite's wall time sane
            # (each remote call costs a `docker system dial-stdio` spawn).
            pytest.skip("remote mode runs on one anyio backend (asyncio) to save wall time")
        base_url = request.getfixturevalue("ssh_ready")
    provider = DockerProvider(image=image, tmpdir_root=tmp_root, base_url=base_url)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("fs"))
    try:
        yield opened.workspace
    finally:
        await opened.workspace.close()
        await provider.aclose()


async def test_fs_matches_the_reference(
    docker_ws: corral.provider.Workspace, tmp_path: pathlib.Path
) -> None:
    ref_root = tmp_path / "ref"
    ref_root.mkdir()
    reference = TmpdirFileSystem(str(ref_root))
    assert docker_ws.shell is not None
    assert docker_ws.fs is not None
    shell = docker_ws.shell

    async def ref_symlink(target: str, link: str) -> None:
        target = str(ref_root) + target.removeprefix("/workspace")
        os.symlink(target, str(ref_root) + link)

    async def ws_symlink(target: str, link: str) -> None:
        result = await shell.run(corral.provider.CommandRequest(f"ln -s {target} /workspace{link}"))
        assert result.exit_code == 0, result.stderr

    mismatches = []
    for op in OPS:
        want = await _apply(reference, op, ref_symlink)
        got = await _apply(docker_ws.fs, op, ws_symlink)
        if op[0] == "stat" and isinstance(want, tuple) and want[0] == "stat" and want[2] == "dir":
            got = got[:3] if isinstance(got, tuple) else got
            want = want[:3]
        if want != got:
            mismatches.append((op[:2], want, got))
    reference.close()
    assert not mismatches, repr(mismatches)


async def test_files_written_in_the_container_are_visible_and_not_root_owned(
    docker_ws: corral.provider.Workspace,
) -> None:
    assert docker_ws.shell is not None
    assert docker_ws.fs is not None
    result = await docker_ws.shell.run(
        corral.provider.CommandRequest(
            "mkdir -p sub && echo made > sub/f.txt", allow_shell_syntax=True
        )
    )
    assert result.exit_code == 0, result.stderr
    assert await docker_ws.fs.read_file("/sub/f.txt") == b"made\n"
    await docker_ws.fs.write_file("/sub/f.txt", b"host\n")
    again = await docker_ws.shell.run(
        corral.provider.CommandRequest(
            "echo more >> sub/f.txt && cat sub/f.txt", allow_shell_syntax=True
        )
    )
    assert again.stdout == "host\nmore\n"
    root = corral.provider.describe_workspace(docker_ws)["root"]
    if root is not None:
        st = os.stat(os.path.join(root, "sub", "f.txt"))
        assert st.st_uid != 0
        assert st.st_gid != 0
