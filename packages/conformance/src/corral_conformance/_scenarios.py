"""Attack scenarios too slow for every conformance run, for a provider's own test suite.

The conformance rules run on both async backends for every provider, in
seconds; these scenarios take tens of seconds each (a tree 10,000
directories deep) and belong in the provider's tests, run once per backend.
They check the classes of bug the security review found (issue 11): any
recursion proportional to workspace depth, and a shell guard that reads a
script differently from ``sh``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Final, TypeVar

import anyio
import pytest

import corral
import corral.provider

__all__ = ["DEEP_TREE_BUILD", "deep_tree_scenario", "heredoc_bypass_is_refused"]

T = TypeVar("T")

_CHUNK: Final = "/".join(["d"] * 1_000)
DEEP_TREE_BUILD: Final = (
    f"mkdir -p d/{_CHUNK} && echo needle > d/{_CHUNK}/leaf.txt && "
    f"for i in 1 2 3 4 5 6 7 8 9; do mkdir -p t/{_CHUNK} && mv d t/{_CHUNK}/ && mv t d "
    "|| exit 1; done"
)
"""One command that leaves ``d/`` about 10,000 levels deep with ``leaf.txt`` at the bottom.

Shells ``cd`` by absolute path (dash, busybox), so no shell can descend
10,000 levels; instead a 1,000-level chain is wrapped nine times into a fresh
chain by rename. No path ever nears ``PATH_MAX``, yet the tree ends as deep
as one agent command can make it.
"""


async def _clean(awaitable: Awaitable[T]) -> T | None:
    """Run one operation: it may work or fail with a clean OperationError, nothing else."""
    try:
        return await awaitable
    except corral.OperationError:
        return None


async def _build_deep(ws: corral.provider.Workspace) -> None:
    assert ws.shell is not None
    result = await ws.shell.run(
        corral.provider.CommandRequest(DEEP_TREE_BUILD, allow_shell_syntax=True, timeout_s=300)
    )
    assert result.exit_code == 0, result.stderr


async def _names(fs: corral.provider.FileSystem) -> set[str]:
    return {e.name for e in await fs.ls("/")}


async def deep_tree_scenario(
    provider: corral.provider.WorkspaceProvider, config: corral.ProviderConfig
) -> None:
    """Every module operation on a 10,000-level tree works or fails cleanly.

    Needs fs, shell and a :class:`corral.provider.Versions` snapshot module.
    ls/stat/glob/grep, snapshot, grep in a version, restore away and back,
    branch, a write into the restored tree by the command user, ``rm -r``,
    and close with the tree in place -- then a new open still works. For a
    provider with a ``layout`` (corral_posix's tmpdir layout), close must also
    leave no trash, temp or stuck entries and no workspace directory behind.

    Raises:
        AssertionError: Naming the step that went wrong. Anything else
            (RecursionError, a too-many-open-files OSError) is the bug itself.
    """
    opened = await provider.open(config, corral.SessionRef("deep"))
    ws = opened.workspace
    fs, snap, shell = ws.fs, ws.snapshot, ws.shell
    assert fs is not None
    assert shell is not None
    assert isinstance(snap, corral.provider.Versions), "needs a Versions snapshot module"
    needle = corral.RegexModuleEngine().compile("needle")
    await fs.write_file("/small.txt", b"small\n")
    small = await snap.snapshot("small")
    await _build_deep(ws)
    assert await _names(fs) == {"d", "small.txt"}
    assert (await fs.stat("/d")).type == "dir"
    await _clean(fs.glob("**/leaf.txt"))
    await _clean(fs.grep(needle, corral.provider.GrepOptions()))
    deep = await snap.snapshot("deep")  # a 10,000-level tree is a version like any other
    found = await snap.grep_at(deep.snapshot_id, needle, corral.provider.GrepOptions())
    assert [m.line for m in found.matches] == ["needle"]
    await snap.restore(small.snapshot_id)  # by difference: the deep tree is removed
    assert await _names(fs) == {"small.txt"}
    await snap.restore(deep.snapshot_id)  # and brought back, 10,000 levels of it
    assert await _names(fs) == {"d", "small.txt"}
    # ... owned by the command user, who can write into it again.
    touched = await shell.run(corral.provider.CommandRequest("touch d/d/mine"))
    assert touched.exit_code == 0, touched.stderr
    branch = await provider.resolve(await snap.branch(deep.snapshot_id))
    assert branch.fs is not None
    assert await _names(branch.fs) == {"d", "small.txt"}
    await branch.close()
    await fs.rm("/d", recursive=True)
    assert await _names(fs) == {"small.txt"}
    await _build_deep(ws)
    await ws.close()  # with the deep tree in place
    layout = getattr(provider, "layout", None)
    if layout is not None:
        names = [p.name async for p in anyio.Path(layout.base_dir).iterdir()]
        stray = [n for n in names if n.startswith((".trash-", ".tmp-", ".stuck-"))]
        assert stray == [], "close left trash behind"
        gone = anyio.Path(layout.workspace_path(opened.ref.payload["workspace"]))
        assert not await gone.exists()
    again = await provider.open(config, corral.SessionRef("after"))
    await again.workspace.close()


async def heredoc_bypass_is_refused(ws: corral.provider.Workspace) -> None:
    """A here-document whose delimiter has a blank cannot smuggle a command past an allowlist.

    ``ls <<"A B"`` ends at the line ``A B`` for ``sh``; a lexer that reads
    the delimiter as ``A`` lets ``touch S1`` through. The guard must refuse
    the script (``policy_denied``) and nothing may run.

    Raises:
        AssertionError: The script ran or was refused with another code.
    """
    assert ws.shell is not None
    assert ws.fs is not None
    request = corral.provider.CommandRequest(
        'ls <<"A B"\nA B\ntouch S1',
        allowed_commands=frozenset({"ls", "echo"}),
        allow_shell_syntax=True,
    )
    with pytest.raises(corral.OperationError) as refused:
        await ws.shell.run(request)
    assert refused.value.code == "policy_denied"
    with pytest.raises(corral.OperationError) as missing:
        await ws.fs.stat("/S1")
    assert missing.value.code == "not_found"
