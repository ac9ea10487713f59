"""The in-memory fs against a tiny dict-of-paths model, driven by a hypothesis state machine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import anyio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import corral
from corral_memory import InMemoryProvider

# Outcome of one operation: ("ok", value) or ("error", code).
Outcome = tuple[str, Any]

paths = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3).map(
    lambda parts: "/" + "/".join(parts)
)
contents = st.binary(max_size=8)


class Model:
    """Entries by path: bytes for a file, None for a directory (the root is implicit)."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes | None] = {}

    @staticmethod
    def _parents(path: str) -> list[str]:
        parts = path.strip("/").split("/")
        return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]

    def _walk_parents(self, path: str, *, create_missing: bool) -> str | None:
        """The error code walking the parents raises, or None."""
        for parent in self._parents(path):
            if parent not in self.entries:
                return None if create_missing else "not_found"
            if self.entries[parent] is not None:
                return "not_a_directory"
        return None

    def lookup(self, path: str) -> Outcome:
        for parent in self._parents(path):
            if parent not in self.entries:
                return ("error", "not_found")
            if self.entries[parent] is not None:
                return ("error", "not_a_directory")
        if path not in self.entries:
            return ("error", "not_found")
        return ("ok", self.entries[path])

    def children(self, path: str) -> list[str]:
        prefix = "/" if path == "/" else path + "/"
        return [p for p in self.entries if p.startswith(prefix) and "/" not in p[len(prefix) :]]

    def write(self, path: str, data: bytes) -> Outcome:
        code = self._walk_parents(path, create_missing=True)
        if code:
            return ("error", code)
        if self.entries.get(path, b"") is None:
            return ("error", "is_a_directory")
        for parent in self._parents(path):
            self.entries[parent] = None
        self.entries[path] = data
        return ("ok", None)

    def read(self, path: str) -> Outcome:
        kind, value = self.lookup(path)
        if kind == "ok" and value is None:
            return ("error", "is_a_directory")
        return (kind, value)

    def mkdir(self, path: str, parents: bool) -> Outcome:
        code = self._walk_parents(path, create_missing=parents)
        if code:
            return ("error", code)
        if path in self.entries:
            if parents and self.entries[path] is None:
                return ("ok", None)
            return ("error", "exists")
        for parent in self._parents(path):
            self.entries[parent] = None
        self.entries[path] = None
        return ("ok", None)

    def rm(self, path: str, recursive: bool) -> Outcome:
        kind, value = self.lookup(path)
        if kind == "error":
            return (kind, value)
        if value is None and self.children(path) and not recursive:
            return ("error", "not_empty")
        for p in [p for p in self.entries if p == path or p.startswith(path + "/")]:
            del self.entries[p]
        return ("ok", None)

    def ls(self, path: str) -> Outcome:
        if path != "/":
            kind, value = self.lookup(path)
            if kind == "error":
                return (kind, value)
            if value is not None:
                return ("error", "not_a_directory")
        names = sorted(p.rpartition("/")[2] for p in self.children(path))
        return ("ok", names)


async def _outcome(make: Callable[[], Awaitable[Any]]) -> Outcome:
    try:
        return ("ok", await make())
    except corral.OperationError as exc:
        return ("error", exc.code)


class FsMachine(RuleBasedStateMachine):
    """Runs the same operations on the provider and the model; outcomes must agree."""

    backend: ClassVar[str] = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        opened = self._run(
            lambda: InMemoryProvider().open(
                corral.ProviderConfig(kind="in-memory"), corral.SessionRef("m")
            )
        )
        self.workspace = opened.workspace
        assert self.workspace.fs is not None
        self.fs = self.workspace.fs

    def _run(self, make: Callable[[], Awaitable[Any]]) -> Any:
        return anyio.run(make, backend=self.backend)

    def _check(self, make: Callable[[], Awaitable[Any]], expected: Outcome) -> Any:
        actual = self._run(lambda: _outcome(make))
        assert actual[0] == expected[0], (actual, expected)
        if actual[0] == "error":
            assert actual[1] == expected[1], (actual, expected)
        return actual[1]

    @rule(path=paths, data=contents)
    def write(self, path: str, data: bytes) -> None:
        self._check(lambda: self.fs.write_file(path, data), self.model.write(path, data))

    @rule(path=paths)
    def read(self, path: str) -> None:
        expected = self.model.read(path)
        got = self._check(lambda: self.fs.read_file(path), expected)
        if expected[0] == "ok":
            assert got == expected[1]

    @rule(path=paths, parents=st.booleans())
    def mkdir(self, path: str, parents: bool) -> None:
        self._check(lambda: self.fs.mkdir(path, parents=parents), self.model.mkdir(path, parents))

    @rule(path=paths, recursive=st.booleans())
    def rm(self, path: str, recursive: bool) -> None:
        self._check(lambda: self.fs.rm(path, recursive=recursive), self.model.rm(path, recursive))

    @rule(path=st.just("/") | paths)
    def ls(self, path: str) -> None:
        expected = self.model.ls(path)
        got = self._check(lambda: self.fs.ls(path), expected)
        if expected[0] == "ok":
            assert [e.name for e in got] == expected[1]

    @invariant()
    def same_tree(self) -> None:
        listed = self._run(lambda: self.fs.glob("**"))
        assert listed == sorted(self.model.entries)

    def teardown(self) -> None:
        self._run(self.workspace.close)


FsMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
TestFsModelAsyncio = FsMachine.TestCase


class TrioFsMachine(FsMachine):
    """The same machine on trio."""

    backend = "trio"


TrioFsMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestFsModelTrio = TrioFsMachine.TestCase
