"""Remote engines (ssh://): the conformance rules that resolve refs, and the version store.

The snapshot, lifecycle and refs conformance families run against a
provider bound to the real engine reached over ssh (the CI script's sshd;
``CORRAL_REQUIRE_DOCKER=1 CORRAL_REQUIRE_SSH=1`` make a missing endpoint
fail). Many of those rules resolve a ref while the handle that opened it is
still open: on a remote engine the file system goes through the container,
so the second handle must join the live container, never replace it (see
:mod:`corral_docker._container`). A process killed in the middle of a
snapshot leaves a version store a fresh process resolves consistently.
"""

from __future__ import annotations

import io
import pathlib
import random
import signal
import subprocess
import sys
import tarfile
import textwrap

import anyio
import pytest

import corral
from corral.provider import OperationError
from corral_conformance import check_provider
from corral_docker import DockerProvider
from corral_docker._archive_versions import REMOTE_CAPS, manifest_from_archive, restore_archive
from corral_posix._blobstore import LocalBlobStore

_VERSION_RULES = {
    "reading_a_version_equals_restoring_it",
    "restore_by_difference_is_exact",
    "restore_by_difference_brings_back_modes",
    "diff_lists_exactly_what_changed",
    "branch_and_origin_never_change_the_version",
    "reading_versions_reports_errors",
    "damaged_versions_fail_cleanly",
}
_RESOLVING_RULES = {
    # Each resolves a ref, the first three while the handle that opened it is still open.
    "restore_brings_back_snapshot_state",
    "restore_is_exact_and_repeatable",
    "branch_is_a_separate_workspace",
    "close_releases_the_data",
    "resolve_after_close_reports_gone",
}


@pytest.mark.docker
@pytest.mark.slow
def test_snapshot_lifecycle_and_refs_rules_pass_on_a_remote_engine(
    ssh_ready: str, image: str, tmp_root: str
) -> None:
    report = check_provider(
        lambda: DockerProvider(image=image, tmpdir_root=tmp_root, base_url=ssh_ready),
        rules=("snapshot", "lifecycle", "refs"),
        shrink=False,
        max_examples=3,
    )
    assert report.ok, {r.rule: r.reason for r in report.failed}
    ran = {r.rule for r in report.results if r.status == "pass"}
    wanted = _VERSION_RULES | _RESOLVING_RULES
    assert ran >= wanted, sorted(wanted - ran)


