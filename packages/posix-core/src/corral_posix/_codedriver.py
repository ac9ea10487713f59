"""The in-box side of a code context: one Python interpreter driven over framed JSON.

This file is never imported by the host. Its source is sent as the first
frame to ``python3 -I -u -c BOOTSTRAP`` (see ``_code.py``) running *inside*
the provider's boundary, so it needs nothing but the standard library and
works wherever the transport is a byte stream to one long-lived process
(a pipe through the reaper here, an attached ``docker exec`` stream there).

Wire format, both ways: a 4-byte big-endian length, then that many bytes of
UTF-8 JSON. Host -> driver: ``{"op": "exec", "id", "code", "limit"}`` and
``{"op": "interrupt", "id"}``. Driver -> host: ``{"ev": "ready"}`` once,
``{"ev": "stream", "id", "name", "text"}`` as output arrives, then
``{"ev": "done", "id", "outputs", "result_json", "error", "interrupted",
"truncated"}`` per cell.

The user's code must not be able to corrupt the channel: the driver keeps a
private duplicate of the original stdin/stdout and points fds 0, 1 and 2 at
``/dev/null`` and capture pipes, so ``print``, ``os.write(1, ...)`` and
child processes all land in the capture, which a pump thread forwards as
``stream`` frames. A per-cell random sentinel written into both pipes after
the cell tells the pump where the cell's output ends.
"""

# Running the user's code is this program's purpose (exec/eval), and a user
# object whose _repr_*_ raises must cost only that representation:
# ruff: noqa: S102, S307, S110, S112

from __future__ import annotations

import ast
import base64
import codecs
import contextlib
import io
import json
import linecache
import os
import queue
import select
import signal
import sys
import threading
import traceback
from typing import Any

_DRIVER_FILE = "<corral-driver>"
_REPR_LIMIT = 100_000
_JSON_LIMIT = 1_000_000
_CHUNK = 1 << 16
_MIME_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"),
    ("text/latex", "_repr_latex_"),
)
_BINARY = frozenset({"image/png", "image/jpeg"})


class _Channel:
    """The private framed channel to the host (fds dup'ed before user code runs)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self.lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message, ensure_ascii=False, default=str).encode("utf-8", "replace")
        data = len(body).to_bytes(4, "big") + body
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.write_fd, view) :]

    def _exact(self, n: int) -> bytes | None:
        parts = []
        while n:
            chunk = os.read(self.read_fd, n)
            if not chunk:
                return None
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def receive(self) -> dict[str, Any] | None:
        head = self._exact(4)
        if head is None:
            return None
        body = self._exact(int.from_bytes(head, "big"))
        return None if body is None else json.loads(body)


class _Pump:
    """Forwards the capture pipes as ``stream`` frames, capped per cell."""

    def __init__(self, channel: _Channel, fds: dict[int, str]) -> None:
        self.channel = channel
        self.fds = fds
        self.cond = threading.Condition()
        self.cell_id = 0
        self.sentinel = b""
        self.seen: set[int] = set()
        self.held = dict.fromkeys(fds, b"")
        self.decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in fds}
        self.room = dict.fromkeys(fds, 0)
        self.dropped = dict.fromkeys(fds, 0)

    def begin(self, cell_id: int, limit: int, sentinel: bytes) -> None:
        with self.cond:
            self.cell_id, self.sentinel, self.seen = cell_id, sentinel, set()
            for fd in self.fds:
                self.room[fd], self.dropped[fd] = limit, 0

    def finish(self) -> dict[str, bool]:
        """Mark the end of the cell's output in both pipes and wait for the pump to reach it."""
        for fd in self.fds:
            # One write shorter than PIPE_BUF is atomic: no other writer splits it.
            os.write(_write_end[fd], self.sentinel)
        with self.cond:
            # Bounded: a pump that cannot finish must not wedge the context.
            for _ in range(20):
                if len(self.seen) >= len(self.fds):
                    break
                self.cond.wait(0.25)
            truncated = {self.fds[fd]: self.dropped[fd] > 0 for fd in self.fds}
            self.sentinel = b""
        return truncated

    def _emit(self, fd: int, data: bytes, final: bool = False) -> None:
        text = self.decoders[fd].decode(data, final)
        if not text:
            return
        raw = text.encode("utf-8")
        if len(raw) > self.room[fd]:
            kept = raw[: self.room[fd]].decode("utf-8", "ignore")
            self.dropped[fd] += len(raw) - len(kept.encode("utf-8"))
            text = kept
        self.room[fd] -= len(text.encode("utf-8"))
        if text:
            self.channel.send(
                {"ev": "stream", "id": self.cell_id, "name": self.fds[fd], "text": text}
            )

    def _take(self, fd: int, chunk: bytes) -> None:
        with self.cond:
            data = self.held[fd] + chunk
            sentinel = self.sentinel
            if sentinel and fd not in self.seen:
                at = data.find(sentinel)
                if at >= 0:
                    self._emit(fd, data[:at], final=True)
                    self.held[fd] = b""
                    rest = data[at + len(sentinel) :]
                    self.seen.add(fd)
                    self.cond.notify_all()
                    # Output after the mark belongs to the next cell; keep it for then.
                    self.held[fd] = rest
                    return
                keep = _prefix_overlap(data, sentinel)
                self._emit(fd, data[: len(data) - keep])
                self.held[fd] = data[len(data) - keep :]
                return
            if self.sentinel or not chunk:
                self.held[fd] = data
                return
            # Between cells (a thread still printing): attribute it to the next cell.
            self.held[fd] = data[-_CHUNK * 16 :]

    def run(self) -> None:
        poller = select.poll()
        for fd in self.fds:
            poller.register(fd, select.POLLIN)
        while True:
            for fd, _ev in poller.poll():
                try:
                    chunk = os.read(fd, _CHUNK)
                except BlockingIOError:
                    continue
                if chunk:
                    self._take(fd, chunk)


