"""``DurableWorkspaceProvider``: a durable workspace's modules as API calls, errors kept exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import ConfigError
from corral.provider import (
    GrepOptions,
    OperationError,
    ProviderConfig,
    SessionRef,
    WorkspaceFailedError,
)
from corral_server import DurableWorkspaceProvider
from server_support import ProcessMemoryProvider, make_service, running

pytestmark = pytest.mark.anyio

SANDBOX = {"provider": "in-memory", "capabilities": ["fs", "process"]}


async def test_fs_through_the_api_keeps_the_contract(tmp_path: Path) -> None:
    import corral

    service = make_service(tmp_path, ProcessMemoryProvider())
    async with running(service) as (url, token):
        project = await service.authenticate(token)
        wid = (await service.create(project, {"sandbox": SANDBOX})).id
        provider = await DurableWorkspaceProvider.connect(wid, url=url, token=token)
        assert provider.capabilities == {"fs", "process"}
        assert token not in repr(provider)
        opened = await provider.open(ProviderConfig("corral-server"), SessionRef("s"))
        assert "token" not in str(opened.ref.payload)
        fs = opened.workspace.fs
        assert fs is not None
        await fs.write_file("/src/a.py", b"x = 1\nx = 1\n")
        assert await fs.read_file("src/a.py") == b"x = 1\nx = 1\n"
        assert [e.name for e in await fs.ls("/src")] == ["a.py"]
        assert (await fs.stat("/src")).type == "dir"
        assert list(await fs.glob("**/*.py")) == ["/src/a.py"]
        matcher = corral.get_regex_engine().compile("x =")
        found = await fs.grep(matcher, GrepOptions(max_results=1))
        assert (found.truncated, [m.line_number for m in found.matches]) == (True, [1])
        for call, code in (
            (fs.read_file("/nope"), "not_found"),
            (fs.edit_file("/src/a.py", "x = 1", "y"), "not_unique"),
            (fs.edit_file("/src/a.py", "zzz", "y"), "no_match"),
            (fs.mkdir("/src"), "exists"),
            (fs.rm("/src"), "not_empty"),
            (fs.read_file("/src/a.py", max_bytes=3), "too_large"),
            (fs.read_file("/../etc/passwd"), "invalid_path"),
        ):
            with pytest.raises(OperationError) as err:
                await call
            assert err.value.code == code
            assert "passwd" not in err.value.message
        assert await fs.edit_file("/src/a.py", "x = 1", "y", replace_all=True) == 2
        await fs.rm("/src", recursive=True)
        await opened.workspace.close()
        # Another token's project has no such workspace; a deleted one is gone.
        _other, other_token = await service.create_project("p2")
        with pytest.raises(ConfigError, match="no such workspace"):
            await DurableWorkspaceProvider.connect(wid, url=url, token=other_token)
        again = await provider.resolve(opened.ref)
        await service.delete(project, wid)
        assert again.fs is not None
        with pytest.raises(WorkspaceFailedError):
            await again.fs.read_file("/a")
        await again.close()
    await service.store.aclose()
