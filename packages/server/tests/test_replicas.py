"""Two real ``corral serve`` processes on one PostgreSQL: one live box per workspace, always."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from corral_server import ApiError, Client
from server_support import PostgresCluster, ServerProcess

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _boxes(root: Path) -> list[str]:
    """Live local-bash workspace directories under the provider's root."""
    found = []
    for base in root.iterdir():
        found += [d for d in os.listdir(base) if d.startswith("ws-")] if base.is_dir() else []
    return found


def test_two_replicas_never_double_materialize(tmp_path: Path, pg_cluster: PostgresCluster) -> None:
    url = pg_cluster.new_database()
    boxes = tmp_path / "boxes"
    boxes.mkdir()
    shared = [
        "--store",
        url,
        "--blobs",
        str(tmp_path / "blobs"),
        "--lease-ttl",
        "2",
        "--idle-stop",
        "0",
        "--provider",
        "local-bash=" + json.dumps({"tmpdir_root": str(boxes)}),
    ]
    a = ServerProcess(tmp_path / "a", *shared, "--replica-id", "A")
    b = ServerProcess(tmp_path / "b", *shared, "--replica-id", "B")
    try:
        token = (tmp_path / "a" / "token").read_text().strip()
        ca, cb = Client(a.url, token), Client(b.url, token)
    except BaseException:
        a.stop()
        b.stop()
        raise
    try:
        sandbox: dict[str, Any] = {"provider": "local-bash", "capabilities": ["fs", "shell"]}
        ws = ca.create(sandbox)["id"]
        assert cb.get(ws)["id"] == ws  # one shared state
        results = []
        for client in (ca, cb, ca, cb):
            try:
                results.append(client.connect(ws)["holder"])
            except ApiError as exc:
                results.append(exc.code)
        assert results == ["A", "busy", "A", "busy"]
        assert len(_boxes(boxes)) == 1
        # A stops (taking a version): B may now materialise it, from that version.
        assert ca.stop(ws)["version_id"]
        assert cb.connect(ws)["holder"] == "B"
        assert len(_boxes(boxes)) == 1
        # B dies without a word: A is refused until B's lease expires, then
        # resumes B's box (its ref is on the lease) instead of opening a second.
        b.kill()
        with pytest.raises(ApiError) as err:
            ca.connect(ws)
        assert err.value.code == "busy"
        import time

        deadline = time.monotonic() + 20
        while True:
            try:
                assert ca.connect(ws)["holder"] == "A"
                break
            except ApiError as exc:
                if exc.code != "busy" or time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        assert len(_boxes(boxes)) == 1
    finally:
        ca.close()
        cb.close()
        a.stop()
        b.stop()
