"""QuickJS-NG compiled to WebAssembly, run by wasmtime: one fresh instance per script.

The engine's ``.wasm`` comes from the ``qjs-wasi-reactor.wasm`` distribution
on PyPI (a data-only copy of QuickJS-NG's WASI reactor build). It is
compiled once per process; each run gets a new ``Store`` and a new instance
(new linear memory, new JavaScript runtime), so nothing one script does is
visible to the next.

Limits: the store caps linear memory (``memory.grow`` fails past it, and
QuickJS's own allocator limit, set a little lower, turns that into a
catchable ``InternalError: out of memory``); wasmtime caps the wasm stack
(a deeper recursion traps); epoch interruption ends a run at its deadline
or when its caller is cancelled. Each concurrent run owns an engine of a
small pool while it runs, so interrupting one run never touches another.
"""

from __future__ import annotations

import importlib.metadata
import struct
import threading
import time
from pathlib import Path
from typing import Final

import attrs
import wasmtime

from . import _wasi

__all__ = ["EnginePool", "GuestRun", "Ticket", "wasm_path"]

DISTRIBUTION: Final = "qjs-wasi-reactor.wasm"
_WASM_NAME: Final = "qjs-wasi-reactor.wasm"
_MIB: Final = 1 << 20
JS_HEADROOM_BYTES: Final = 8 * _MIB
"""Linear memory kept beyond QuickJS's allocator limit for the stack and fragmentation."""


def wasm_path() -> Path:
    """Where the installed QuickJS-NG reactor ``.wasm`` is.

    Raises:
        RuntimeError: The distribution is missing or holds no ``.wasm``.
    """
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            "the QuickJS engine is not installed: pip install qjs-wasi-reactor.wasm"
        ) from None
    for file in dist.files or ():
        if file.name == _WASM_NAME:
            return Path(str(dist.locate_file(file)))
    raise RuntimeError(f"the {DISTRIBUTION} distribution holds no {_WASM_NAME}")


@attrs.frozen
class GuestRun:
    """What one guest run produced, before interpretation.

    Attributes:
        stdout: Raw bytes of the guest's fd 1 (the wrapper's frames).
        stdout_overflowed: fd 1 wrote more than the host kept.
        stderr: Raw bytes of fd 2 (the engine's own diagnostics).
        stderr_overflowed: fd 2 wrote more than the host kept.
        status: ``ok`` (the engine returned), ``failed`` (it returned an
            error status), ``interrupted`` (deadline or cancellation),
            ``stack`` (wasm stack exhausted), ``memory`` (linear memory
            exhausted or corrupted), ``trap`` (any other trap), ``exit``
            (the guest called ``proc_exit``).
        detail: A short, fixed description of a trap (never guest text).
        duration_ms: Wall time of the run in milliseconds.
    """

    stdout: bytes
    stdout_overflowed: bool
    stderr: bytes
    stderr_overflowed: bool
    status: str
    detail: str
    duration_ms: float


