"""A service process stuck mid-capture, for the collector's crash test.

Usage: ``python capture_main.py STORE_URL BLOBS``. Creates a workspace with
two files, starts taking a version whose read of ``/zz-slow`` never returns,
prints ``capturing`` once the first file's blob is written, and keeps its
capture row renewed (lease TTL 1 s) until it is killed.
"""

from __future__ import annotations

import base64
import sys
from typing import Any

import anyio

from corral_server import LocalBlobStore, WorkspaceService, open_store
from server_support import SANDBOX, ProcessMemoryProvider


async def main(url: str, blobs: str) -> None:
    service = WorkspaceService(
        open_store(url),
        LocalBlobStore(blobs),
        providers=lambda _s: provider,
        holder="capture-holder",
        lease_ttl_s=1.0,
        idle_stop_s=None,
        validate_open=False,
    )
    provider = ProcessMemoryProvider()
    async with anyio.create_task_group() as tg:
        await service.start(tg)
        project, _ = await service.create_project("p")
        ws = (await service.create(project, {"sandbox": SANDBOX})).id
        for path, data in (("a.txt", b"written by a capture that crashes"), ("zz-slow", b"z")):
            body = {"op": "write_file", "path": path, "data": base64.b64encode(data).decode()}
            await service.live_fs(project, ws, body)
        fs = service._live[ws].workspace.fs
        real = fs.read_file

        async def read_file(path: str, **kw: Any) -> bytes:
            if path == "/zz-slow":
                print("capturing", flush=True)
                await anyio.sleep_forever()
            return await real(path, **kw)

        fs.read_file = read_file
        await service.take_version(project, ws)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
