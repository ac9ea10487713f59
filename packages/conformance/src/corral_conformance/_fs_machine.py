"""The file-system state machine: the provider and the reference model, step by step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import corral
import corral.provider
from corral import OperationError
from corral.capability import GrepOptions

from ._compare import Outcome, check_same, model_outcome, normalise
from ._harness import Harness
from ._model import FsModel
from ._strategies import GLOBS, GREP_PATTERNS, contents, tree_paths

__all__ = ["observe_tree", "run_fs_machine"]

_ENGINE = corral.RegexModuleEngine()
# Few names and shallow trees, so operations keep meeting each other's files.
_files = tree_paths(leaf=True)
_dirs = tree_paths(leaf=False)
_any = st.one_of(_files, _dirs)
_written: Bundle[str] = Bundle("written")
_made: Bundle[str] = Bundle("made")
# Operations mostly aim at paths earlier steps created, sometimes anywhere.
_existing_files = st.one_of(_written, _written, _files)
_existing_dirs = st.one_of(_made, _dirs)


Observed = dict[str, tuple[Any, ...]]
"""Per path: the ``ls`` entry, the ``stat`` result and, for a file, its content."""


async def observe_tree(fs: corral.provider.FileSystem) -> Observed:
    """Everything the fs exposes about its tree: ls of every directory, stat and
    content of every path, normalised to what the contract fixes."""
    out: Observed = {"/": ("root", normalise(await fs.stat("/")))}
    pending = ["/"]
    while pending:  # iterative: deep trees must not hit the recursion limit
        where = pending.pop()
        for entry in await fs.ls(where):
            info = normalise(await fs.stat(entry.path))
            data = await fs.read_file(entry.path) if entry.type == "file" else None
            out[entry.path] = (normalise(entry), info, data)
            if entry.type == "dir":
                pending.append(entry.path)
    return out


def model_tree(model: FsModel) -> Observed:
    """What :func:`observe_tree` must see for a model."""
    out: Observed = {"/": ("root", normalise(model.stat("/")))}
    for path, data in model.dump().items():
        parent, _, name = path.rpartition("/")
        entry = next(e for e in model.ls(parent or "/") if e.name == name)
        out[path] = (normalise(entry), normalise(model.stat(path)), data)
    return out


def diff_trees(got: Observed, want: Observed) -> str:
    """A short description of how two observed trees differ (empty if equal)."""
    lines = []
    for path in sorted(set(got) | set(want)):
        mine, theirs = got.get(path), want.get(path)
        if mine != theirs:
            lines.append(f"{path!r}: provider {mine!r}, model {theirs!r}")
    return "; ".join(lines[:8]) + (f" (+{len(lines) - 8} more)" if len(lines) > 8 else "")


def run_fs_machine(h: Harness) -> None:
    """Run the state machine from a worker thread (see :meth:`Harness.in_thread`)."""

    class FsMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.opened = h.blocking(h.open, frozenset({"fs"}))
            fs = self.opened.workspace.fs
            assert fs is not None, f"{h.kind}: declared fs but the workspace has no fs module"
            self.fs: corral.provider.FileSystem = fs
            self.model = FsModel()

        def both(
            self,
            what: str,
            call: Callable[[corral.provider.FileSystem], Any],
            model: Callable[[FsModel], Any],
            *,
            grep_boundary: bool = False,
        ) -> None:
            want = model_outcome(lambda: model(self.model))

            async def run() -> Any:
                return await call(self.fs)

            try:
                got = Outcome(value=h.blocking(run))
            except (OperationError, OSError, ValueError, TypeError, RuntimeError) as exc:
                got = Outcome(error=exc)
            check_same(what, got, want, grep_boundary=grep_boundary)
            self.last = what

        @invariant()
        def whole_tree_matches(self) -> None:
            # After every step, not only at the end: a defect that a later step
            # would paper over (a stray file removed again) is still seen.
            if not hasattr(self, "fs"):
                return
            got = h.blocking(observe_tree, self.fs)
            want = model_tree(self.model)
            assert got == want, (
                f"{h.kind}: after {getattr(self, 'last', 'the start')}, the tree differs "
                f"from the model: {diff_trees(got, want)}"
            )

        @initialize(files=st.lists(st.tuples(_files, contents), max_size=8))
        def seed(self, files: list[tuple[str, bytes]]) -> None:
            # Start from a populated tree so listings and searches have material.
            for path, data in files:
                self.write_file(path, data)

        @initialize(times=st.integers(2, 4), replace_all=st.booleans())
        def seed_repeats(self, times: int, replace_all: bool) -> None:
            # Every run edits text that occurs several times, so counts that
            # only go wrong beyond one occurrence (or one replacement) are met
            # whatever else the run draws.
            self.write_file("/repeats.txt", b"ab\n" * times)
            self.edit_file("/repeats.txt", "a", "xy", replace_all)
            self.edit_file("/repeats.txt", "b", "", True)

        @rule(target=_written, path=_files, data=contents)
        def write_file(self, path: str, data: bytes) -> str:
            self.both(
                f"write_file({path!r}, {data!r})",
                lambda fs: fs.write_file(path, data),
                lambda m: m.write_file(path, data),
            )
            return path

        @rule(path=_existing_files)
        def read_file(self, path: str) -> None:
            self.both(
                f"read_file({path!r})", lambda fs: fs.read_file(path), lambda m: m.read_file(path)
            )

        @rule(
            path=_existing_files,
            old=st.sampled_from(("a", "b", "ab", "x", "", "zz", "\n")),
            new=st.sampled_from(("", "b", "xy", "a\n")),
            replace_all=st.booleans(),
        )
        def edit_file(self, path: str, old: str, new: str, replace_all: bool) -> None:
            self.both(
                f"edit_file({path!r}, {old!r}, {new!r}, replace_all={replace_all})",
                lambda fs: fs.edit_file(path, old, new, replace_all=replace_all),
                lambda m: m.edit_file(path, old, new, replace_all=replace_all),
            )

        @rule(target=_made, path=_dirs, parents=st.booleans())
        def mkdir(self, path: str, parents: bool) -> str:
            self.both(
                f"mkdir({path!r}, parents={parents})",
                lambda fs: fs.mkdir(path, parents=parents),
                lambda m: m.mkdir(path, parents=parents),
            )
            return path

        @rule(path=st.one_of(_existing_files, _existing_dirs), recursive=st.booleans())
        def rm(self, path: str, recursive: bool) -> None:
            self.both(
                f"rm({path!r}, recursive={recursive})",
                lambda fs: fs.rm(path, recursive=recursive),
                lambda m: m.rm(path, recursive=recursive),
            )

        @rule(path=_existing_dirs)
        def ls(self, path: str) -> None:
            self.both(f"ls({path!r})", lambda fs: fs.ls(path), lambda m: m.ls(path))

        @rule(path=st.one_of(_existing_files, _existing_dirs))
        def stat(self, path: str) -> None:
            self.both(f"stat({path!r})", lambda fs: fs.stat(path), lambda m: m.stat(path))

        @rule(pattern=st.sampled_from(GLOBS), path=_existing_dirs)
        def glob(self, pattern: str, path: str) -> None:
            self.both(
                f"glob({pattern!r}, {path!r})",
                lambda fs: fs.glob(pattern, path),
                lambda m: m.glob(pattern, path),
            )

        @rule(
            pattern=st.sampled_from(GREP_PATTERNS),
            ignore_case=st.booleans(),
            where=st.one_of(_existing_dirs, _existing_dirs, _existing_files),
            glob=st.none() | st.sampled_from(GLOBS),
            max_results=st.integers(1, 4),
        )
        def grep(
            self, pattern: str, ignore_case: bool, where: str, glob: str | None, max_results: int
        ) -> None:
            if glob is not None and "/" in glob:
                where = "/"  # a relative-path glob is only unambiguous from the root
            matcher = _ENGINE.compile(pattern, ignore_case=ignore_case)
            options = GrepOptions(
                path=where, glob=glob, ignore_case=ignore_case, max_results=max_results
            )
            self.both(
                f"grep({pattern!r}, {options!r})",
                lambda fs: fs.grep(matcher, options),
                lambda m: m.grep(matcher, options),
            )

        @rule(
            pattern=st.sampled_from(GREP_PATTERNS),
            ignore_case=st.booleans(),
            max_results=st.integers(1, 4),
        )
        def grep_everywhere(self, pattern: str, ignore_case: bool, max_results: int) -> None:
            self.grep(pattern, ignore_case, "/", None, max_results)

        def _existing(self, data: st.DataObject, *, files_only: bool) -> str | None:
            found = [p for p, v in self.model.dump().items() if v is not None or not files_only]
            return data.draw(st.sampled_from(sorted(found))) if found else None

        @rule(data=st.data())
        def read_existing(self, data: st.DataObject) -> None:
            path = self._existing(data, files_only=True)
            if path is not None:
                self.read_file(path)

        @rule(
            data=st.data(), new=st.sampled_from(("", "b", "xy", "a\n")), replace_all=st.booleans()
        )
        def edit_existing(self, data: st.DataObject, new: str, replace_all: bool) -> None:
            # Aim at text the file really holds, so replacements (and counts) happen.
            path = self._existing(data, files_only=True)
            if path is None:
                return
            text = self.model.read_file(path).decode("utf-8", "replace")
            if not text:
                return
            start = data.draw(st.integers(0, len(text) - 1))
            old = text[start : start + data.draw(st.integers(1, 3))]
            self.edit_file(path, old, new, replace_all)

        @rule(data=st.data(), recursive=st.booleans())
        def rm_existing(self, data: st.DataObject, recursive: bool) -> None:
            path = self._existing(data, files_only=False)
            if path is not None:
                self.rm(path, recursive)

        def teardown(self) -> None:
            h.blocking(self.opened.workspace.close)

    run_state_machine_as_test(FsMachine, settings=h.settings(stateful_step_count=40))
