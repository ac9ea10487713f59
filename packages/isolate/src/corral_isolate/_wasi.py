"""A deny-all WASI preview 1 host: standard output and error, clocks, nothing else.

The guest is linked against these functions instead of wasmtime's own WASI
implementation, so the only host resources a script can reach are the ones
written here: two output streams (captured, capped), an empty standard
input, the clocks, and an empty environment. There are no preopened
directories, so every path call has no directory descriptor to start from
and fails with ``EBADF``; there are no sockets at all. Nothing here touches
the host file system or network, which makes the isolation claim a property
of this file rather than of a configuration.

Host calls find the run they serve through a thread-local: one worker thread
runs one guest at a time, start to finish.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from typing import Final

import wasmtime

__all__ = ["GuestExit", "Output", "RunState", "current", "define_wasi"]

MODULE: Final = "wasi_snapshot_preview1"

ESUCCESS: Final = 0
EBADF: Final = 8
EFAULT: Final = 21
EINVAL: Final = 28
ENOTSUP: Final = 58
ESPIPE: Final = 70

_CHARACTER_DEVICE: Final = 2
_RIGHTS_WRITE: Final = 1 << 6  # fd_write
_RIGHTS_READ: Final = 1 << 1  # fd_read

_I32 = wasmtime.ValType.i32()
_I64 = wasmtime.ValType.i64()


class GuestExit(Exception):
    """Raised by ``proc_exit`` to unwind the guest; the code is in the run state."""


class Output:
    """One captured stream: bytes kept up to a cap, and whether more came."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.overflowed = False

    def write(self, data: bytes) -> None:
        """Keep what fits under the cap; remember that the rest was dropped."""
        room = self.cap - self.kept
        if len(data) > room:
            self.overflowed = True
            data = data[: max(room, 0)]
        if data:
            self.chunks.append(data)
            self.kept += len(data)

    def value(self) -> bytes:
        """Everything kept, in order."""
        return b"".join(self.chunks)


class RunState:
    """What the host functions of one guest run write to.

    Attributes:
        stdout: The guest's file descriptor 1.
        stderr: The guest's file descriptor 2.
        exit_code: Set when the guest called ``proc_exit``.
    """

    def __init__(self, stdout_cap: int, stderr_cap: int) -> None:
        self.stdout = Output(stdout_cap)
        self.stderr = Output(stderr_cap)
        self.exit_code: int | None = None


_local = threading.local()


def current() -> RunState:
    """The run this thread is executing (set by :func:`bind`)."""
    state: RunState | None = getattr(_local, "state", None)
    if state is None:  # pragma: no cover - a guest only runs inside bind()
        raise RuntimeError("a WASI host call arrived outside a guest run")
    return state


def bind(state: RunState | None) -> None:
    """Make ``state`` the run of this thread (None when the run is over)."""
    _local.state = state


def _memory(caller: wasmtime.Caller) -> wasmtime.Memory:
    memory = caller.get("memory")
    if not isinstance(memory, wasmtime.Memory):  # pragma: no cover - the module exports it
        raise GuestExit("the guest exports no memory")
    return memory


def _read(caller: wasmtime.Caller, ptr: int, size: int) -> bytes | None:
    memory = _memory(caller)
    if ptr < 0 or size < 0 or ptr + size > memory.data_len(caller):
        return None
    return bytes(memory.read(caller, ptr, ptr + size))


def _write(caller: wasmtime.Caller, ptr: int, data: bytes) -> bool:
    memory = _memory(caller)
    if ptr < 0 or ptr + len(data) > memory.data_len(caller):
        return False
    memory.write(caller, data, ptr)
    return True


def _fd_write(caller: wasmtime.Caller, fd: int, iovs: int, iovs_len: int, nwritten: int) -> int:
    if fd not in (1, 2):
        return EBADF
    raw = _read(caller, iovs, 8 * iovs_len)
    if raw is None:
        return EFAULT
    stream = current().stdout if fd == 1 else current().stderr
    total = 0
    for base, length in struct.iter_unpack("<II", raw):
        data = _read(caller, base, length)
        if data is None:
            return EFAULT
        stream.write(data)
        total += length
    return ESUCCESS if _write(caller, nwritten, struct.pack("<I", total)) else EFAULT


def _fd_read(caller: wasmtime.Caller, fd: int, iovs: int, iovs_len: int, nread: int) -> int:
    if fd != 0:
        return EBADF
    # Standard input is empty: end of file at once.
    return ESUCCESS if _write(caller, nread, struct.pack("<I", 0)) else EFAULT