_write_end: dict[int, int] = {}


def _prefix_overlap(data: bytes, sentinel: bytes) -> int:
    """Length of the longest suffix of ``data`` that starts ``sentinel``."""
    for k in range(min(len(data), len(sentinel) - 1), 0, -1):
        if sentinel.startswith(data[-k:]):
            return k
    return 0


def _bundle(obj: Any) -> dict[str, str]:
    """A MIME bundle for ``obj``: text/plain always, rich forms when the object offers them."""
    data: dict[str, str] = {}
    method = getattr(obj, "_repr_mimebundle_", None)
    if callable(method) and not isinstance(obj, type):
        try:
            got = method()
            if isinstance(got, tuple):
                got = got[0]
            if isinstance(got, dict):
                for mime, value in got.items():
                    _put(data, str(mime), value)
        except Exception:
            pass
    for mime, name in _MIME_METHODS:
        if mime in data:
            continue
        method = getattr(obj, name, None)
        if not callable(method) or isinstance(obj, type):
            continue
        try:
            value = method()
        except Exception:
            continue
        if isinstance(value, tuple):
            value = value[0]
        if value is not None:
            _put(data, mime, value)
    if "text/plain" not in data:
        try:
            text = repr(obj)
        except Exception as exc:
            text = f"<repr failed: {type(exc).__name__}>"
        data["text/plain"] = text[:_REPR_LIMIT]
    return data


def _put(data: dict[str, str], mime: str, value: Any) -> None:
    if mime in _BINARY:
        if isinstance(value, bytes | bytearray):
            data[mime] = base64.b64encode(bytes(value)).decode("ascii")
        elif isinstance(value, str):
            data[mime] = value
    elif mime == "application/json" or mime.endswith("+json"):
        with contextlib.suppress(TypeError, ValueError):
            data[mime] = json.dumps(value)
    elif isinstance(value, str):
        data[mime] = value
    elif isinstance(value, bytes):
        data[mime] = value.decode("utf-8", "replace")


