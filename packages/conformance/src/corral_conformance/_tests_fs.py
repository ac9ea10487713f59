"""Rules 6 and 7: the file-system model and path containment."""

from __future__ import annotations

import functools
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import corral
from corral import GrepOptions, OperationError

from ._compare import Outcome, check_same, model_outcome
from ._fs_machine import run_fs_machine
from ._harness import Harness, dump_tree
from ._model import FsModel
from ._strategies import hostile_paths

__all__ = ["AbstractFsTests"]

_ENGINE = corral.RegexModuleEngine()


@attrs.frozen
class _Canary:
    """Things outside the workspace that must stay unread, unwritten and unlisted."""

    token: bytes
    names: frozenset[str]
    file: Path | None = None
    directory: Path | None = None

    def check_value(self, what: str, value: Any) -> None:
        text = repr(value)
        assert self.token.decode() not in text, (
            f"{what} returned content from outside the workspace"
        )
        for name in self.names:
            assert name not in text, f"{what} listed {name!r}, which lives outside the workspace"

    def check_untouched(self, inner: str) -> None:
        if self.file is not None:
            assert self.file.read_bytes() == self.token, "a file beside the workspace was modified"
        if self.directory is not None:
            assert sorted(os.listdir(self.directory)) == [inner], (
                "a directory beside the workspace was modified"
            )
            assert (self.directory / inner).read_bytes() == self.token, (
                "a file beside the workspace was modified"
            )


@contextmanager
def _host_canary(host: Path | None) -> Iterator[tuple[Path | None, Path | None, str]]:
    if host is None:
        yield None, None, ""
        return
    tag = secrets.token_hex(4)
    file = host.parent / f"corral-canary-{tag}.txt"
    directory = host.parent / f"corral-canary-{tag}"
    inner = f"inner-{secrets.token_hex(4)}"
    try:
        directory.mkdir()
        yield file, directory, inner
    finally:
        file.unlink(missing_ok=True)
        shutil.rmtree(directory, ignore_errors=True)


async def _attempt(h: Harness, fs: corral.FileSystem, op: str, path: str) -> Outcome:
    calls: dict[str, Any] = {
        "read_file": lambda: fs.read_file(path),
        "write_file": lambda: fs.write_file(path, b"written"),
        "edit_file": lambda: fs.edit_file(path, "e", "E", replace_all=True),
        "ls": lambda: fs.ls(path),
        "stat": lambda: fs.stat(path),
        "mkdir": lambda: fs.mkdir(path, parents=True),
        "rm": lambda: fs.rm(path, recursive=True),
        "glob": lambda: fs.glob("**", path),
        "grep": lambda: fs.grep(_ENGINE.compile("."), GrepOptions(path=path)),
    }
    try:
        return Outcome(value=await h.call(calls[op]))
    except OperationError as exc:
        return Outcome(error=exc)


_OPS = ("read_file", "write_file", "edit_file", "ls", "stat", "mkdir", "rm", "glob", "grep")


