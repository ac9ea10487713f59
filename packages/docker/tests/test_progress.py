"""Progress of an image pull (fake engine and the SDK's stream) and of docker's restore.

No registry is reachable from the test machines, so a real pull cannot run
here: the pull stream is played by the fake engine and, for the real
adapter, by a stand-in for the SDK's low-level client; the restore's
progress is checked against the real engine too.
"""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest

import corral
from corral.provider import CommandRequest, Progress
from corral_docker import DockerProvider, FakeDockerEngine, ImageNotFoundError, SdkEngine

pytestmark = pytest.mark.anyio

IMAGE = "corral-test:latest"
LAYERS = (3 << 20, 5 << 20, 1 << 20, 700)


class Recorder:
    def __init__(self) -> None:
        self.seen: list[Progress] = []
        self._lock = threading.Lock()

    def __call__(self, progress: Progress) -> None:
        with self._lock:
            self.seen.append(progress)

    def of(self, operation: str) -> list[Progress]:
        return [p for p in self.seen if p.operation == operation]


def check_pull(reports: list[Progress], total: int) -> None:
    assert reports, "the pull reported nothing"
    assert all(p.unit == "bytes" for p in reports)
    assert [p.done for p in reports] == sorted(p.done for p in reports)
    assert all(p.total is not None and p.done <= p.total <= total for p in reports)
    *running, last = reports
    assert not any(p.finished for p in running)
    assert last.finished
    assert last.done == last.total == total


async def test_a_pull_at_open_reports_bytes_to_the_total(tmp_root: str) -> None:
    fake = FakeDockerEngine(images=[], pullable=[IMAGE], pull_layers=LAYERS)
    record = Recorder()
    provider = DockerProvider(engine=fake, tmpdir_root=tmp_root, image=IMAGE)
    async with corral.open_workspace(provider, {"fs": True}, on_progress=record) as ws:
        assert IMAGE in fake.images
        check_pull(record.of("pull"), sum(LAYERS))
        # Opened: the next calls pull nothing more.
        before = len(record.seen)
        await ws.call("workspace_write_file", {"path": "/a", "content": "a"}, raise_on_error=True)
        assert len(record.seen) == before


async def test_a_lazy_open_reports_the_pull_during_the_first_call(tmp_root: str) -> None:
    fake = FakeDockerEngine(images=[], pullable=[IMAGE], pull_layers=LAYERS)
    record = Recorder()
    provider = DockerProvider(engine=fake, tmpdir_root=tmp_root, image=IMAGE)
    async with corral.open_workspace(
        provider, {"fs": True}, on_progress=record, open_strategy="lazy"
    ) as ws:
        assert record.seen == []
        await ws.call("workspace_write_file", {"path": "/a", "content": "a"}, raise_on_error=True)
        check_pull(record.of("pull"), sum(LAYERS))


async def test_a_raising_callback_does_not_break_the_pull(tmp_root: str) -> None:
    fake = FakeDockerEngine(images=[], pullable=[IMAGE], pull_layers=LAYERS)

    def broken(progress: Progress) -> None:
        raise RuntimeError("observer bug")

    provider = DockerProvider(engine=fake, tmpdir_root=tmp_root, image=IMAGE)
    async with corral.open_workspace(provider, {"fs": True}, on_progress=broken) as ws:
        result = await ws.call("workspace_write_file", {"path": "/a", "content": "a"})
        assert not result.is_error
    assert IMAGE in fake.images


async def test_restore_through_docker_reports_entries(
    fake: FakeDockerEngine, tmp_root: str
) -> None:
    record = Recorder()
    provider = DockerProvider(engine=fake, tmpdir_root=tmp_root, image=IMAGE)
    async with corral.open_workspace(
        provider, {"fs": True, "snapshot": True}, on_progress=record
    ) as ws:
        root = pathlib.Path((await ws.workspace()).details()["root"])
        for i in range(200):
            (root / f"f{i:03d}").write_text(str(i))
        snap = await ws.call("workspace_snapshot", {}, raise_on_error=True)
        (root / "f000").unlink()
        await ws.call(
            "workspace_restore", {"snapshot_id": snap.data["snapshot_id"]}, raise_on_error=True
        )
        assert (root / "f000").read_text() == "0"
    restores = record.of("restore")
    assert restores[-1].finished
    assert restores[-1].done == restores[-1].total == 200
    assert all(p.total == 200 for p in restores)


class StreamingApi:
    """Stands in for docker.APIClient: the image is missing and a pull streams ``events``."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.pulls: list[tuple[str, dict[str, Any]]] = []

    def inspect_image(self, image: str) -> None:
        raise docker.errors.ImageNotFound("missing")

    def pull(self, repo: str, **kw: Any) -> Iterator[dict[str, Any]]:
        self.pulls.append((repo, kw))
        return iter(self.events)


def _sdk(api: StreamingApi) -> SdkEngine:
    engine = SdkEngine("unix:///nonexistent.sock")
    engine._client = api  # the one client the engine would have built
    return engine


async def test_the_sdk_engine_reads_the_pull_stream_into_progress() -> None:
    api = StreamingApi(FakeDockerEngine(pull_layers=LAYERS).pull_events())
    record = Recorder()
    with corral.reporting_progress(record):
        await _sdk(api).ensure_image("example.org/team/img:1.2", pull=True)
    assert api.pulls == [("example.org/team/img", {"tag": "1.2", "stream": True, "decode": True})]
    check_pull(record.of("pull"), sum(LAYERS))


async def test_an_error_inside_the_pull_stream_fails_without_echoing_it() -> None:
    events = [
        *FakeDockerEngine(pull_layers=(1000,)).pull_events()[:3],
        {"error": "secret-registry-text", "errorDetail": {"message": "secret-registry-text"}},
    ]
    record = Recorder()
    with corral.reporting_progress(record), pytest.raises(ImageNotFoundError) as caught:
        await _sdk(StreamingApi(events)).ensure_image("img", pull=True)
    assert "img" in caught.value.message
    assert "secret-registry-text" not in str(caught.value)
    assert not any(p.finished for p in record.seen)  # a failed pull has no final report


@pytest.mark.docker
async def test_restore_on_the_real_engine_reports_entries(
    docker_ready: None, image: str, tmp_root: str
) -> None:
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    got = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("progress"))
    ws = got.workspace
    try:
        assert ws.shell is not None
        made = await ws.shell.run(
            CommandRequest(
                "for d in 1 2 3 4 5; do mkdir d$d; for f in $(seq 100); do echo $f > d$d/$f; "
                "done; done",
                allow_shell_syntax=True,
            )
        )
        assert made.exit_code == 0, made.stderr
        snap = ws.snapshot
        assert snap is not None
        record = Recorder()
        info = await snap.snapshot(on_progress=record)  # type: ignore[call-arg]
        await ws.shell.run(CommandRequest("rm -r d1", allow_shell_syntax=True))
        await snap.restore(info.snapshot_id, on_progress=record)  # type: ignore[call-arg]
        for operation in ("snapshot", "restore"):
            reports = record.of(operation)
            assert [p.done for p in reports] == sorted(p.done for p in reports)
            assert reports[-1].finished
            assert reports[-1].done == reports[-1].total == 505
    finally:
        await ws.close()
        await provider.aclose()