_SNAPSHOTTING_CHILD = textwrap.dedent(
    """
    import sys, anyio, corral
    from corral_docker import DockerProvider

    async def main():
        provider = DockerProvider(image=sys.argv[1], tmpdir_root=sys.argv[2], base_url=sys.argv[3])
        caps = frozenset({"fs", "snapshot"})
        config = corral.ProviderConfig("docker")
        opened = await provider.open(config, corral.SessionRef("crash"), caps)
        fs, snap = opened.workspace.fs, opened.workspace.snapshot
        print(corral.ref_to_json(opened.ref), flush=True)
        for i in range(1000):
            await fs.write_file(f"/f{i % 7}.txt", f"round {i}".encode() * (i + 1))
            await fs.write_file(f"/dir{i}/new.txt", str(i).encode())
            info = await snap.snapshot(f"round {i}")
            print(f"{info.snapshot_id} {i}", flush=True)

    anyio.run(main)
    """
)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.anyio
async def test_a_snapshot_killed_midway_leaves_a_consistent_store(
    ssh_ready: str, image: str, tmp_root: str
) -> None:
    """SIGKILL while snapshots run; a fresh process sees every acknowledged version, whole."""
    child = subprocess.Popen(
        [sys.executable, "-c", _SNAPSHOTTING_CHILD, image, tmp_root, ssh_ready],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: dict[str, int] = {}
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else ""
        ref = corral.ref_from_json(line)
        while len(acked) < 2:
            line = child.stdout.readline()
            assert line, child.stderr.read() if child.stderr else "the child died"
            sid, round_ = line.split()
            acked[sid] = int(round_)
        # Somewhere inside the next snapshot (each takes a few hundred ms over ssh).
        await anyio.sleep(random.uniform(0.0, 0.8))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert child.stdout is not None
    for line in child.stdout.read().splitlines():  # acknowledged before the kill landed
        sid, round_ = line.split()
        acked[sid] = int(round_)
    for stream in (child.stdout, child.stderr):
        if stream is not None:
            stream.close()

    provider = DockerProvider(image=image, tmpdir_root=tmp_root, base_url=ssh_ready)
    ws = await provider.resolve(ref)
    try:
        snap = ws.snapshot
        assert isinstance(snap, corral.provider.Versions)
        listed = {info.snapshot_id: info.label for info in await snap.list()}
        assert set(acked) <= set(listed), "an acknowledged version was lost"
        for sid in listed:
            # Every visible version is whole: each file reads back and verifies.
            round_ = int(str(listed[sid]).split()[1])
            for i in range(min(round_ + 1, 7)):
                last = max(r for r in range(round_ + 1) if r % 7 == i)
                want = f"round {last}".encode() * (last + 1)
                assert await snap.read_file_at(sid, f"/f{i}.txt") == want
            assert await snap.read_file_at(sid, f"/dir{round_}/new.txt") == str(round_).encode()
        latest = max(listed, key=lambda sid: int(str(listed[sid]).split()[1]))
        round_ = int(str(listed[latest]).split()[1])
        await snap.restore(latest)
        assert ws.fs is not None
        dirs = {e.name for e in await ws.fs.ls("/") if e.name.startswith("dir")}
        assert dirs == {f"dir{r}" for r in range(round_ + 1)}
        # The workspace keeps working: a new version after the crash.
        await snap.snapshot("after the crash")
    finally:
        await ws.close()
        await provider.aclose()


def _archive(*members: tuple[str, str, bytes | str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "d":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "l":
                info.type = tarfile.SYMTYPE
                info.linkname = str(payload)
                tar.addfile(info)
            elif kind == "h":
                info.type = tarfile.LNKTYPE
                info.linkname = str(payload)
                tar.addfile(info)
            elif kind == "p":
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
            else:
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_hostile_archive_never_names_an_entry_outside_the_workspace() -> None:
    raw = _archive(
        ("workspace", "d", b""),
        ("workspace/ok", "f", b"ok"),
        ("workspace/../etc/passwd", "f", b"x"),
        ("/etc/shadow", "f", b"x"),
        ("workspace/missing/parent", "f", b"x"),
        ("workspace/ok/under-a-file", "f", b"x"),
        ("workspace/ok", "f", b"duplicate"),
        ("workspace/fifo", "p", b""),
        ("workspace/link", "l", "/etc/passwd"),
        ("workspace/hard", "h", "workspace/ok"),
    )
    manifest, skipped = manifest_from_archive(raw, None, REMOTE_CAPS)
    assert sorted(manifest.name[1:]) == ["hard", "link", "ok"]
    assert manifest.data[manifest.name.index("link")] == "/etc/passwd"  # data, never followed
    assert manifest.size[manifest.name.index("hard")] == 2
    assert len(skipped) == 6


def test_an_archive_over_the_caps_is_refused() -> None:
    raw = _archive(("workspace", "d", b""), ("workspace/a", "f", b"x" * 100))
    caps = REMOTE_CAPS.__class__(max_entries=10, max_bytes=50, max_file_bytes=1000)
    with pytest.raises(OperationError) as caught:
        manifest_from_archive(raw, None, caps)
    assert caught.value.code == "too_large"
    with pytest.raises(OperationError):
        manifest_from_archive(b"not a tar" * 100, None, REMOTE_CAPS)


def test_restore_puts_only_what_differs(tmp_path: pathlib.Path) -> None:
    store = LocalBlobStore(str(tmp_path / "store"))
    target, _ = manifest_from_archive(
        _archive(
            ("workspace", "d", b""),
            ("workspace/same", "f", b"same"),
            ("workspace/changed", "f", b"old"),
            ("workspace/gone", "f", b"deleted since"),
            ("workspace/dir", "d", b""),
            ("workspace/dir/x", "f", b"x"),
            ("workspace/link", "l", "same"),
        ),
        store,
        REMOTE_CAPS,
    )
    live, _ = manifest_from_archive(
        _archive(
            ("workspace", "d", b""),
            ("workspace/same", "f", b"same"),
            ("workspace/changed", "f", b"new"),
            ("workspace/extra", "d", b""),
            ("workspace/extra/deep", "f", b"added since"),
            ("workspace/dir", "f", b"now a file"),
            ("workspace/link", "l", "elsewhere"),
        ),
        None,
        REMOTE_CAPS,
    )
    removals, archive = restore_archive(live, target, store, "snap-x", (1000, 1000))
    assert removals == ["./extra"]
    assert archive is not None
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == ["changed", "dir", "dir/x", "gone", "link"]
        assert {(m.uid, m.gid) for m in members.values()} == {(1000, 1000)}
        changed = tar.extractfile(members["changed"])
        assert changed is not None
        assert changed.read() == b"old"
    assert members["link"].linkname == "same"
    blob = next(p for p in (tmp_path / "store").glob("??/*") if p.read_bytes() == b"old")
    blob.unlink()
    with pytest.raises(OperationError, match=r"snap-x.*/changed"):
        restore_archive(live, target, store, "snap-x", (1000, 1000))
