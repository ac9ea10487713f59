"""ContainerFileSystem: the workspace's files reached through its container.

Used on remote engines, where the workspace is a named volume the host
cannot see. Every operation is one small POSIX ``sh`` program exec'd as the
container's unprivileged user (so permissions are exactly those of the
agent's own commands), plus ``put_archive`` to upload new file content,
which is then renamed into place for atomicity. Paths never go through a
symlink: the program checks every parent component. A race with a command
swapping a directory for a symlink can only redirect an operation to another
path inside the same container, which the agent's shell can reach anyway.
"""

from __future__ import annotations

import io
import secrets
import tarfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

import attrs

from corral.provider import (
    ErrorCode,
    FileEntry,
    FileStat,
    GrepMatch,
    GrepOptions,
    GrepResult,
    Matcher,
    OperationError,
    WorkspaceEvictedError,
    apply_edit,
    glob_match,
    is_binary,
    join_path,
    path_parts,
)

from ._engine import (
    ContainerNotFoundError,
    DockerEngine,
    EngineError,
    EngineUnavailableError,
    ExecOutput,
)
from ._fs_script import FS_SCRIPT
from ._options import WORKDIR, DockerOptions

__all__ = ["ContainerFileSystem", "init_volume"]

_CODES: Final[dict[int, tuple[ErrorCode, str]]] = {
    10: ("not_found", "does not exist"),
    11: ("exists", "already exists"),
    12: ("is_a_directory", "is a directory"),
    13: ("not_a_directory", "has a non-directory where a directory is needed"),
    14: ("not_empty", "is a non-empty directory"),
    15: ("unsupported_file_type", "is not a regular file"),
    16: ("too_large", "is over the file size limit"),
    17: ("permission_denied", "is not accessible"),
    18: ("invalid_path", "is or goes through a symlink that is not allowed here"),
}
_LISTING_CAP: Final = 64 * 1024 * 1024
_TAR_BATCH: Final = 256


def _kind(mode: int) -> str:
    fmt = mode & 0o170000
    return {0o100000: "file", 0o040000: "dir", 0o120000: "symlink"}.get(fmt, "other")


def _where(parts: Sequence[str]) -> str:
    return "/" + "/".join(parts)


async def init_volume(
    engine: DockerEngine, opts: DockerOptions, volume: str, labels: Mapping[str, str]
) -> None:
    """Give a fresh volume's root to the container user.

    A volume starts root-owned unless the image has a ``/workspace`` to copy;
    a one-shot container (no network, only ``CAP_CHOWN``/``CAP_FOWNER``)
    fixes that once, at open.
    """
    from ._engine import MountSpec
    from ._options import build_container_spec

    spec = build_container_spec(
        attrs.evolve(opts, user="0:0", cap_add=("CHOWN", "FOWNER")),
        name=f"{volume}-init-{secrets.token_hex(3)}",
        labels={**labels, "io.corral.managed": "1", "io.corral.init": volume},
        mount=MountSpec("volume", volume, WORKDIR),
    )
    cid = await engine.create(spec)
    try:
        await engine.start(cid)
        out = await engine.exec(
            cid,
            ["sh", "-c", 'chown "$1" /workspace && chmod 0755 /workspace', "init", opts.user],
            env={},
            workdir="/",
            user="0:0",
            max_output_bytes=4096,
        )
        if out.exit_code is None:
            raise EngineError("could not prepare the workspace volume: no exit status came back")
        if out.exit_code != 0:
            raise EngineError(
                f"could not prepare the workspace volume (the chown exited {out.exit_code})"
            )
    finally:
        await engine.remove(cid)


