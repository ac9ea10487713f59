"""Rules 6 and 7: the file-system model and path containment."""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import corral
import corral.provider
from corral import OperationError
from corral.capability import GrepOptions

from ._compare import Outcome, check_same, model_outcome
from ._fs_machine import diff_trees, model_tree, observe_tree, run_fs_machine
from ._harness import Harness, dump_tree
from ._model import FsModel
from ._rules import define, rule
from ._strategies import BYTES_EXAMPLES, GLOBS, LEGAL_NAMES, any_bytes, around, hostile_paths

__all__ = ["AbstractFsTests"]

_ENGINE = corral.RegexModuleEngine()
_P = "corral._protocols"

PATHS_SAME = define(
    "fs.paths.spellings",
    _P,
    "Paths are the agent's view of the workspace: /a/b.txt and a/b.txt name the same file "
    "(so do ./a//b.txt, a/./b.txt, a/x/../b.txt and a trailing slash).",
)
PATHS_INVALID = define(
    "fs.paths.invalid",
    _P,
    ".. that would climb above the root is an OperationError(code='invalid_path'), as are "
    "NUL bytes and over-long paths (more than 4096 bytes, or a component over 255 bytes).",
)
PATHS_CONTAINED = define(
    "fs.paths.contained",
    _P,
    "Paths are the agent's view of the workspace: no path reads, writes or lists "
    "anything outside it (symlinks included).",
)
NAMES_LEGAL = define(
    "fs.names.legal",
    _P,
    "Every name of 1 to 255 UTF-8 bytes without '/' or NUL (other than . and ..) is a legal "
    "file or directory name; names are case-sensitive and kept exactly as given (no Unicode "
    "normalisation).",
)
BYTES_EXACT = define(
    "fs.bytes.exact",
    "FileSystem.read_file / write_file",
    "read_file returns the whole content of a regular file: exactly the bytes written, "
    "whatever they are (empty, NUL, invalid UTF-8).",
)
READ_ERRORS = define(
    "fs.read_file.errors",
    _P,
    "read_file: missing -> not_found; a directory -> is_a_directory.",
)
READ_MAX = define(
    "fs.read_file.max_bytes",
    _P,
    "read_file: larger than max_bytes (when given) -> too_large; a file of exactly max_bytes "
    "is read whole.",
)
WRITE = define(
    "fs.write_file.semantics",
    _P,
    "write_file creates missing parent directories; a directory at the path -> "
    "is_a_directory; a file where a parent should be -> not_a_directory.",
)
EDIT = define(
    "fs.edit_file.semantics",
    _P,
    "edit_file replaces old_text with new_text; absent -> no_match; several and not "
    "replace_all -> not_unique; empty old_text -> invalid_argument. Returns the count replaced.",
)
EDIT_UTF8 = define(
    "fs.edit_file.not_utf8",
    _P,
    "edit_file works on UTF-8 files; a file that is not UTF-8 -> unsupported_file_type, unchanged.",
)
LS = define(
    "fs.ls.semantics",
    _P,
    "ls: entries of a directory sorted by name, each with its name, agent path, type and "
    "(for a file) size; a file -> not_a_directory.",
)
GLOB = define(
    "fs.glob.semantics",
    _P,
    "glob: files and directories under path whose path relative to it matches the pattern "
    "(*, ?, [...] within one component, ** any number of components); sorted agent-view paths.",
)
GREP = define(
    "fs.grep.semantics",
    _P,
    "grep: regular files under options.path (or that file), filtered by options.glob "
    "(basename, or relative path when the glob holds '/'); files with a NUL byte in their "
    "first 8 KiB in skipped_binary_paths; matches sorted by path then line.",
)
GREP_TRUNCATED = define(
    "fs.grep.truncated",
    _P,
    "grep: truncated exactly when more matching lines exist than max_results (not when "
    "exactly max_results do); max_results below 1 -> invalid_argument.",
)
STAT = define(
    "fs.stat.semantics",
    _P,
    "stat describes a path: its normalised agent path, type, and (for a file) size; a leaf "
    "symlink is reported as symlink and not followed.",
)
STAT_FIELDS = define(
    "fs.stat.fields",
    "FileStat (corral._data)",
    "size is a file's content length and 0 for a directory; mtime is the last content change "
    "in seconds since the Unix epoch (never milliseconds) and moves forward when the file is "
    "rewritten; mode holds the permission bits only; ls entries report the same size and type "
    "as stat.",
)
MKDIR = define(
    "fs.mkdir.semantics",
    _P,
    "mkdir: parents=False and a missing parent -> not_found; the path exists -> exists "
    "unless parents=True and it is a directory.",
)
RM = define(
    "fs.rm.semantics",
    _P,
    "rm: missing -> not_found; a non-empty directory without recursive -> not_empty; the "
    "root -> invalid_argument.",
)
TREE = define(
    "fs.tree.observable",
    _P,
    "After every operation the whole tree (entries, types, sizes, stat results, contents) is "
    "what the operations so far imply; empty files and empty directories are kept.",
)


