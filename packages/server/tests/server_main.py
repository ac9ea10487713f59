"""A ``corral serve`` for crash tests: local-bash with its real ``process`` module, SQLite state.

Usage: ``python server_main.py DATA BOXES``; prints ``listening on URL`` then serves
until killed. The holder id is fixed, as a restarted replica's is (see
:class:`ProcessLocalBash` for the hook that stops inside ``open``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio

from corral_local_bash import LocalBashProvider
from corral_server import LocalBlobStore, WorkspaceService, open_store, serve


class ProcessLocalBash(LocalBashProvider):
    """local-bash declaring the ``process`` module its builder already assembles.

    With ``CORRAL_TEST_HANG_AFTER_OPEN=PATH`` in the environment, ``open``
    creates the box, then touches PATH and never returns: the point between
    ``provider.open`` and recording the ref, where a test SIGKILLs.
    """

    capabilities = LocalBashProvider.capabilities | {"process"}  # type: ignore[misc]

    async def open(self, *args: Any, **kw: Any) -> Any:
        opened = await super().open(*args, **kw)
        flag = os.environ.get("CORRAL_TEST_HANG_AFTER_OPEN")
        if flag:
            open(flag, "w").close()
            await anyio.sleep_forever()
        return opened


async def main(data: str, boxes: str) -> None:
    provider = ProcessLocalBash(tmpdir_root=boxes)
    service = WorkspaceService(
        open_store(f"{data}/state.db"),
        LocalBlobStore(f"{data}/blobs"),
        providers=lambda _s: provider,
        holder="crash-holder",
        validate_open=False,
        idle_stop_s=None,
    )
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(
            lambda task_status: serve(service, port=0, task_status=task_status)
        )
        await service.store.migrate()
        if await service.store.project_by_name("p") is None:
            _pid, token = await service.create_project("p")
            with open(f"{data}/token", "w") as fh:
                fh.write(token)
        print(f"listening on http://{host}:{port}", flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