class _Bash:
    """A persistent ``bash`` session hosted by the driver (language ``bash``).

    Each cell is the body of a function run in the session's own shell, so
    variables, functions and the working directory persist; output goes to
    the driver's capture pipes (inherited fds 1 and 2). A status pipe
    carries ``NONCE STATUS`` after each cell. An interrupt is SIGINT to the
    session's process group: the running command dies, and the session's
    INT trap returns from the cell function, so the rest of the cell is
    skipped and the session survives. ``exit`` ends the session (the
    context is then lost).
    """

    def __init__(self) -> None:
        import subprocess

        self.status_r, status_w = os.pipe()
        os.set_inheritable(self.status_r, False)
        self.status_fd = status_w
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            pass_fds=(status_w,),
            start_new_session=True,
        )
        os.close(status_w)
        assert self.proc.stdin is not None
        self.stdin = self.proc.stdin
        self.buffer = b""
        self._send("trap 'return 130 2>/dev/null' INT\n")

    def _send(self, text: str) -> None:
        self.stdin.write(text.encode("utf-8", "surrogateescape"))
        self.stdin.flush()

    def run(self, source: str) -> int:
        """Run one cell; return the status of its last command (130 when interrupted)."""
        nonce = os.urandom(12).hex()
        # The quoted here-document keeps the source literal; eval then runs it
        # inside the function, so a syntax error cannot swallow the status line.
        body = f"eval \"$(cat <<'CORRAL_{nonce}'\n{source}\nCORRAL_{nonce}\n)\""
        self._send(
            f"__corral_cell() {{\n{body}\n}}\n__corral_cell\n"
            f"printf '%s %d\\n' {nonce} $? >&{self.status_fd}\n"
        )
        mark = nonce.encode() + b" "
        while True:
            ready, _, _ = select.select([self.status_r], [], [], 0.1)
            if ready:
                chunk = os.read(self.status_r, 4096)
                if not chunk:
                    _session_ended(self.proc)
                self.buffer += chunk
                at = self.buffer.find(mark)
                end = self.buffer.find(b"\n", at)
                if at >= 0 and end >= 0:
                    status = int(self.buffer[at + len(mark) : end])
                    self.buffer = self.buffer[end + 1 :]
                    return status
            elif self.proc.poll() is not None:
                _session_ended(self.proc)

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGINT)


_NODE_DRIVER = r"""
'use strict';
const fs = require('fs');
const util = require('util');
const vm = require('vm');
const out = Number(process.argv[process.argv.length - 1]);
let pending = null;
function send(obj) {
  const body = Buffer.from(JSON.stringify(obj));
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  fs.writeSync(out, Buffer.concat([head, body]));
}
function fail(err) {
  const e = err instanceof Error ? err : new Error(String(err));
  const name = e.name || 'Error';
  return { name, value: e.message || String(err), traceback: String(e.stack || '') };
}
function bundle(value) {
  const data = { 'text/plain': util.inspect(value) };
  return { kind: 'result', data };
}
process.on('SIGINT', () => {
  if (pending) pending(new Error('interrupted'));
});
async function run(code) {
  let value;
  try {
    value = vm.runInThisContext(code, { filename: 'cell.js', breakOnSigint: true });
    if (value && typeof value.then === 'function') {
      value = await Promise.race([value, new Promise((_, reject) => { pending = reject; })]);
    }
  } catch (err) {
    const error = fail(err);
    return { error, interrupted: /interrupted|Script execution was interrupted/.test(error.value) };
  } finally {
    pending = null;
  }
  if (value === undefined) return { error: null, interrupted: false };
  let json = null;
  try {
    const text = JSON.stringify(value);
    if (typeof text === 'string') json = text;
  } catch (err) { json = null; }
  return { error: null, interrupted: false, result_json: json, outputs: [bundle(value)] };
}
let buffer = Buffer.alloc(0);
let busy = Promise.resolve();
process.stdin.on('data', (chunk) => {
  buffer = Buffer.concat([buffer, chunk]);
  while (buffer.length >= 4) {
    const size = buffer.readUInt32BE(0);
    if (buffer.length < 4 + size) break;
    const code = buffer.subarray(4, 4 + size).toString('utf8');
    buffer = buffer.subarray(4 + size);
    busy = busy.then(() => run(code)).then(send);
  }
});
"""