class AbstractFsTests:
    """Rules 6 and 7 for providers that advertise ``fs``."""

    @pytest.mark.anyio
    async def test_fs_basic_semantics(self, conformance: Harness) -> None:
        """Every documented error code, once, with a readable failure message."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as opened:
            fs = opened.workspace.fs
            assert fs is not None
            model = FsModel()
            steps: list[tuple[Any, ...]] = [
                ("write_file", ("/d/f.txt", b"one\ntwo a\n")),
                ("read_file", ("d/f.txt",)),
                ("read_file", ("d/f.txt",), {"max_bytes": 10}),
                ("read_file", ("d/f.txt",), {"max_bytes": 9}),
                ("read_file", ("/missing",)),
                ("read_file", ("/d",)),
                ("write_file", ("/d", b"x")),
                ("write_file", ("/d/f.txt/x", b"x")),
                ("edit_file", ("/d/f.txt", "two", "TWO")),
                ("edit_file", ("/d/f.txt", "absent", "x")),
                ("edit_file", ("/d/f.txt", "", "x")),
                ("write_file", ("/d/g.txt", b"a a")),
                ("edit_file", ("/d/g.txt", "a", "b")),
                ("ls", ("/d",)),
                ("ls", ("/d/f.txt",)),
                ("stat", ("/d",)),
                ("stat", ("/d/g.txt",)),
                ("mkdir", ("/x/y",)),
                ("mkdir", ("/d",)),
                ("rm", ("/d",)),
                ("rm", ("/",)),
                ("rm", ("/nope",)),
                ("read_file", ("/../etc/passwd",)),
                ("glob", ("**/*.txt",)),
                ("rm", ("/d/g.txt",)),
                ("ls", ("/",)),
            ]
            for op, args, *rest in steps:
                kwargs: dict[str, Any] = rest[0] if rest else {}
                want = model_outcome(functools.partial(getattr(model, op), *args, **kwargs))
                try:
                    got = Outcome(value=await h.call(getattr(fs, op), *args, **kwargs))
                except (OperationError, OSError, ValueError, TypeError) as exc:
                    got = Outcome(error=exc)
                check_same(f"{op}{args!r}", got, want)

    @pytest.mark.anyio
    async def test_fs_matches_reference_model(self, conformance: Harness) -> None:
        """Rule 6: random operation sequences agree with the reference model."""
        conformance.require("fs")
        await conformance.in_thread(lambda: run_fs_machine(conformance))

    @pytest.mark.anyio
    async def test_paths_stay_inside_workspace(self, conformance: Harness) -> None:
        """Rule 7: hostile paths resolve inside the workspace or fail cleanly."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as a, h.session("fs") as b:
            fs_a, fs_b = a.workspace.fs, b.workspace.fs
            assert fs_a is not None
            assert fs_b is not None
            token = f"canary-{secrets.token_hex(8)}".encode()
            secret_name = f"secret-{secrets.token_hex(4)}.txt"
            await h.call(fs_b.write_file, f"/{secret_name}", token)
            host = h.host_dir(a.workspace)
            with _host_canary(host) as (file, directory, inner):
                names = {secret_name}
                extra = [b.workspace.id]
                if host is not None and file is not None and directory is not None:
                    file.write_bytes(token)
                    (directory / inner).write_bytes(token)
                    names.add(inner)
                    extra += [file.name, directory.name, str(file), str(directory), str(host)]
                    extra.append(str(host.parent))
                canary = _Canary(token, frozenset(names), file, directory)
                before = set(os.listdir(host.parent)) if host is not None else set()

                @h.settings()
                @given(st.lists(st.tuples(st.sampled_from(_OPS), hostile_paths(extra)), max_size=6))
                def attempts(ops: list[tuple[str, str]]) -> None:
                    for op, path in ops:
                        got = h.blocking(_attempt, h, fs_a, op, path)
                        canary.check_value(f"{op}({path!r})", got.value)

                await h.in_thread(attempts)
                canary.check_untouched(inner)
                assert await h.call(dump_tree, fs_b) == {f"/{secret_name}": token}, (
                    "another session's workspace was modified"
                )
                if host is not None:
                    assert set(os.listdir(host.parent)) <= before | {host.name}, (
                        "a file was created beside the workspace"
                    )

    @pytest.mark.anyio
    async def test_symlinks_do_not_escape(self, conformance: Harness) -> None:
        """Rule 7: symlinks planted in the host directory never lead outside it."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as opened:
            fs = opened.workspace.fs
            assert fs is not None
            host = h.host_dir(opened.workspace)
            if host is None:
                pytest.skip("no workspace_host_dir fixture: symlinks cannot be planted")
            token = f"canary-{secrets.token_hex(8)}".encode()
            with _host_canary(host) as (file, directory, inner):
                assert file is not None
                assert directory is not None
                file.write_bytes(token)
                (directory / inner).write_bytes(token)
                os.symlink(file, host / "ln-file")
                os.symlink(directory, host / "ln-dir")
                os.symlink(Path("..") / directory.name, host / "ln-rel")
                canary = _Canary(token, frozenset({inner}), file, directory)
                targets = (
                    "/ln-file",
                    "/ln-dir",
                    "/ln-dir/" + inner,
                    "/ln-rel/" + inner,
                    "/ln-dir/new",
                )
                for op in _OPS:
                    for path in targets:
                        got = await _attempt(h, fs, op, path)
                        canary.check_value(f"{op}({path!r})", got.value)
                        canary.check_untouched(inner)
                for op in ("glob", "grep", "ls"):
                    got = await _attempt(h, fs, op, "/")
                    canary.check_value(f"{op}('/')", got.value)
