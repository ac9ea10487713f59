"""One-line explanations of rows that miss their goal: the floor hit, or what would fix it.

Keyed by row id; the table prints a row's note only when the row misses.
"""

from __future__ import annotations

from typing import Final

_PROVIDERS: Final = ("in-memory", "local-bash", "local-sandbox", "docker")
_THREADED: Final = ("local-bash", "local-sandbox", "docker")

_TOOL: Final = {
    "read": (
        "one module call (read_file with max_bytes) plus schema validation, path normalisation "
        "(done again by the provider), UTF-8 decode, line windowing, rendering and usage/metrics "
        "records{hop}; fix: skip re-normalising an already normalised path, cache the bound "
        "module per registry state"
    ),
    "write": (
        "schema validation of 4 KiB content, UTF-8 encode, registry lookup, JSON rendering and "
        "usage/metrics recording are ~20-40 us of CPython on this CPU{hop}; p95 is load jitter"
    ),
    "stat": (
        "validation, path normalisation (done again by the provider), the registry lookup and "
        "JSON rendering{hop}; fix: skip re-normalising an already normalised path"
    ),
}
_HOP: Final = (
    ", and every module call of this provider hops to a worker thread "
    "(anyio.to_thread, 50-150 us on a loaded 2-core VM), so the difference is noisy"
)

_GREP: Final = (
    "files without the pattern's required literal are skipped on their raw bytes; a bare "
    "Python open/fstat/read/close loop over this corpus already takes about GNU grep's whole "
    "time, and the rest is walk bookkeeping, line counting and the worker-thread hop; fix: a "
    "bytes-compiled pattern for ASCII-safe patterns, or delegate to rg when installed"
)

NOTES: Final[dict[str, str]] = {
    **{
        f"fs.{op}.tool.{kind}": text.format(hop=_HOP if kind in _THREADED else "")
        for op, text in _TOOL.items()
        for kind in _PROVIDERS
    },
    "fs.read.module.local-bash": (
        "floor is the worker-thread hop (anyio.to_thread, ~50-150 us here) plus openat2 "
        "resolution, against a 4 KiB page-cache read of ~6-10 us; fix: do small reads and stats "
        "inline (page-cache hits do not block) or resolve+fstat+read in one hop"
    ),
    "fs.write.module.local-bash": (
        "the thread hop and the per-component openat/O_EXCL temp file dominate on tmpfs, where "
        "fsync is free; on a disk where fsync costs milliseconds the ratio falls toward 1"
    ),
    "run.subprocess.local-bash": (
        "a pooled child-subreaper spawns the command (posix_spawn) so no descendant outlives it: "
        "~120 us guard (shlex, lexer, openat2 via ctypes), ~130 us two process hand-offs (waking "
        "an idle vCPU costs ~65 us each here), ~100 us host Python; fix: a cheaper guard (skip "
        "shlex without quotes); the hand-off stays while a separate subreaper guarantees the kill"
    ),
    **{f"grep.gnu.{kind}": _GREP for kind in _PROVIDERS},
    "grep.gnu.in-memory": (
        "no I/O at all, so the gap is the interpreter: per-file NUL check, prefilter, decode of "
        "the files that hold the literal, and result objects in Python against GNU grep's C"
    ),
    "versions.restore.100k x 1 KiB": (
        "the change journal opens only the directories a command touched or the versions "
        "differ in; what remains is comparing the two manifests directory by directory in "
        "whole-list slices (1,000 directories) and the syncfs"
    ),
    "versions.snapshot.100k x 1 KiB": (
        "the change journal reads only the touched directories; what remains is building, "
        "encoding and fsyncing a 100k-entry manifest (~0.2 s)"
    ),
    **{
        f"versions.walk.{op}.100k x 1 KiB": (
            "local-bash keeps no change journal (its commands are unconfined: a write through "
            "a hard link from outside the workspace leaves no event), so it stats every live "
            "entry: 0.15-0.2 s for 100k entries in CPython (find(1): 0.12 s)"
        )
        for op in ("snapshot", "restore")
    },
    "versions.branch.102 MB": (
        "every blob is verified while copied (SHA-256 of 100 MB) and tmpfs has no reflinks; "
        "cp -a copies in the kernel and checks nothing; with FICLONE the copy is free but the "
        "verification stays"
    ),
    "versions.read.102 MB": (
        "read_file_at verifies the 100 KiB blob's SHA-256 (~50 us) on top of the read"
    ),
    **{
        f"versions.{op}.{size} x 1 KiB": (
            "fixed costs dominate small trees: the tool call, the manifest's and metadata's "
            "fsync and one syncfs"
        )
        for op in ("snapshot", "restore", "branch")
        for size in ("1k", "10k")
    },
    "grep.gnu.local-bash.re2": (
        "google-re2's wrapper is slower per search call than the regex module on a literal "
        "prefix; re2 buys linear time on hostile patterns, not speed"
    ),
}