class Ticket:
    """The handle through which the event loop interrupts one run.

    :meth:`interrupt` is safe from any thread, before, during or after the
    run: before, the run does not start; during, the guest traps at its
    next function entry or loop back-edge; after, nothing happens.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine: wasmtime.Engine | None = None
        self._done = False
        self.interrupted = False
        self.timed_out = False

    def interrupt(self, *, timeout: bool) -> None:
        """Stop the run (``timeout`` says whether its deadline passed)."""
        with self._lock:
            if self._done or self.interrupted:
                return
            self.interrupted = True
            self.timed_out = timeout
            if self._engine is not None:
                self._engine.increment_epoch()

    def _attach(self, engine: wasmtime.Engine) -> bool:
        with self._lock:
            if self.interrupted:
                return False
            self._engine = engine
            return True

    def _finish(self) -> None:
        with self._lock:
            self._done = True
            self._engine = None


class _Slot:
    """An engine with the compiled module, linked to the deny-all WASI host."""

    def __init__(self, engine: wasmtime.Engine, module: wasmtime.Module) -> None:
        self.engine = engine
        linker = wasmtime.Linker(engine)
        _wasi.define_wasi(linker, module)
        self.pre = linker.instantiate_pre(module)


def _config(max_wasm_stack: int) -> wasmtime.Config:
    config = wasmtime.Config()
    config.epoch_interruption = True
    config.max_wasm_stack = max_wasm_stack
    # Traps are detected by explicit checks, not by catching SIGSEGV/SIGILL: a
    # host that installs or restores its own handlers later (faulthandler,
    # an in-process pytest run, a crash reporter) would otherwise turn the
    # next out-of-bounds access or stack overflow into a crash of the host.
    config.signals_based_traps = False
    return config


class EnginePool:
    """Compiled engines for concurrent runs; each run borrows one exclusively.

    Compiling the engine takes about half a second, so it happens once, on
    the first run; further engines load the compiled code (milliseconds).
    Engines hold no guest state: every run instantiates afresh.

    Args:
        max_idle: Engines kept for reuse (more are built on demand when runs
            overlap, and dropped when they finish).
        max_wasm_stack: Bytes of native stack a guest may use.
    """

    def __init__(self, *, max_idle: int = 4, max_wasm_stack: int = 512 * 1024) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []
        self._compiled: bytes | None = None
        self._max_idle = max_idle
        self._max_wasm_stack = max_wasm_stack

    def _take(self) -> _Slot:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if self._compiled is None:
                engine = wasmtime.Engine(_config(self._max_wasm_stack))
                module = wasmtime.Module.from_file(engine, str(wasm_path()))
                self._compiled = bytes(module.serialize())
                return _Slot(engine, module)
            compiled = self._compiled
        engine = wasmtime.Engine(_config(self._max_wasm_stack))
        return _Slot(engine, wasmtime.Module.deserialize(engine, compiled))

    def _give(self, slot: _Slot) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(slot)

    @property
    def compiled(self) -> bool:
        """Whether the engine has been compiled in this process."""
        return self._compiled is not None

    def warm(self) -> None:
        """Compile the engine now rather than on the first run (blocking)."""
        self._give(self._take())

    def run(
        self,
        argv: list[str],
        *,
        ticket: Ticket,
        memory_bytes: int,
        stdout_cap: int,
        stderr_cap: int,
    ) -> GuestRun:
        """Run the engine's command line in a fresh instance (blocking: a worker thread)."""
        started = time.perf_counter()
        state = _wasi.RunState(stdout_cap, stderr_cap)
        slot = self._take()
        try:
            store = wasmtime.Store(slot.engine)
            store.set_limits(memory_size=memory_bytes, instances=1, tables=2, memories=1)
            store.set_epoch_deadline(1)
            if not ticket._attach(slot.engine):
                status, detail = "interrupted", "stopped before it started"
            else:
                _wasi.bind(state)
                try:
                    status, detail = _run_guest(slot, store, argv)
                finally:
                    _wasi.bind(None)
        finally:
            ticket._finish()
            self._give(slot)
        if state.exit_code is not None:
            status, detail = "exit", f"the engine exited with status {state.exit_code}"
        if ticket.interrupted and status != "ok":
            status, detail = "interrupted", "interrupted"
        return GuestRun(
            stdout=state.stdout.value(),
            stdout_overflowed=state.stdout.overflowed,
            stderr=state.stderr.value(),
            stderr_overflowed=state.stderr.overflowed,
            status=status,
            detail=detail,
            duration_ms=(time.perf_counter() - started) * 1000,
        )


_TRAPS: Final = {
    wasmtime.TrapCode.STACK_OVERFLOW: ("stack", "the isolate's stack is exhausted"),
    wasmtime.TrapCode.INTERRUPT: ("interrupted", "interrupted"),
    wasmtime.TrapCode.MEMORY_OUT_OF_BOUNDS: ("memory", "the isolate's memory is exhausted"),
    wasmtime.TrapCode.UNREACHABLE: ("memory", "the engine aborted (out of memory)"),
}


def _run_guest(slot: _Slot, store: wasmtime.Store, argv: list[str]) -> tuple[str, str]:
    try:
        instance = slot.pre.instantiate(store)
        exports = instance.exports(store)
        memory = exports["memory"]
        malloc = exports["malloc"]
        init = exports["_initialize"]
        main = exports["qjs_init_argv"]
        assert isinstance(memory, wasmtime.Memory)
        assert isinstance(malloc, wasmtime.Func)
        assert isinstance(init, wasmtime.Func)
        assert isinstance(main, wasmtime.Func)
        init(store)
        pointers = []
        for arg in argv:
            data = arg.encode() + b"\0"
            ptr = malloc(store, len(data))
            if not isinstance(ptr, int) or ptr == 0:
                return "memory", "no memory for the script"
            memory.write(store, data, ptr)
            pointers.append(ptr)
        table = malloc(store, 4 * len(pointers))
        if not isinstance(table, int) or table == 0:
            return "memory", "no memory for the script"
        memory.write(store, struct.pack(f"<{len(pointers)}I", *pointers), table)
        status = main(store, len(pointers), table)
    except wasmtime.Trap as trap:
        return (
            _TRAPS.get(trap.trap_code, ("trap", "the engine trapped"))
            if trap.trap_code
            else (
                "trap",
                "the engine trapped",
            )
        )
    except _wasi.GuestExit:
        return "exit", "the engine exited"
    except wasmtime.WasmtimeError as error:
        # Instantiation past the memory limit, or a trap wasmtime reports as
        # an error; its text is wasmtime's, never the guest's.
        if "memory" in str(error):
            return "memory", "the isolate's memory is exhausted"
        return "trap", "the engine failed"
    return ("ok", "") if status == 0 else ("failed", "the engine reported an error")