async def _both(
    h: Harness, fs: corral.provider.FileSystem, model: FsModel, op: str, *args: Any, **kwargs: Any
) -> Outcome:
    """Run one operation on the provider and the model; assert they agree."""
    want = model_outcome(functools.partial(getattr(model, op), *args, **kwargs))
    try:
        got = Outcome(value=await h.call(getattr(fs, op), *args, **kwargs))
    except (OperationError, OSError, ValueError, TypeError) as exc:
        got = Outcome(error=exc)
    shown = ", ".join([*(_short(a) for a in args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    check_same(f"{op}({shown})", got, want)
    return got


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:60] + f"...<{len(text)} chars>"


async def _same_tree(
    h: Harness, fs: corral.provider.FileSystem, model: FsModel, after: str
) -> None:
    got = await h.call(observe_tree, fs)
    want = model_tree(model)
    assert got == want, f"after {after}, the tree differs from the model: {diff_trees(got, want)}"


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


async def _attempt(h: Harness, fs: corral.provider.FileSystem, op: str, path: str) -> Outcome:
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

    @rule(READ_ERRORS, READ_MAX, WRITE, EDIT, LS, STAT, MKDIR, RM, GLOB, PATHS_INVALID)
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
                ("write_file", ("/d/h.txt", b"a a a")),
                ("edit_file", ("/d/h.txt", "a", "bc"), {"replace_all": True}),
                ("read_file", ("/d/h.txt",)),
                ("write_file", ("/d/h.txt", b"\xff a")),
                ("edit_file", ("/d/h.txt", "a", "b")),
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

    @rule(
        TREE,
        PATHS_SAME,
        BYTES_EXACT,
        EDIT,
        EDIT_UTF8,
        LS,
        GLOB,
        GREP,
        GREP_TRUNCATED,
        STAT,
        MKDIR,
        RM,
        WRITE,
        READ_ERRORS,
    )
    @pytest.mark.anyio
    async def test_fs_matches_reference_model(self, conformance: Harness) -> None:
        """Rule 6: random operation sequences agree with the reference model."""
        conformance.require("fs")
        await conformance.in_thread(lambda: run_fs_machine(conformance))

    @rule(PATHS_CONTAINED, PATHS_INVALID)
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

    @rule(PATHS_CONTAINED)
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

    @rule(BYTES_EXACT, READ_MAX, EDIT_UTF8, STAT, LS)
    @pytest.mark.anyio
    async def test_fs_bytes_round_trip(self, conformance: Harness) -> None:
        """Any bytes come back unchanged; max_bytes is exact at size-1/size/size+1."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as opened:
            fs = opened.workspace.fs
            assert fs is not None
            model = FsModel()

            async def one(idx: int, data: bytes) -> None:
                path = f"/bytes/{idx % 3}.bin"
                await _both(h, fs, model, "write_file", path, data)
                await _both(h, fs, model, "read_file", path)
                await _both(h, fs, model, "stat", path)
                await _both(h, fs, model, "ls", "/bytes")
                for limit in around(len(data)):
                    await _both(h, fs, model, "read_file", path, max_bytes=limit)
                await _both(h, fs, model, "edit_file", path, "\ufffd", "x", replace_all=True)
                await _both(h, fs, model, "read_file", path)

            for idx, data in enumerate(BYTES_EXAMPLES):
                await one(idx, data)

            @h.settings()
            @given(st.lists(any_bytes, min_size=1, max_size=4))
            def random_bytes(blobs: list[bytes]) -> None:
                for idx, data in enumerate(blobs):
                    h.blocking(one, idx, data)

            await h.in_thread(random_bytes)
            await _same_tree(h, fs, model, "writing arbitrary bytes")

    @rule(NAMES_LEGAL, LS, GLOB, STAT, GREP)
    @pytest.mark.anyio
    async def test_fs_legal_names(self, conformance: Harness) -> None:
        """Every legal name is accepted, listed back exactly, distinct from its twins."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as opened:
            fs = opened.workspace.fs
            assert fs is not None
            model = FsModel()
            for idx, name in enumerate(LEGAL_NAMES):
                await _both(h, fs, model, "write_file", f"/{name}", f"n{idx}\n".encode())
                await _both(h, fs, model, "mkdir", f"/dir/{name}", parents=True)
                await _both(h, fs, model, "write_file", f"dir/{name}/{name}", b"")
            await _same_tree(h, fs, model, "creating every legal name")
            for name in LEGAL_NAMES:
                await _both(h, fs, model, "read_file", f"/{name}")
                await _both(h, fs, model, "stat", f"/dir/{name}/")
            await _both(h, fs, model, "ls", "/")
            await _both(h, fs, model, "glob", "*")
            await _both(h, fs, model, "glob", "**", "/dir")
            await _both(h, fs, model, "grep", _ENGINE.compile("^n1"), GrepOptions(path="/"))
            for name in LEGAL_NAMES[::2]:
                await _both(h, fs, model, "rm", f"/{name}")
                await _both(h, fs, model, "rm", f"/dir/{name}", recursive=True)
            await _same_tree(h, fs, model, "removing every other name")

    @rule(PATHS_SAME, PATHS_INVALID)
    @pytest.mark.anyio
    async def test_fs_path_spellings(self, conformance: Harness) -> None:
        """Every spelling of a path names the same file; bad paths are invalid_path."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as opened:
            fs = opened.workspace.fs
            assert fs is not None
            model = FsModel()
            await _both(h, fs, model, "write_file", "a/b.txt", b"same file")
            for spelling in (
                "/a/b.txt",
                "a/b.txt",
                "./a//b.txt",
                "a/./b.txt",
                "a/x/../b.txt",
                "//a/b.txt",
                "/a/b.txt/",
                "a/../a/b.txt",
            ):
                await _both(h, fs, model, "read_file", spelling)
                await _both(h, fs, model, "stat", spelling)
            await _both(h, fs, model, "write_file", "./a//c.txt", b"c")
            await _both(h, fs, model, "ls", "a/")
            await _both(h, fs, model, "ls", "/a/./")
            await _both(h, fs, model, "glob", "*.txt", "./a")
            bad = (
                "..",
                "../x",
                "/a/../../x",
                "a\x00b",
                "/" + "x" * 256,
                "/" + "/".join(["abcdefg"] * 600),
                "./../a/b.txt",
            )
            for path in bad:
                for op, args in (
                    ("read_file", (path,)),
                    ("write_file", (path, b"x")),
                    ("stat", (path,)),
                    ("ls", (path,)),
                    ("mkdir", (path,)),
                    ("rm", (path,)),
                    ("edit_file", (path, "a", "b")),
                ):
                    await _both(h, fs, model, op, *args)
            await _same_tree(h, fs, model, "path spellings")

    @rule(GREP, GREP_TRUNCATED)
    @pytest.mark.anyio
    async def test_fs_grep_boundaries(self, conformance: Harness) -> None:
        """max_results at 0/1/n-1/n/n+1; order, line numbers, globs, binary files."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as opened:
            fs = opened.workspace.fs
            assert fs is not None
            model = FsModel()
            files = {
                "/z.txt": b"hit one\nmiss\nhit two\n",
                "/a/b.txt": b"hit\n",
                "/a/c.py": b"HIT upper\nno\n\nhit at 4",
                "/a/bin.dat": b"hit\x00binary",
                "/a/deep/e.txt": b"\xffhit\r\n",
                "/empty.txt": b"",
            }
            for path, data in files.items():
                await _both(h, fs, model, "write_file", path, data)
            matcher = _ENGINE.compile("hit")
            total = len(model.grep_all(matcher, GrepOptions()).matches)
            for limit in around(total):
                await _both(h, fs, model, "grep", matcher, GrepOptions(max_results=limit))
            loud = _ENGINE.compile("hit", ignore_case=True)
            total = len(model.grep_all(loud, GrepOptions(ignore_case=True)).matches)
            for limit in around(total):
                options = GrepOptions(ignore_case=True, max_results=limit)
                await _both(h, fs, model, "grep", loud, options)
            for options in (
                GrepOptions(path="/a"),
                GrepOptions(path="a/"),
                GrepOptions(path="/z.txt"),
                GrepOptions(glob="*.txt"),
                GrepOptions(glob="b.txt"),
                GrepOptions(glob="a/*.py"),
                GrepOptions(glob="**/*.txt"),
                GrepOptions(path="/a", glob="deep/*"),
                GrepOptions(path="/missing"),
            ):
                await _both(h, fs, model, "grep", matcher, options)

    @rule(TREE, MKDIR, RM, LS, GLOB, WRITE)
    @pytest.mark.anyio
    async def test_fs_deep_wide_and_empty(self, conformance: Harness) -> None:
        """Deep and wide trees, empty files and empty directories are kept and listed."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as opened:
            fs = opened.workspace.fs
            assert fs is not None
            model = FsModel()
            deep = "/" + "/".join(f"l{i}" for i in range(40))
            await _both(h, fs, model, "mkdir", deep, parents=True)
            await _both(h, fs, model, "write_file", f"{deep}/leaf.txt", b"bottom")
            await _both(h, fs, model, "mkdir", f"{deep}/empty-dir")
            await _both(h, fs, model, "mkdir", f"{deep}/empty-dir", parents=True)
            await _both(h, fs, model, "mkdir", f"{deep}/leaf.txt", parents=True)
            await _both(h, fs, model, "mkdir", f"{deep}/leaf.txt/under", parents=True)
            await _both(h, fs, model, "write_file", f"{deep}/empty-dir", b"x")
            for i in range(120):
                await _both(h, fs, model, "write_file", f"/wide/f{i:03d}", b"" if i % 2 else b"1")
            await _both(h, fs, model, "mkdir", "/wide/sub")
            await _both(h, fs, model, "ls", "/wide")
            await _both(h, fs, model, "glob", "**/empty-dir")
            await _both(h, fs, model, "glob", "**")
            await _same_tree(h, fs, model, "building deep and wide trees")
            await _both(h, fs, model, "rm", "/wide")
            await _both(h, fs, model, "rm", "/wide/f001")
            await _both(h, fs, model, "rm", "/wide/sub")
            await _both(h, fs, model, "rm", "/l0", recursive=True)
            await _both(h, fs, model, "write_file", "/solo/only.txt", b"")
            await _both(h, fs, model, "rm", "/solo/only.txt")
            await _same_tree(h, fs, model, "removing deep and wide trees")
            await _both(h, fs, model, "mkdir", "/")
            await _both(h, fs, model, "mkdir", "/", parents=True)
            await _both(h, fs, model, "rm", "/", recursive=True)
            await _both(h, fs, model, "stat", "/")
            await _both(h, fs, model, "ls", "/")

    @rule(STAT)
    @pytest.mark.anyio
    async def test_fs_stat_does_not_follow_symlinks(self, conformance: Harness) -> None:
        """A leaf symlink is reported as ``symlink`` (planted in the host dir or by the shell)."""
        h = conformance
        h.require("fs")
        declared = {"fs", "shell"} & h.advertised
        async with h.session(*declared) as opened:
            fs = opened.workspace.fs
            assert fs is not None
            await h.call(fs.write_file, "/target.txt", b"0123456789")
            await h.call(fs.mkdir, "/dir")
            host = h.host_dir(opened.workspace)
            shell = opened.workspace.shell
            if host is not None:
                os.symlink("target.txt", host / "link")
                os.symlink("dir", host / "dir-link")
            elif shell is not None:
                made = await h.call(
                    shell.run,
                    corral.provider.CommandRequest(
                        "ln -s target.txt link && ln -s dir dir-link", allow_shell_syntax=True
                    ),
                )
                assert made.exit_code == 0, f"ln -s failed: {made!r}"
            else:
                pytest.skip("no host directory and no shell: symlinks cannot be planted")
            for path in ("/link", "link", "/dir-link"):
                got = await h.call(fs.stat, path)
                assert (got.type, got.path) == ("symlink", corral.provider.normalize_path(path)), (
                    f"stat({path!r}) gave {got!r}; a leaf symlink is reported as symlink"
                )
            assert (await h.call(fs.stat, "/target.txt")).size == 10

    @rule(STAT_FIELDS)
    @pytest.mark.anyio
    async def test_fs_stat_fields(self, conformance: Harness) -> None:
        """Sizes, times and modes mean what FileStat says, for files and directories."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as opened:
            fs = opened.workspace.fs
            assert fs is not None
            before = time.time()
            await h.call(fs.write_file, "/d/f.bin", b"x" * 1234)
            after = time.time()
            got = await h.call(fs.stat, "/d/f.bin")
            assert (got.path, got.type, got.size) == ("/d/f.bin", "file", 1234), repr(got)
            # A coarse clock or a slow host is fine; milliseconds or 0 are not.
            assert before - 5 <= got.mtime <= after + 5, (
                f"mtime {got.mtime!r} is not seconds since the epoch near {before:.0f}"
            )
            assert got.mode & ~0o7777 == 0, f"mode {oct(got.mode)} holds more than permission bits"
            assert got.mode != 0, "a file's mode has no permission bits at all"
            folder = await h.call(fs.stat, "/d")
            assert (folder.type, folder.size) == ("dir", 0), repr(folder)
            assert folder.mode & ~0o7777 == 0, f"directory mode {oct(folder.mode)}"
            entries = {e.name: e for e in await h.call(fs.ls, "/d")}
            assert (entries["f.bin"].type, entries["f.bin"].size) == ("file", 1234), entries
            root_entries = {e.name: e for e in await h.call(fs.ls, "/")}
            assert (root_entries["d"].type, root_entries["d"].size) == ("dir", 0), root_entries
            await anyio.sleep(0.05)
            await h.call(fs.write_file, "/d/f.bin", b"y")
            again = await h.call(fs.stat, "/d/f.bin")
            assert again.size == 1, repr(again)
            assert again.mtime >= got.mtime, (
                f"rewriting the file moved mtime from {got.mtime!r} to {again.mtime!r}"
            )

    @rule(GLOB)
    @pytest.mark.anyio
    async def test_fs_glob_patterns(self, conformance: Harness) -> None:
        """Every glob form from several bases: ``**`` matches zero components too."""
        h = conformance
        h.require("fs")
        async with h.session("fs") as opened:
            fs = opened.workspace.fs
            assert fs is not None
            model = FsModel()
            for path in ("/b.txt", "/a", "/d/b.txt", "/d/c.py", "/d/e/b.txt", "/é/a.txt"):
                await _both(h, fs, model, "write_file", path, b"x")
            await _both(h, fs, model, "mkdir", "/d/empty")
            patterns = (*GLOBS, "**/*", "d/**", "*/", "[!a]*", "d/e/b.txt", "nothing", "**/e/*")
            for base in ("/", "/d", "d/", "/d/e", "/missing", "/b.txt"):
                for pattern in patterns:
                    await _both(h, fs, model, "glob", pattern, base)