def _fd_fdstat_get(caller: wasmtime.Caller, fd: int, buf: int) -> int:
    if fd not in (0, 1, 2):
        return EBADF
    rights = _RIGHTS_READ if fd == 0 else _RIGHTS_WRITE
    stat = struct.pack("<BxHxxxxQQ", _CHARACTER_DEVICE, 0, rights, 0)
    return ESUCCESS if _write(caller, buf, stat) else EFAULT


def _std_only(caller: wasmtime.Caller, fd: int, *_: int) -> int:
    return ESUCCESS if fd in (0, 1, 2) else EBADF


def _fd_seek(caller: wasmtime.Caller, fd: int, offset: int, whence: int, out: int) -> int:
    return ESPIPE if fd in (0, 1, 2) else EBADF


def _bad_fd(caller: wasmtime.Caller, *_: int) -> int:
    """No directory descriptor exists: every path and directory call fails here."""
    return EBADF


def _environ_sizes_get(caller: wasmtime.Caller, count: int, size: int) -> int:
    ok = _write(caller, count, struct.pack("<I", 0)) and _write(caller, size, struct.pack("<I", 0))
    return ESUCCESS if ok else EFAULT


def _environ_get(caller: wasmtime.Caller, environ: int, buf: int) -> int:
    return ESUCCESS


def _clock_time_get(caller: wasmtime.Caller, clock_id: int, precision: int, out: int) -> int:
    if clock_id == 0:
        now = time.time_ns()
    elif clock_id in (1, 2, 3):
        now = time.monotonic_ns()
    else:
        return EINVAL
    return ESUCCESS if _write(caller, out, struct.pack("<Q", now)) else EFAULT


def _poll_oneoff(caller: wasmtime.Caller, inp: int, out: int, count: int, nevents: int) -> int:
    # No timers or descriptors to wait on: a guest that would sleep is told no.
    return ENOTSUP


def _proc_exit(caller: wasmtime.Caller, code: int) -> None:
    current().exit_code = code
    raise GuestExit(code)


_Host = Callable[..., int | None]

_FUNCS: Final[dict[str, tuple[tuple[wasmtime.ValType, ...], bool, _Host]]] = {
    # name: (parameter types, returns an errno, implementation)
    "fd_write": ((_I32, _I32, _I32, _I32), True, _fd_write),
    "fd_read": ((_I32, _I32, _I32, _I32), True, _fd_read),
    "fd_fdstat_get": ((_I32, _I32), True, _fd_fdstat_get),
    "fd_fdstat_set_flags": ((_I32, _I32), True, _std_only),
    "fd_close": ((_I32,), True, _std_only),
    "fd_seek": ((_I32, _I64, _I32, _I32), True, _fd_seek),
    "fd_prestat_get": ((_I32, _I32), True, _bad_fd),
    "fd_prestat_dir_name": ((_I32, _I32, _I32), True, _bad_fd),
    "fd_readdir": ((_I32, _I32, _I32, _I64, _I32), True, _bad_fd),
    "path_create_directory": ((_I32, _I32, _I32), True, _bad_fd),
    "path_filestat_get": ((_I32, _I32, _I32, _I32, _I32), True, _bad_fd),
    "path_filestat_set_times": ((_I32, _I32, _I32, _I32, _I64, _I64, _I32), True, _bad_fd),
    "path_open": ((_I32, _I32, _I32, _I32, _I32, _I64, _I64, _I32, _I32), True, _bad_fd),
    "path_remove_directory": ((_I32, _I32, _I32), True, _bad_fd),
    "path_rename": ((_I32, _I32, _I32, _I32, _I32, _I32), True, _bad_fd),
    "path_unlink_file": ((_I32, _I32, _I32), True, _bad_fd),
    "environ_get": ((_I32, _I32), True, _environ_get),
    "environ_sizes_get": ((_I32, _I32), True, _environ_sizes_get),
    "clock_time_get": ((_I32, _I64, _I32), True, _clock_time_get),
    "poll_oneoff": ((_I32, _I32, _I32, _I32), True, _poll_oneoff),
    "proc_exit": ((_I32,), False, _proc_exit),
}


def define_wasi(linker: wasmtime.Linker, module: wasmtime.Module) -> None:
    """Define every WASI import ``module`` needs; refuse a module needing more.

    Raises:
        RuntimeError: The module imports a function this host does not
            offer (a different engine build): better to refuse it than to
            link something unreviewed.
    """
    for imp in module.imports:
        if imp.module != MODULE or imp.name not in _FUNCS:
            raise RuntimeError(f"the JavaScript engine imports {imp.module}.{imp.name}, unknown")
    for name, (params, returns, func) in _FUNCS.items():
        results = [_I32] if returns else []
        linker.define_func(
            MODULE, name, wasmtime.FuncType(list(params), results), func, access_caller=True
        )
