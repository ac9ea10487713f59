"""The tool pipeline's fast path behaves exactly as its general path.

``WorkspaceToolset`` runs a call without an await before the handler's when
the workspace is live and no progress callback is set; otherwise (a lazy
session's first call, a progress callback) it takes the general path. Both
must locate mount paths (``corral._mount``) the same way, before the handler,
on the eviction retry and in what a result filter sees. And the default
renderer's direct use of the C JSON encoder must give ``json.dumps``'s text
and errors.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral
from corral import OperationError, Progress, ToolResult, open_workspace
from corral._mount import PathView
from corral._paths import path_parts
from corral._tool import render_json
from corral.provider import ModularWorkspace

from .conftest import FakeProvider

pytestmark = pytest.mark.anyio

MOUNT = "/workspace"


class MountedProvider(FakeProvider):
    """The fake provider, its workspaces declaring that commands see them at ``/workspace``."""

    def _build(self, ws_id: str) -> ModularWorkspace:
        built = super()._build(ws_id)
        ws = ModularWorkspace(
            ws_id,
            fs=built.fs,
            on_close=built._on_close,
            details=lambda: {"workspace_path": MOUNT},
        )
        self.workspaces[ws_id] = ws
        return ws


@pytest.fixture
def plugins() -> corral.PluginSet:
    return corral.load_plugins([], entrypoints=False)


@pytest.mark.parametrize("strategy", ["eager", "lazy"])
@pytest.mark.parametrize("progress", [False, True])
@pytest.mark.parametrize("filtered", [False, True])
async def test_mount_paths_are_located_on_every_path_through_the_pipeline(
    plugins: corral.PluginSet, strategy: Any, progress: bool, filtered: bool
) -> None:
    provider = MountedProvider(("fs",))
    seen: list[Mapping[str, object]] = []

    def keep(name: str, args: Mapping[str, object], result: ToolResult) -> ToolResult:
        seen.append(args)
        return result

    def on_progress(update: Progress) -> None:
        pass

    async with open_workspace(
        provider,
        {"fs": True},
        plugins=plugins,
        open_strategy=strategy,
        result_filter=keep if filtered else None,
        on_progress=on_progress if progress else None,
    ) as ws:
        wrote = await ws.call(
            "workspace_write_file",
            {"path": f"{MOUNT}/sub/../a.txt", "content": "x"},
            raise_on_error=True,
        )
        fs = provider.last_fs
        assert fs is not None
        assert fs.files == {"/a.txt": b"x"}
        assert wrote.data["path"] == f"{MOUNT}/a.txt"
        # The retry after an eviction runs the located call again.
        fs.evict_next = 1
        read = await ws.call("workspace_read_file", {"path": f"{MOUNT}/a.txt"})
        assert not read.is_error, read.content
        assert read.data["path"] == f"{MOUNT}/a.txt"
        assert provider.last_fs is not None
        assert provider.last_fs.calls[-2:] == ["read_file", "read_file"]
        # A path elsewhere stays workspace-relative; the mount itself is the root.
        relative = await ws.call("workspace_stat", {"path": "/a.txt"}, raise_on_error=True)
        assert relative.data["path"] == f"{MOUNT}/a.txt"
        root = await ws.call("workspace_rm", {"path": MOUNT})
        assert root.error_code == "invalid_argument"
    if filtered:
        assert [a["path"] for a in seen] == ["/a.txt", "/a.txt", "/a.txt", "/"]
    else:
        assert seen == []


async def test_a_bad_path_is_refused_before_the_workspace_opens(
    plugins: corral.PluginSet,
) -> None:
    provider = MountedProvider(("fs",))
    async with open_workspace(provider, {"fs": True}, plugins=plugins, open_strategy="lazy") as ws:
        bad = await ws.call("workspace_read_file", {"path": f"{MOUNT}/../../etc"})
        assert bad.error_code == "invalid_path"
        assert provider.opens == 0


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        | st.dictionaries(st.integers(), inner, max_size=2)
    ),
    max_leaves=20,
)


def _dumps(data: object) -> str:
    return json.dumps(data, ensure_ascii=False, default=str)


@settings(max_examples=200, deadline=None)
@given(data=_JSON)
def test_render_json_is_json_dumps(data: object) -> None:
    if isinstance(data, str):
        assert render_json(data) == data  # text is shown as it is
    else:
        assert render_json(data) == _dumps(data)


def test_render_json_fails_as_json_dumps_does() -> None:
    circular: list[object] = []
    circular.append(circular)
    for bad in (circular, {(1, 2): 3}):
        with pytest.raises((ValueError, TypeError)) as ours:
            render_json(bad)
        with pytest.raises((ValueError, TypeError)) as theirs:
            _dumps(bad)
        assert type(ours.value) is type(theirs.value)
        assert str(ours.value) == str(theirs.value)
    # Not JSON-native values are shown through str(), as json.dumps(default=str) does.
    odd = {"set": {1}, "nan": math.nan, "obj": object.__name__}
    assert render_json(odd) == _dumps(odd)


def _accept_by_components(root: str, value: str) -> str | None:
    """The contract of ``PathView.accept``, component by component."""
    if root == "/" or not value.startswith("/"):
        return None
    parts, prefix = path_parts(value), path_parts(root)
    if parts[: len(prefix)] != prefix:
        return None
    return "/" + "/".join(parts[len(prefix) :])


_COMPONENT = st.sampled_from(["", ".", "..", "workspace", "ws", "a", "workspacex"])
_PATH = st.builds(
    lambda lead, comps: lead + "/".join(comps),
    st.sampled_from(["/", "", "//"]),
    st.lists(_COMPONENT, max_size=6),
)


@settings(max_examples=500, deadline=None)
@given(root=_PATH, value=_PATH)
def test_accept_is_the_component_wise_prefix_test(root: str, value: str) -> None:
    def outcome(run: Callable[[], str | None]) -> tuple[str, str | None]:
        try:
            return ("ok", run())
        except OperationError as exc:
            return ("error", exc.code)

    expected = outcome(lambda: _accept_by_components(root, value))
    assert outcome(lambda: PathView(root).accept(value)) == expected