class _Node:
    """A persistent Node.js session hosted by the driver (language ``javascript``).

    Cells run with ``vm.runInThisContext`` in one Node process, so globals
    and top-level declarations persist, as in Node's REPL; a promise a cell
    ends with is awaited. Output goes to the driver's capture pipes; results
    come back framed on a private pipe. An interrupt is SIGINT to the session's process
    group (``breakOnSigint`` stops synchronous code; a pending promise is
    abandoned with an error).
    """

    def __init__(self) -> None:
        import subprocess

        self.result_r, result_w = os.pipe()
        os.set_inheritable(self.result_r, False)
        self.proc = subprocess.Popen(
            ["node", "-e", _NODE_DRIVER, str(result_w)],
            stdin=subprocess.PIPE,
            pass_fds=(result_w,),
            start_new_session=True,
        )
        os.close(result_w)
        assert self.proc.stdin is not None
        self.stdin = self.proc.stdin
        self.buffer = b""

    def run(self, source: str) -> dict[str, Any]:
        """Run one cell; return its outcome for the ``done`` frame."""
        body = source.encode("utf-8", "surrogateescape")
        self.stdin.write(len(body).to_bytes(4, "big") + body)
        self.stdin.flush()
        while True:
            if len(self.buffer) >= 4:
                size = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) >= 4 + size:
                    outcome = json.loads(self.buffer[4 : 4 + size])
                    self.buffer = self.buffer[4 + size :]
                    return outcome if isinstance(outcome, dict) else {}
            ready, _, _ = select.select([self.result_r], [], [], 0.1)
            if ready:
                chunk = os.read(self.result_r, _CHUNK)
                if not chunk:
                    _session_ended(self.proc)
                self.buffer += chunk
            elif self.proc.poll() is not None:
                _session_ended(self.proc)

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGINT)


