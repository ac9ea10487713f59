"""Manifests: what one version of a workspace holds, entry by entry.

A manifest is a tree stored as a flat table: entry 0 is the root directory
and every other entry names its parent by index (parents come first), so
its size grows with the number of entries, never with their depth -- a
10,000-level tree costs 10,000 short records, not 10,000 long paths. Each
entry holds its type (``f`` file, ``d`` directory, ``l`` symlink), its
permission bits, its size, and its data: the content hash of a file (a
blob name) or the target of a symlink, stored as data and never followed.
Each entry also keeps the ``(st_mode, dev, ino, size, mtime_ns, ctime_ns)``
key it had when it was recorded, so the next snapshot (or a restore) of the
same workspace can recognise it unchanged without reading it (restic's and
git's index rule), a whole directory at a time: a directory whose live
listing equals the recorded keys of its children is taken over in bulk.

On disk (format 2) it is columnar: a count, then one length-prefixed
section per column -- integers as little-endian machine arrays, names and
data as NUL-separated UTF-8 (``surrogateescape``; names and symlink targets
cannot contain NUL). Encoding and decoding 100,000 entries is a few C-level
passes, not a Python loop per field. Format 1 (one NUL-separated string of
seven fields per entry) is still read; its keys are not trusted. The file
sits in the workspace's state area (which the workspace's user may be able
to write), so :func:`decode` treats it as hostile: every field is checked,
caps apply, and the manifest's SHA-256, recorded in the version's metadata,
is verified first.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import stat as stat_mod
import struct
import sys
from array import array
from collections.abc import Iterator
from typing import Final, Literal

import attrs

from corral.provider import FileEntry, FileStat, FileType, OperationError, VersionChange

from ._blobstore import all_blob_names

__all__ = [
    "MAGIC",
    "Builder",
    "Manifest",
    "ManifestError",
    "decode",
    "diff",
    "key_of",
    "referenced_blobs",
]

MAGIC: Final = "corral-manifest-1"
MAGIC2: Final = b"corral-manifest-2\n"
_FIELDS: Final = 7
_LEN: Final = struct.Struct("<Q")
_TYPECODES: Final = {
    "parent": "q",
    "mode": "q",
    "size": "q",
}
_INT_COLUMNS: Final = tuple(_TYPECODES)
_KEY: Final = struct.Struct("<QQQqqq")
_NO_KEY: Final = (0, 0, 0, 0, 0, 0)
Key = tuple[int, int, int, int, int, int]
"""``(st_mode, st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`` of an entry."""
key_of: Final = operator.attrgetter(
    "st_mode", "st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns"
)
"""The :data:`Key` of a stat result, built in C."""
_KINDS: Final[dict[str, FileType]] = {"f": "file", "d": "dir", "l": "symlink"}
Kind = Literal["f", "d", "l"]
_LOOKED: Final = 256


class ManifestError(Exception):
    """A stored manifest is damaged, unsafe or over a cap (the message is fixed text)."""


@attrs.define
class Manifest:
    """One version's entries as parallel columns (see the module docstring).

    Attributes:
        parent: Index of each entry's parent (``-1`` for the root).
        name: Each entry's name in its parent (``""`` for the root).
        kind: ``f``, ``d`` or ``l``.
        mode: Permission bits (``& 0o777``; never setuid, setgid or sticky).
        size: File size, or the symlink target's length; 0 for directories.
        data: Content hash of a file, target of a symlink, ``""`` for a directory.
        key: The entry's :data:`Key` when it was recorded, or None when it
            must not be trusted to recognise the entry later (written too
            close to the scan, or read from a format-1 manifest).
    """

    parent: list[int] = attrs.field(factory=list)
    name: list[str] = attrs.field(factory=list)
    kind: list[str] = attrs.field(factory=list)
    mode: list[int] = attrs.field(factory=list)
    size: list[int] = attrs.field(factory=list)
    data: list[str] = attrs.field(factory=list)
    key: list[Key | None] = attrs.field(factory=list)
    _kids: list[dict[str, int] | None] | None = attrs.field(default=None, repr=False)
    _spans: list[tuple[int, int]] | None = attrs.field(default=None, repr=False)
    _file_bytes: int | None = attrs.field(default=None, repr=False)
    _looked: dict[int, dict[str, int]] = attrs.field(factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.parent)

    @property
    def file_bytes(self) -> int:
        """Total size of the files' contents (known without a pass when a scan built it)."""
        if self._file_bytes is not None:
            return self._file_bytes
        return sum(s for s, k in zip(self.size, self.kind, strict=True) if k == "f")

    def span(self, idx: int) -> tuple[int, int] | None:
        """``(start, end)`` when an entry's children are exactly the indices ``start..end-1``.

        Scans and encoding keep every directory's entries together, so this
        holds for every manifest corral writes, and lets the walks compare a
        whole directory with C-level list slices. None when a (foreign or
        damaged) manifest scatters them; callers then compare by name.
        ``(0, 0)`` for an entry without children.
        """
        if self._spans is None:
            self._spans = _spans(self.parent)
        span = self._spans[idx]
        return None if span[0] < 0 else span

    def children(self, idx: int) -> dict[str, int]:
        """Name -> index of a directory's entries."""
        span = self.span(idx)
        if span is not None:
            start, end = span
            return dict(zip(self.name[start:end], range(start, end), strict=True))
        if self._kids is None:
            kids: list[dict[str, int] | None] = [None] * len(self.parent)
            for i, k in enumerate(self.kind):
                if k == "d":
                    kids[i] = {}
            for i in range(1, len(self.parent)):
                group = kids[self.parent[i]]
                assert group is not None
                group[self.name[i]] = i
            self._kids = kids
        group = self._kids[idx]
        return {} if group is None else group

    def child(self, idx: int, name: str) -> int | None:
        """Index of the entry ``name`` in directory ``idx``, or None.

        Reads at a version look paths up again and again, and mapping a
        directory of 1,000 entries costs about 50 us, so the maps of the
        directories looked up are kept (a bounded number; a manifest is not
        changed once built).
        """
        looked = self._looked
        kids = looked.get(idx)
        if kids is None:
            kids = self.children(idx)
            if len(looked) >= _LOOKED:
                looked.clear()
            looked[idx] = kids
        return kids.get(name)

    def lookup(self, parts: tuple[str, ...] | list[str]) -> int | None:
        """Index of the entry at an agent path's components, or None (symlinks not followed)."""
        idx = 0
        for part in parts:
            if self.kind[idx] != "d":
                return None
            nxt = self.child(idx, part)
            if nxt is None:
                return None
            idx = nxt
        return idx

    def path(self, idx: int) -> str:
        """The agent-view path of an entry."""
        names: list[str] = []
        while idx > 0:
            names.append(self.name[idx])
            idx = self.parent[idx]
        return "/" + "/".join(reversed(names))

    def type_of(self, idx: int) -> FileType:
        """corral's file type of an entry."""
        return _KINDS[self.kind[idx]]

    def stat(self, idx: int, path: str, mtime: float) -> FileStat:
        """A :class:`FileStat` of an entry (``mtime`` is the version's time)."""
        kind = self.type_of(idx)
        return FileStat(
            path=path,
            type=kind,
            size=self.size[idx] if kind == "file" else 0,
            mtime=mtime,
            mode=self.mode[idx],
        )

    def entries(self, idx: int, path: str) -> list[FileEntry]:
        """The listing of a directory entry, sorted by name."""
        base = path.rstrip("/")
        out = []
        for name, child in sorted(self.children(idx).items()):
            kind = self.type_of(child)
            out.append(
                FileEntry(
                    name=name,
                    path=f"{base}/{name}",
                    type=kind,
                    size=self.size[child] if kind == "file" else 0,
                )
            )
        return out

    def walk_files(self, idx: int) -> Iterator[tuple[int, str]]:
        """``(index, path relative to idx)`` of every file under a directory, sorted."""
        stack: list[tuple[int, str]] = [(idx, "")]
        found: list[tuple[str, int]] = []
        while stack:
            cur, rel = stack.pop()
            for name, child in self.children(cur).items():
                sub = f"{rel}/{name}" if rel else name
                if self.kind[child] == "d":
                    stack.append((child, sub))
                elif self.kind[child] == "f":
                    found.append((sub, child))
        for sub, child in sorted(found):
            yield child, sub

    def hashes(self) -> set[str]:
        """Every blob this manifest refers to."""
        return {d for d, k in zip(self.data, self.kind, strict=True) if k == "f"}

    def encode(self) -> bytes:
        """The on-disk form (format 2, see the module docstring)."""
        parts = [MAGIC2, _LEN.pack(len(self.parent))]
        for name, column in zip(_INT_COLUMNS, (self.parent, self.mode, self.size), strict=True):
            arr = array(_TYPECODES[name], column)
            if sys.byteorder != "little":
                arr.byteswap()
            parts.extend((_LEN.pack(len(arr) * arr.itemsize), arr.tobytes()))
        keys = b"".join(
            itertools.starmap(_KEY.pack, (_NO_KEY if k is None else k for k in self.key))
        )
        parts.extend((_LEN.pack(len(keys)), keys))
        for text in ("".join(self.kind), "\0".join(self.name), "\0".join(self.data)):
            raw = text.encode("utf-8", "surrogateescape")
            parts.extend((_LEN.pack(len(raw)), raw))
        return b"".join(parts)

    def digest(self, encoded: bytes) -> str:
        """SHA-256 of an encoded manifest (recorded in the version's metadata)."""
        return hashlib.sha256(encoded).hexdigest()


NO_CHILDREN: Final = (0, 0)
"""The span of an entry without children (an empty slice of every column)."""
_SCATTERED: Final = (-1, -1)


def _spans(parent: list[int]) -> list[tuple[int, int]]:
    """Each entry's children as one index range, or :data:`_SCATTERED` (see ``Manifest.span``).

    One pass over runs of equal parents (C-level grouping; a loop per
    directory, not per entry).
    """
    spans = [NO_CHILDREN] * len(parent)
    pos = 1
    for owner, run in itertools.groupby(itertools.islice(parent, 1, None)):
        count = len(list(run))
        if not 0 <= owner < len(spans):
            return [_SCATTERED] * len(parent)  # not a tree (decode refuses such a manifest)
        spans[owner] = (pos, pos + count) if spans[owner] == NO_CHILDREN else _SCATTERED
        pos += count
    return spans


class Builder:
    """Appends entries in walk order (parents before children)."""

    def __init__(self, root_mode: int) -> None:
        self.m = Manifest()
        self.add(-1, "", "d", root_mode, 0, "", None)

    def add(  # noqa: PLR0917 -- one positional slot per manifest column
        self, parent: int, name: str, kind: str, mode: int, size: int, data: str, key: Key | None
    ) -> int:
        """Append one entry; return its index."""
        m = self.m
        m.parent.append(parent)
        m.name.append(name)
        m.kind.append(kind)
        m.mode.append(mode & 0o777)
        m.size.append(size)
        m.data.append(data)
        m.key.append(key)
        return len(m.parent) - 1


def _bad(why: str) -> ManifestError:
    return ManifestError(f"the version's manifest is damaged or unsafe ({why})")


def _split_v1(raw: bytes, max_entries: int) -> Manifest:
    try:
        text = raw.decode("utf-8", "surrogateescape")
    except UnicodeDecodeError:
        raise _bad("encoding") from None
    fields = text.split("\0")
    if fields[0] != MAGIC or (len(fields) - 1) % _FIELDS:
        raise _bad("format")
    count = (len(fields) - 1) // _FIELDS
    _check_count(count, max_entries)
    m = Manifest()
    try:
        m.parent = [int(x) for x in fields[1::_FIELDS]]
        m.mode = [int(x) for x in fields[4::_FIELDS]]
        m.size = [int(x) for x in fields[5::_FIELDS]]
    except ValueError:
        raise _bad("number") from None
    m.name = fields[2::_FIELDS]
    m.kind = fields[3::_FIELDS]
    m.data = fields[6::_FIELDS]
    m.key = [None] * count  # format 1 keys are not trusted: the next snapshot reads once
    return m


def _check_count(count: int, max_entries: int) -> None:
    if count < 1:
        raise _bad("no root")
    if count > max_entries:
        raise ManifestError(f"the version holds more than {max_entries} entries; refused")


def _split_v2(raw: bytes, max_entries: int) -> Manifest:
    view = memoryview(raw)
    pos = len(MAGIC2)
    if len(raw) < pos + _LEN.size:
        raise _bad("format")
    (count,) = _LEN.unpack_from(raw, pos)
    pos += _LEN.size
    _check_count(count, max_entries)
    sections: list[memoryview] = []
    for _ in range(len(_INT_COLUMNS) + 4):
        if len(raw) < pos + _LEN.size:
            raise _bad("format")
        (length,) = _LEN.unpack_from(raw, pos)
        pos += _LEN.size
        if length > len(raw) - pos:
            raise _bad("format")
        sections.append(view[pos : pos + length])
        pos += length
    if pos != len(raw):
        raise _bad("format")
    ints: dict[str, list[int]] = {}
    for name, section in zip(_INT_COLUMNS, sections, strict=False):
        arr = array(_TYPECODES[name])
        if len(section) != count * arr.itemsize:
            raise _bad("format")
        arr.frombytes(section)
        if sys.byteorder != "little":
            arr.byteswap()
        ints[name] = arr.tolist()
    keys = sections[len(_INT_COLUMNS)]
    if len(keys) != count * _KEY.size:
        raise _bad("format")
    try:
        kind, names, data = (
            bytes(x).decode("utf-8", "surrogateescape") for x in sections[len(_INT_COLUMNS) + 1 :]
        )
    except UnicodeDecodeError:
        raise _bad("encoding") from None
    m = Manifest()
    m.parent, m.mode, m.size = ints["parent"], ints["mode"], ints["size"]
    m.kind = list(kind)
    m.name = names.split("\0")
    m.data = data.split("\0")
    if len(m.kind) != count or len(m.name) != count or len(m.data) != count:
        raise _bad("format")
    m.key = [k if k[0] else None for k in _KEY.iter_unpack(keys)]
    return m


def decode(raw: bytes, *, max_entries: int, max_bytes: int) -> Manifest:
    """Parse and validate a stored manifest (format 2, or format 1 of earlier versions).

    Every check runs as a few C-level passes over whole columns, so a
    100,000-entry manifest validates in milliseconds.

    Raises:
        ManifestError: Damaged, unsafe (names that escape, setuid bits, a
            parent after its child, duplicates) or over a cap (a restore
            bomb): refused before anything is written.
    """
    m = _split_v2(raw, max_entries) if raw.startswith(MAGIC2) else _split_v1(raw, max_entries)
    count = len(m.parent)
    if m.parent[0] != -1 or m.name[0] != "" or m.kind[0] != "d":
        raise _bad("root")
    if not set(m.kind) <= _KINDS.keys():
        raise _bad("entry")
    if min(m.mode) < 0 or max(m.mode) > 0o777 or min(m.size) < 0:
        raise _bad("entry")
    parents = m.parent[1:]
    if parents and (
        min(parents) < 0
        or not all(map(operator.lt, parents, range(1, count)))
        or {m.kind[p] for p in set(parents)} != {"d"}
    ):
        raise _bad("parent")
    names = m.name[1:]
    joined = "".join(names)
    if "/" in joined or not all(names) or "." in names or ".." in names:
        raise _bad("name")
    if max(map(len, names), default=0) > 63 and any(
        len(n.encode("utf-8", "surrogateescape")) > 255 for n in names if len(n) > 63
    ):
        raise _bad("name")
    if len(set(zip(parents, names, strict=True))) != len(names):
        raise _bad("duplicate")
    files = [i for i, k in enumerate(m.kind) if k == "f"]
    hashes = [m.data[i] for i in files]
    if not all_blob_names(hashes):
        raise _bad("hash")
    if sum(m.size[i] for i in files) > max_bytes:
        raise ManifestError(f"the version holds more than {max_bytes} bytes; refused")
    for i, k in enumerate(m.kind):
        if k == "l":
            if not m.data[i] or len(m.data[i]) > 4095:
                raise _bad("link")
        elif k == "d" and m.data[i]:
            raise _bad("dir")
    return m


def referenced_blobs(raw: bytes) -> set[str]:
    """The blob names a stored manifest refers to, read leniently (for garbage collection).

    A manifest that cannot be parsed refers to nothing usable: its version
    fails its integrity check anyway.
    """
    try:
        m = _split_v2(raw, sys.maxsize) if raw.startswith(MAGIC2) else _split_v1(raw, sys.maxsize)
    except ManifestError:
        return set()
    return m.hashes()


def _same(a: Manifest, i: int, b: Manifest, j: int) -> bool:
    return a.kind[i] == b.kind[j] and a.data[i] == b.data[j] and a.mode[i] == b.mode[j]


def _size(m: Manifest, i: int) -> int:
    return m.size[i] if m.kind[i] == "f" else 0


def _subtree(m: Manifest, idx: int, path: str) -> Iterator[tuple[int, str]]:
    stack = [(idx, path)]
    while stack:
        cur, where = stack.pop()
        yield cur, where
        if m.kind[cur] == "d":
            for name, child in m.children(cur).items():
                stack.append((child, f"{where.rstrip('/')}/{name}"))


def diff(old: Manifest, new: Manifest) -> list[VersionChange]:
    """Entries added, removed or modified from ``old`` to ``new``, sorted by path.

    Modified means same path, different type, content, symlink target or
    mode. An entry whose type changed is one ``modified`` change (typed as
    it is in ``new``); what lay under a directory on one side only is
    reported entry by entry. Iterative: no recursion per level.
    """
    out: list[VersionChange] = []
    if old.mode[0] != new.mode[0]:
        out.append(VersionChange(path="/", change="modified", type="dir", old_size=0, new_size=0))
    stack: list[tuple[int, int, str]] = [(0, 0, "")]
    while stack:
        i, j, base = stack.pop()
        a, b = old.children(i), new.children(j)
        for name, ai in a.items():
            path = f"{base}/{name}"
            bj = b.get(name)
            if bj is None:
                out.extend(
                    VersionChange(
                        path=p, change="removed", type=old.type_of(k), old_size=_size(old, k)
                    )
                    for k, p in _subtree(old, ai, path)
                )
                continue
            if not _same(old, ai, new, bj):
                out.append(
                    VersionChange(
                        path=path,
                        change="modified",
                        type=new.type_of(bj),
                        old_size=_size(old, ai),
                        new_size=_size(new, bj),
                    )
                )
            both_dirs = old.kind[ai] == "d" and new.kind[bj] == "d"
            if both_dirs:
                stack.append((ai, bj, path))
            elif old.kind[ai] == "d":
                out.extend(
                    VersionChange(
                        path=p, change="removed", type=old.type_of(k), old_size=_size(old, k)
                    )
                    for k, p in _subtree(old, ai, path)
                    if k != ai
                )
            elif new.kind[bj] == "d":
                out.extend(
                    VersionChange(
                        path=p, change="added", type=new.type_of(k), new_size=_size(new, k)
                    )
                    for k, p in _subtree(new, bj, path)
                    if k != bj
                )
        for name, bj in b.items():
            if name not in a:
                out.extend(
                    VersionChange(
                        path=p, change="added", type=new.type_of(k), new_size=_size(new, k)
                    )
                    for k, p in _subtree(new, bj, f"{base}/{name}")
                )
    out.sort(key=lambda c: c.path)
    return out


def kind_of(mode: int) -> str | None:
    """``f``/``d``/``l`` for a file type, None for special files."""
    if stat_mod.S_ISREG(mode):
        return "f"
    if stat_mod.S_ISDIR(mode):
        return "d"
    if stat_mod.S_ISLNK(mode):
        return "l"
    return None


def operation_error(exc: ManifestError) -> OperationError:
    """The tool-facing error for a manifest that cannot be used."""
    return OperationError(str(exc), code="too_large" if "refused" in str(exc) else "failed")
