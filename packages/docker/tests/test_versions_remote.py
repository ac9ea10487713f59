"""Versions on a remote engine (ssh://): the archive endpoints feed posix-core's store.

The versions conformance rules run against a provider bound to the real
engine reached over ssh (the CI script's sshd; ``CORRAL_REQUIRE_SSH=1`` makes
a missing endpoint fail). (The older ``snapshot.*`` rules also resolve a ref
while its first handle is open; on a remote engine that replaces the
container the first handle uses -- a lifecycle limit of remote workspaces
outside the version store, so they are not run here.)
"""

from __future__ import annotations

import io
import pathlib
import tarfile

import pytest

from corral.provider import OperationError
from corral_conformance import check_provider
from corral_docker import DockerProvider
from corral_docker._archive_versions import REMOTE_CAPS, manifest_from_archive, restore_archive
from corral_posix._blobstore import LocalBlobStore


@pytest.mark.docker
def test_versions_rules_pass_on_a_remote_engine(ssh_ready: str, image: str, tmp_root: str) -> None:
    report = check_provider(
        lambda: DockerProvider(image=image, tmpdir_root=tmp_root, base_url=ssh_ready),
        rules=("snapshot.versions",),
        shrink=False,
        max_examples=5,
    )
    assert report.ok, {r.rule: r.reason for r in report.failed}
    ran = {r.rule for r in report.results if r.status == "pass"}
    assert {
        "reading_a_version_equals_restoring_it",
        "restore_by_difference_is_exact",
        "restore_by_difference_brings_back_modes",
        "diff_lists_exactly_what_changed",
        "branch_and_origin_never_change_the_version",
        "reading_versions_reports_errors",
        "damaged_versions_fail_cleanly",
    } <= ran, sorted(ran)


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
