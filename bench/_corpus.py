"""Generated trees: a grep corpus and snapshot workspaces (deterministic, seeded)."""

from __future__ import annotations

import os
import random
from pathlib import Path

WORDS = [
    "def",
    "class",
    "return",
    "import",
    "self",
    "value",
    "index",
    "buffer",
    "config",
    "parse",
    "render",
    "token",
    "request",
    "response",
    "error",
    "handler",
    "module",
    "package",
    "stream",
    "cursor",
    "offset",
    "length",
    "thread",
    "worker",
    "queue",
    "result",
    "status",
    "header",
    "payload",
    "session",
    "cache",
    "lock",
]
NEEDLE_EVERY = 3  # one needle line in every third text file


def _line_pool(rng: random.Random, count: int = 4096) -> list[str]:
    return [
        "    " * rng.randint(0, 3) + " ".join(rng.choices(WORDS, k=rng.randint(3, 12)))
        for _ in range(count)
    ]


def _text(rng: random.Random, pool: list[str], size: int, needle: int | None) -> bytes:
    lines = rng.choices(pool, k=size // 40 + 2)
    if needle is not None:
        lines[len(lines) // 2] += f"  # needle_{needle}"
    data = ("\n".join(lines) + "\n").encode()
    while len(data) < size:
        data += data
    return data[: size - 1] + b"\n"


def make_tree(
    root: Path, files: int, file_bytes: int, *, binary_every: int = 0, seed: int = 7
) -> int:
    """Write ``files`` files of about ``file_bytes`` under ``root`` (100 per directory).

    Every ``binary_every``-th file is binary (NUL bytes, plus a needle a text
    grep would report); every third text file holds one ``needle_<n>`` line.

    Returns:
        The bytes written.
    """
    rng = random.Random(seed)
    pool = _line_pool(rng)
    total = 0
    for i in range(files):
        d = root / f"d{i // 100:03d}"
        if i % 100 == 0:
            d.mkdir(parents=True, exist_ok=True)
        if binary_every and i % binary_every == binary_every - 1:
            data = b"\0\1\2BIN" + rng.randbytes(file_bytes - 32) + b"needle_0\n"
            name = f"blob{i:05d}.bin"
        else:
            data = _text(rng, pool, file_bytes, i if i % NEEDLE_EVERY == 0 else None)
            name = f"f{i:05d}.txt"
        fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        total += len(data)
    return total


def iter_files(root: Path) -> list[tuple[str, bytes]]:
    """(agent-view path, content) of every file under ``root``, sorted."""
    out: list[tuple[str, bytes]] = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            out.append(("/" + path.relative_to(root).as_posix(), path.read_bytes()))
    return sorted(out)