class ContainerFileSystem:
    """The FileSystem of a workspace living in a volume of a (remote) container.

    Args:
        engine: The engine that runs the container.
        container: Returns the live container id.
        user: ``UID:GID`` the operations run as.
        max_file_bytes: Largest file read or written.
        closed: Returns True once the workspace closed.
        max_walk_entries: Cap on entries a listing, glob or grep may visit.
    """

    def __init__(
        self,
        engine: DockerEngine,
        container: Callable[[], Awaitable[str]],
        *,
        user: str,
        max_file_bytes: int,
        closed: Callable[[], bool] = lambda: False,
        max_walk_entries: int = 100_000,
    ) -> None:
        self._engine = engine
        self._container = container
        self._user = user
        self._uid, _, gid = user.partition(":")
        self._gid = gid or self._uid
        self._max = max_file_bytes
        self._closed = closed
        self._max_entries = max_walk_entries

    # -- plumbing ----------------------------------------------------------

    async def _cid(self) -> str:
        if self._closed():
            raise OperationError("the workspace is closed", code="closed")
        return await self._container()

    def _engine_error(self, exc: EngineError) -> Exception:
        if isinstance(exc, ContainerNotFoundError):
            return WorkspaceEvictedError(
                "docker: the workspace container is gone", provider_id="docker"
            )
        return OperationError(f"docker: {exc.message}", code="failed")

    async def _run(
        self, op: str, parts: Sequence[str], *args: str, cap: int = 1 << 20
    ) -> ExecOutput:
        cid = await self._cid()
        try:
            return await self._engine.exec(
                cid,
                ["sh", "-c", FS_SCRIPT, "corral-fs", op, "/".join(parts), *args],
                env={},
                workdir="/",
                user=self._user,
                max_output_bytes=cap,
            )
        except EngineError as exc:
            raise self._engine_error(exc) from None

    def _check(self, out: ExecOutput, parts: Sequence[str]) -> None:
        if out.exit_code == 0:
            return
        code, words = _CODES.get(out.exit_code or -1, ("failed", "could not be accessed"))
        raise OperationError(f"{_where(parts)} {words}", code=code)

    async def _entries(self, op: str, parts: Sequence[str]) -> list[tuple[str, int, int, float]]:
        out = await self._run(op, parts, cap=_LISTING_CAP)
        self._check(out, parts)
        if out.stdout_truncated:
            raise OperationError(
                f"{_where(parts)} holds too many entries; narrow the path", code="too_large"
            )
        entries: list[tuple[str, int, int, float]] = []
        for batch in out.stdout.split(b"\x02"):
            if not batch:
                continue
            meta, _, names = batch.partition(b"\x01")
            lines = meta.decode().split("\n")[:-1]
            paths = names.split(b"\x00")[:-1]
            if len(lines) != len(paths):
                raise OperationError(
                    f"{_where(parts)} changed while it was listed; retry", code="failed"
                )
            for line, raw in zip(lines, paths, strict=True):
                mode_hex, size, mtime = line.split()
                rel = raw.decode("utf-8", "surrogateescape").removeprefix("./")
                entries.append((rel, int(mode_hex, 16), int(size), float(mtime)))
        if len(entries) > self._max_entries:
            raise OperationError(
                f"{_where(parts)} holds more than {self._max_entries} entries; narrow the path",
                code="too_large",
            )
        entries.sort()
        return entries

    # -- FileSystem ----------------------------------------------------------

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Return a regular file's content (``cat`` as the container user)."""
        parts = path_parts(path)
        if not parts:
            raise OperationError("/ is a directory", code="is_a_directory")
        cap = self._max if max_bytes is None else min(max_bytes, self._max)
        out = await self._run("read", parts, str(cap), cap=cap + 1)
        self._check(out, parts)
        if out.stdout_truncated or len(out.stdout) > cap:
            raise OperationError(f"{_where(parts)} is over the file size limit", code="too_large")
        return out.stdout

    async def write_file(self, path: str, data: bytes) -> None:
        """Upload to a temporary name beside the target, then rename it into place."""
        parts = path_parts(path)
        if not parts:
            raise OperationError("/ is a directory", code="is_a_directory")
        if len(data) > self._max:
            raise OperationError(
                f"{_where(parts)}: {len(data)} bytes is over the {self._max}-byte limit",
                code="too_large",
            )
        tmp = f".corral-{secrets.token_hex(8)}.tmp"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(tmp)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = int(time.time())
            info.uid, info.gid = int(self._uid), int(self._gid)
            tar.addfile(info, io.BytesIO(data))
        parent = WORKDIR + "".join("/" + p for p in parts[:-1])
        # Optimistic upload first (one round trip less on remote engines); a
        # missing parent is created by "prepw", which also reports a file or
        # symlink in the way. "commit" re-checks the parents before renaming.
        if not await self._put(parent, buf.getvalue()):
            self._check(await self._run("prepw", parts), parts)
            if not await self._put(parent, buf.getvalue()):
                raise OperationError(f"{_where(parts)} could not be written", code="failed")
        self._check(await self._run("commit", parts, tmp), parts)

    async def _put(self, parent: str, data: bytes) -> bool:
        cid = await self._cid()
        try:
            await self._engine.put_archive(cid, parent, data)
        except EngineUnavailableError as exc:
            raise self._engine_error(exc) from None
        except EngineError:
            # A missing parent (404), a file or read-only path in the way (the
            # daemon says 500 for those): the caller runs "prepw", which names
            # the problem (or evicts when the container is gone), then retries.
            return False
        return True

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Replace text in a UTF-8 file (read, replace, atomic write)."""
        if not old_text:
            raise OperationError("old_text must not be empty", code="invalid_argument")
        parts = path_parts(path)
        raw = await self.read_file(path)
        data, count = apply_edit(
            raw, old_text, new_text, replace_all=replace_all, where=_where(parts)
        )
        await self.write_file(path, data)
        return count

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        """List a directory, sorted by name; symlinks are not followed."""
        parts = path_parts(path)
        base = _where(parts)
        out = []
        for rel, mode, size, _mtime in await self._entries("list", parts):
            kind = _kind(mode)
            out.append(
                FileEntry(
                    name=rel,
                    path=join_path(base, rel),
                    type=kind,  # type: ignore[arg-type]
                    size=size if kind == "file" else 0,
                )
            )
        return sorted(out, key=lambda e: e.name)

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        """Paths under ``path`` whose relative path matches ``pattern``."""
        parts = path_parts(path)
        base = _where(parts)
        st = await self.stat(path)
        if st.type != "dir":
            raise OperationError(f"{base} is not a directory", code="not_a_directory")
        return sorted(
            join_path(base, rel)
            for rel, _m, _s, _t in await self._entries("walk", parts)
            if glob_match(pattern, rel)
        )

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Search regular files under ``options.path`` line by line."""
        if options.max_results < 1:
            raise OperationError("max_results must be at least 1", code="invalid_argument")
        parts = path_parts(options.path)
        base = _where(parts)
        st = await self.stat(options.path)
        skipped: list[str] = []
        candidates: list[tuple[str, str]] = []  # (container-relative, agent path)

        def wanted(name: str, rel: str) -> bool:
            if options.glob is None:
                return True
            return glob_match(options.glob, rel if "/" in options.glob else name)

        if st.type == "dir":
            for rel, mode, size, _t in await self._entries("walk", parts):
                if _kind(mode) != "file" or not wanted(rel.rsplit("/", 1)[-1], rel):
                    continue
                agent = join_path(base, rel)
                if size > self._max:
                    skipped.append(agent)
                else:
                    candidates.append(("/".join((*parts, rel)), agent))
        elif st.type == "file" and parts and wanted(parts[-1], parts[-1]):
            if st.size > self._max:
                skipped.append(base)
            else:
                candidates.append(("/".join(parts), base))
        elif st.type == "symlink":
            raise OperationError(f"{base} {_CODES[18][1]}", code="invalid_path")
        matches: list[GrepMatch] = []
        binary: list[str] = []
        truncated = False
        for start in range(0, len(candidates), _TAR_BATCH):
            batch = candidates[start : start + _TAR_BATCH]
            contents = await self._fetch([c for c, _ in batch])
            for rel, agent in batch:
                data = contents.get(rel)
                if data is None:
                    skipped.append(agent)
                    continue
                if is_binary(data):
                    binary.append(agent)
                    continue
                room = options.max_results - len(matches)
                found = matcher.search_lines(data.decode("utf-8", errors="replace"), room + 1)
                if len(found) > room:
                    truncated = True
                    found = found[:room]
                matches.extend(GrepMatch(agent, n, line) for n, line in found)
                if truncated:
                    break
            if truncated:
                break
        return GrepResult(
            matches=tuple(matches),
            skipped_paths=tuple(sorted(skipped)),
            skipped_binary_paths=tuple(sorted(binary)),
            truncated=truncated,
        )

    async def _fetch(self, rels: Sequence[str]) -> dict[str, bytes]:
        cap = min(_LISTING_CAP, (self._max + 1024) * len(rels) + 1024 * 1024)
        out = await self._run("tar", (), *rels, cap=cap)
        result: dict[str, bytes] = {}
        if out.stdout_truncated:
            return result
        with tarfile.open(fileobj=io.BytesIO(out.stdout), mode="r:", ignore_zeros=True) as tar:
            for member in tar:
                if member.isfile() and member.size <= self._max:
                    fh = tar.extractfile(member)
                    if fh is not None:
                        result[member.name.removeprefix("./")] = fh.read()
        return result

    async def stat(self, path: str) -> FileStat:
        """Describe a path without following a leaf symlink."""
        parts = path_parts(path)
        out = await self._run("stat", parts)
        self._check(out, parts)
        mode_hex, size, mtime = out.stdout.decode().split()
        mode = int(mode_hex, 16)
        kind = _kind(mode)
        return FileStat(
            path=_where(parts),
            type=kind,  # type: ignore[arg-type]
            size=int(size) if kind == "file" else 0,
            mtime=float(mtime),
            mode=mode & 0o7777,
        )

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory (and its parents when asked)."""
        parts = path_parts(path)
        if not parts:
            if parents:
                return
            raise OperationError("/ already exists", code="exists")
        self._check(await self._run("mkdir", parts, "1" if parents else "0"), parts)

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, symlink or directory."""
        parts = path_parts(path)
        if not parts:
            raise OperationError("the workspace root cannot be removed", code="invalid_argument")
        self._check(await self._run("rm", parts, "1" if recursive else "0"), parts)

    def close(self) -> None:
        """Nothing to release: every operation is a self-contained exec."""
