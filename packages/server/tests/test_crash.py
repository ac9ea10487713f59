"""SIGKILL the server during exec output, version creation and materialization; restart; check.

What must hold after every kill and restart: every byte of output a client
was given is still there at the same cursor; every acknowledged version is
readable and current-or-older; a handle whose process died unobserved reads
``lost``; the workspace works (connect, exec).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import time
from pathlib import Path

import pytest

from corral_server import Client
from server_support import Box

pytestmark = pytest.mark.slow


SANDBOX = {"provider": "local-bash", "capabilities": ["fs", "shell", "process"]}
LINES = 3000
SCRIPT = f"for i in $(seq 1 {LINES}); do echo line$i; done; sleep 0.5; echo done"


def _expected() -> bytes:
    return b"".join(f"line{i}\n".encode() for i in range(1, LINES + 1)) + b"done\n"


def test_kill_during_exec_output_loses_no_acknowledged_byte(tmp_path: Path) -> None:
    # local-bash's processes die with the program that started them (their
    # process host kills the tree and records ``lost``): after a SIGKILL of
    # the server, the output retained up to then is intact and the handle
    # says ``lost``.
    rng = random.Random(1234)
    box = Box(tmp_path)
    try:
        c = box.start()
        ws = c.create(SANDBOX)["id"]
        for _round in range(2):
            h = c.exec(ws, SCRIPT)["id"]
            got, cursor = b"", 0
            for _ in range(rng.randint(1, 4)):
                data, cursor, _ended = c.read(
                    ws, h, cursor=cursor, max_bytes=rng.randint(50, 4000), wait_s=2
                )
                got += data
            box.kill()
            c = box.start()
            full = b"".join(c.output(ws, h))
            assert full.startswith(got)
            assert _expected().startswith(full)
            info = c.request("GET", f"/v1/workspaces/{ws}/handles/{h}")
            assert info["state"] in ("lost", "exited")
            assert info["stdout_end"] == len(full)
            if info["state"] == "exited":
                assert full == _expected()
        h = c.exec(ws, "echo alive")["id"]
        c.wait(ws, h, timeout_s=30)
        assert b"".join(c.output(ws, h)) == b"alive\n"
    finally:
        box.stop()


def test_kill_during_version_creation_keeps_acknowledged_versions(tmp_path: Path) -> None:
    rng = random.Random(99)
    box = Box(tmp_path)
    try:
        c = box.start()
        ws = c.create(SANDBOX)["id"]
        h = c.exec(
            ws, "mkdir -p d && for i in $(seq 1 200); do echo $i > d/f$i; done; echo v1 > v"
        )["id"]
        c.wait(ws, h, timeout_s=30)
        acked = c.stop(ws)["version_id"]
        assert c.read_file(ws, "/v") == b"v1\n"
        for _round in range(2):
            h = c.exec(ws, "echo v2 > v")["id"]
            c.wait(ws, h, timeout_s=30)
            import threading

            t = threading.Thread(target=_quiet, args=(c.stop, ws))
            t.start()
            time.sleep(rng.uniform(0.0, 0.15))
            box.kill()
            t.join()
            c = box.start()
            current = c.get(ws)["current_version_id"]
            # The acknowledged version is intact, and whatever is current reads whole.
            assert c.read_file(ws, "/v", version_id=acked) == b"v1\n"
            assert c.read_file(ws, "/v") in (b"v1\n", b"v2\n")
            assert len(c.ls(ws, "/d")) == 200
            assert current in list(_versions(c, ws))
            # Usable: connect and run.
            h = c.exec(ws, "cat v")["id"]
            c.wait(ws, h, timeout_s=30)
            assert b"".join(c.output(ws, h)) in (b"v1\n", b"v2\n")
    finally:
        box.stop()


def test_kill_during_materialization_then_usable(tmp_path: Path) -> None:
    rng = random.Random(7)
    box = Box(tmp_path)
    try:
        c = box.start()
        ws = c.create(SANDBOX)["id"]
        h = c.exec(ws, "echo keep > k")["id"]
        c.wait(ws, h, timeout_s=30)
        c.stop(ws)
        import threading

        t = threading.Thread(target=_quiet, args=(c.connect, ws))
        t.start()
        time.sleep(rng.uniform(0.0, 0.1))
        box.kill()
        t.join()
        c = box.start()
        c.connect(ws)
        h = c.exec(ws, "cat k")["id"]
        c.wait(ws, h, timeout_s=30)
        assert b"".join(c.output(ws, h)) == b"keep\n"
        live = [d for d in os.listdir(next(box.boxes.iterdir())) if d.startswith("ws-")]
        assert len(live) == 1  # a box the killed open left is found by its ref and discarded
    finally:
        box.stop()


def test_kill_between_open_and_recording_the_ref_leaks_no_box(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL right after ``provider.open`` made a box, before its ref is recorded."""
    box = Box(tmp_path)
    try:
        c = box.start()
        ws = c.create(SANDBOX)["id"]
        h = c.exec(ws, "echo keep > k")["id"]
        c.wait(ws, h, timeout_s=30)
        c.stop(ws)
        flag = tmp_path / "opened"
        monkeypatch.setenv("CORRAL_TEST_HANG_AFTER_OPEN", str(flag))
        box.stop()
        c = box.start()
        import threading

        t = threading.Thread(target=_quiet, args=(c.connect, ws))
        t.start()
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        box.kill()
        t.join()
        base = next(box.boxes.iterdir())
        assert len([d for d in os.listdir(base) if d.startswith("ws-")]) == 1  # the leak-to-be
        monkeypatch.delenv("CORRAL_TEST_HANG_AFTER_OPEN")
        c = box.start()
        c.connect(ws)
        h = c.exec(ws, "cat k")["id"]
        c.wait(ws, h, timeout_s=30)
        assert b"".join(c.output(ws, h)) == b"keep\n"
        live = [d for d in os.listdir(base) if d.startswith("ws-")]
        assert len(live) == 1  # the box the killed open made was reclaimed, not leaked
    finally:
        box.stop()


def test_handle_of_a_lost_box_reads_lost(tmp_path: Path) -> None:
    box = Box(tmp_path)
    try:
        c = box.start()
        ws = c.create(SANDBOX)["id"]
        h = c.exec(ws, "sleep 600")["id"]
        box.kill()
        # The machine lost the box (its directory, its process records) while the server was down.
        for base in box.boxes.iterdir():
            for d in base.iterdir():
                if d.name.startswith("ws-"):
                    shutil.rmtree(d)
        c = box.start()
        info = c.request("GET", f"/v1/workspaces/{ws}/handles/{h}")
        assert info["state"] == "lost"
        h2 = c.exec(ws, "echo alive")["id"]
        c.wait(ws, h2, timeout_s=30)
        assert b"".join(c.output(ws, h2)) == b"alive\n"
    finally:
        box.stop()


def _quiet(fn: object, *args: object) -> None:
    with contextlib.suppress(Exception):  # the server was killed under it
        fn(*args)  # type: ignore[operator]


def _versions(c: Client, ws: str) -> list[str]:
    return [v["id"] for v in c.request("GET", f"/v1/workspaces/{ws}/versions")["versions"]]