def _session_ended(proc: Any) -> None:
    """The hosted session ended: so does the context, truthfully (reported lost)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(proc.wait() & 0xFF)


class _Kernel:
    """One namespace, one cell at a time, on the main thread."""

    def __init__(self, channel: _Channel, pump: _Pump) -> None:
        self.channel, self.pump = channel, pump
        self.outputs: list[dict[str, Any]] = []
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        self.namespace["display"] = self.display
        self.count = 0
        self.running = 0
        self.state = threading.Lock()
        self.bash: _Bash | None = None
        self.node: _Node | None = None

    def display(self, *objs: Any, raw: bool = False) -> None:
        """Show objects as rich outputs of the current cell (like IPython's ``display``)."""
        for obj in objs:
            data = {str(k): str(v) for k, v in obj.items()} if raw else _bundle(obj)
            self.outputs.append({"kind": "display", "data": data})

    def _figures(self) -> None:
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            for num in plt.get_fignums():
                fig = plt.figure(num)
                buffer = io.BytesIO()
                fig.savefig(buffer, format="png", bbox_inches="tight")
                png = base64.b64encode(buffer.getvalue()).decode("ascii")
                self.outputs.append(
                    {"kind": "display", "data": {"image/png": png, "text/plain": repr(fig)}}
                )
            plt.close("all")
        except Exception as exc:
            print(f"corral: could not capture figures: {type(exc).__name__}", file=sys.stderr)

    def _error(self, exc: BaseException) -> dict[str, str]:
        tb = traceback.TracebackException.from_exception(exc)
        tb.stack = traceback.StackSummary.from_list(
            [f for f in tb.stack if f.filename != _DRIVER_FILE]
        )
        return {
            "name": type(exc).__name__,
            "value": str(exc)[:_REPR_LIMIT],
            "traceback": "".join(tb.format())[-_REPR_LIMIT:],
        }

    def _run(self, cell_id: int, source: str, filename: str) -> str | None:
        """Run the cell's statements, then evaluate its last expression; return its JSON."""
        with self.state:
            self.running = cell_id
        try:
            tree = ast.parse(source, filename, "exec")
            last = None
            final = tree.body[-1] if tree.body else None
            if isinstance(final, ast.Expr):
                tree.body.pop()
                last = ast.Expression(final.value)
            exec(compile(tree, filename, "exec"), self.namespace)
            if last is None:
                return None
            value = eval(compile(last, filename, "eval"), self.namespace)
        finally:
            with self.state:
                self.running = 0
        if value is None:
            return None
        self.namespace["_"] = value
        self.outputs.append({"kind": "result", "data": _bundle(value)})
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            return None
        return text if len(text) <= _JSON_LIMIT else None

    def execute(self, request: dict[str, Any]) -> None:
        """Run one cell and send its ``done`` frame after all of its output."""
        cell_id = int(request["id"])
        self.count += 1
        self.outputs = []
        result_json: str | None = None
        error: dict[str, str] | None = None
        interrupted = False
        sentinel = b"\0corral-end-" + os.urandom(12).hex().encode() + b"\0"
        self.pump.begin(cell_id, int(request.get("limit", 1_000_000)), sentinel)
        filename = f"<cell-{self.count}>"
        source = str(request["code"])
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        if request.get("language") == "bash":
            self._send_done(cell_id, self._bash(cell_id, source))
            return
        if request.get("language") == "javascript":
            self._send_done(cell_id, self._javascript(cell_id, source))
            return
        try:
            result_json = self._run(cell_id, source, filename)
        except KeyboardInterrupt as exc:
            interrupted = True
            error = self._error(exc)
        except BaseException as exc:
            # SystemExit included: exit() in a cell must not end the context.
            error = self._error(exc)
        try:
            self._figures()
        except KeyboardInterrupt:
            interrupted = True
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self._send_done(
            cell_id,
            {"result_json": result_json, "error": error, "interrupted": interrupted},
        )

    def _send_done(self, cell_id: int, outcome: dict[str, Any]) -> None:
        truncated = self.pump.finish()
        self.channel.send(
            {
                "ev": "done",
                "id": cell_id,
                "outputs": self.outputs,
                "truncated": truncated,
                **outcome,
            }
        )

    def _bash(self, cell_id: int, source: str) -> dict[str, Any]:
        if self.bash is None:
            self.bash = _Bash()
        with self.state:
            self.running = cell_id
        try:
            status = self.bash.run(source)
        finally:
            with self.state:
                self.running = 0
        return {"result_json": None, "error": None, "interrupted": status == 130, "status": status}

    def _javascript(self, cell_id: int, source: str) -> dict[str, Any]:
        if self.node is None:
            self.node = _Node()
        with self.state:
            self.running = cell_id
        try:
            outcome = self.node.run(source)
        finally:
            with self.state:
                self.running = 0
        self.outputs.extend(o for o in outcome.pop("outputs", []) if isinstance(o, dict))
        return {
            "result_json": outcome.get("result_json"),
            "error": outcome.get("error"),
            "interrupted": bool(outcome.get("interrupted")),
        }

    def interrupt(self, cell_id: int) -> None:
        with self.state:
            if not self.running or self.running != cell_id:
                return
            if self.node is not None:
                self.node.interrupt()
            elif self.bash is not None:
                self.bash.interrupt()
            else:
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def _reader(channel: _Channel, kernel: _Kernel, work: queue.Queue[dict[str, Any] | None]) -> None:
    while True:
        try:
            message = channel.receive()
        except (OSError, ValueError):
            message = None
        if message is None:
            work.put(None)
            return
        if message.get("op") == "interrupt":
            kernel.interrupt(int(message.get("id", 0)))
        else:
            work.put(message)


def main() -> None:
    """Take over the process's standard fds and serve cells until the host goes away."""
    channel = _Channel(os.dup(0), os.dup(1))
    for fd in (channel.read_fd, channel.write_fd):
        os.set_inheritable(fd, False)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    captures: dict[int, str] = {}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        os.set_inheritable(r, False)
        os.dup2(w, fd)
        # A private copy for the end-of-cell mark: user code may close or redirect fd 1.
        _write_end[r] = os.dup(w)
        os.set_inheritable(_write_end[r], False)
        os.close(w)
        captures[r] = name
    # Text streams over the new fds: print() reaches the capture a line at a
    # time (one frame per line, not per write); the end of a cell flushes the rest.
    sys.stdout = io.TextIOWrapper(
        os.fdopen(1, "wb", closefd=False), "utf-8", "replace", line_buffering=True
    )
    sys.stderr = io.TextIOWrapper(
        os.fdopen(2, "wb", closefd=False), "utf-8", "backslashreplace", line_buffering=True
    )
    sys.stdin = io.TextIOWrapper(io.BytesIO(b""), "utf-8")
    os.environ.setdefault("MPLBACKEND", "Agg")
    import warnings

    warnings.filterwarnings("ignore", message=".*non-interactive.*")
    pump = _Pump(channel, captures)
    threading.Thread(target=pump.run, name="corral-pump", daemon=True).start()
    kernel = _Kernel(channel, pump)
    work: queue.Queue[dict[str, Any] | None] = queue.Queue()
    threading.Thread(
        target=_reader, args=(channel, kernel, work), name="corral-reader", daemon=True
    ).start()
    channel.send({"ev": "ready", "python": sys.version.split()[0], "pid": os.getpid()})
    while True:
        try:
            request = work.get()
            if request is None:
                os._exit(0)
            if request.get("op") == "exec":
                kernel.execute(request)
        except KeyboardInterrupt:
            # An interrupt that raced the end of a cell: nothing to stop.
            continue


main()
