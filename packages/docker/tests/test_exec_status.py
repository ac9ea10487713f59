"""Every exec reports its true exit status and all its output, or fails saying so.

Two mechanisms used to lose a status silently (``exit_code=None``):

* The daemon answers ``POST /exec/{id}/start`` with ``101`` and then the
  output frames. When the client reads late (a loaded host), the head and
  the frames arrive together; the HTTP parser's buffered read takes both,
  and the Docker SDK's frame reader, which reads the socket (or ssh channel)
  *under* that buffer, never sees them: a short command's output, and over
  ssh its exit trailer, vanished.
* The attach stream ends when the command's output closes, an instant
  before the engine records the exit: ``exec inspect`` may still say
  ``Running`` with a null ``ExitCode``.

A fake Engine API (a thread serving HTTP on a unix socket and on TCP, the
latter standing for a remote engine) produces both deterministically; a
real engine, local and over ssh, is then driven under CPU load.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import re
import socket
import socketserver
import struct
import subprocess
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any

import anyio
import pytest

from corral_docker import EngineError
from corral_docker import _attach as attach_module
from corral_docker._sdk import SdkEngine

pytestmark = pytest.mark.anyio

_HEAD = (
    b"HTTP/1.1 101 UPGRADED\r\n"
    b"Content-Type: application/vnd.docker.multiplexed-stream\r\n"
    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
)


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", kind, len(payload)) + payload


class _Behaviour:
    """What the fake engine's execs do (set by each test)."""

    def __init__(self) -> None:
        self.stdout = b"out\n"
        self.stderr = b"err\n"
        self.code = 3
        self.send_trailer = True
        self.running_looks = 0  # inspects answering "running" first; -1: forever
        self.inspects = 0
        self.lock = threading.Lock()
        self.hold_start: threading.Event | None = None  # answer the start once set
        self.start_answered = False
        self.start_closed = threading.Event()
        self.reset_after_stdout = False  # break the connection (TCP reset) mid-output


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _reply(self, body: Any, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = re.sub(r"^/v[0-9.]+", "", self.path.split("?")[0])
        b: _Behaviour = self.server.behaviour
        if path == "/version":
            self._reply({"ApiVersion": "1.41", "Version": "fake"})
        elif re.fullmatch(r"/exec/[^/]+/json", path):
            with b.lock:
                b.inspects += 1
                running = b.running_looks < 0 or b.inspects <= b.running_looks
            self._reply({"Running": running, "ExitCode": None if running else b.code})
        else:
            self._reply({"message": "no such route"}, 404)

    def do_POST(self) -> None:
        path = re.sub(r"^/v[0-9.]+", "", self.path.split("?")[0])
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        b: _Behaviour = self.server.behaviour
        if re.fullmatch(r"/containers/[^/]+/exec", path):
            exec_id = f"exec{len(self.server.cmds)}"
            self.server.cmds[exec_id] = body["Cmd"]
            self._reply({"Id": exec_id}, 201)
        elif match := re.fullmatch(r"/exec/([^/]+)/start", path):
            cmd = self.server.cmds[match[1]]
            frames = _frame(1, b.stdout) + _frame(2, b.stderr)
            if b.send_trailer and cmd[3:4] == ["corral-exit"]:
                frames += _frame(2, f"\0corral-exit-{cmd[4]}:{b.code}".encode())
            if b.hold_start is not None:
                b.hold_start.wait(30)
                b.start_answered = True
            if b.reset_after_stdout:
                self.wfile.write(_HEAD + _frame(1, b.stdout))
                self.wfile.flush()
                # Linger 0: close() sends a reset, as a dying engine or a cut link does.
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
                self.close_connection = True
                return
            # The head and the output in one write: a client that reads late
            # finds them in one buffer.
            self.wfile.write(_HEAD + frames)
            self.close_connection = True
            if b.hold_start is not None:
                self.connection.settimeout(30)
                with contextlib.suppress(OSError):
                    if not self.rfile.read():  # until the client closes its end
                        b.start_closed.set()
        else:
            self._reply({"message": "no such route"}, 404)


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture(params=["unix", "tcp"])
def fake_engine(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> Iterator[tuple[str, _Behaviour]]:
    """A fake Engine API; ``tcp`` stands for a remote engine (in-band exit trailer)."""
    server: socketserver.BaseServer
    if request.param == "unix":
        path = str(tmp_path / "engine.sock")
        server = _UnixServer(path, _Handler)
        url = f"unix://{path}"
    else:
        server = _TcpServer(("127.0.0.1", 0), _Handler)
        url = f"tcp://127.0.0.1:{server.server_address[1]}"
    behaviour = _Behaviour()
    server.behaviour = behaviour  # type: ignore[attr-defined]
    server.cmds = {}  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield url, behaviour
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def _run(
    engine: SdkEngine, via: str, container: str = "c1", argv: Sequence[str] = ("true",)
) -> tuple[int | None, bytes, bytes]:
    """One exec, through ``exec`` or ``attach_exec``: (status, stdout, stderr)."""
    if via == "exec":
        out = await engine.exec(
            container, argv, env={}, workdir="/", user="0:0", max_output_bytes=1 << 16
        )
        return out.exit_code, out.stdout, out.stderr
    attached = await engine.attach_exec(
        container, argv, env={}, workdir="/", user="0:0", stdin=False, exit_trailer=engine.remote
    )
    got = {"stdout": b"", "stderr": b""}
    try:
        while (chunks := await attached.receive()) is not None:
            for name, data in chunks:
                got[name] += data
        code = await attached.exit_code()
    finally:
        await attached.aclose()
    return code, got["stdout"], got["stderr"]


@pytest.mark.parametrize("via", ["exec", "attach"])
async def test_output_sent_with_the_upgrade_answer_is_kept(
    fake_engine: tuple[str, _Behaviour], via: str
) -> None:
    url, _ = fake_engine
    engine = SdkEngine(url)
    try:
        for _ in range(3):
            assert await _run(engine, via) == (3, b"out\n", b"err\n")
    finally:
        await engine.aclose()


# Over TCP only: a unix socket cannot be reset, its close is the end of the output.
@pytest.mark.parametrize("fake_engine", ["tcp"], indirect=True)
@pytest.mark.parametrize("via", ["exec", "attach"])
async def test_a_connection_broken_mid_output_is_an_error_not_an_end(
    fake_engine: tuple[str, _Behaviour], via: str
) -> None:
    url, behaviour = fake_engine
    behaviour.reset_after_stdout = True
    engine = SdkEngine(url)
    try:
        with pytest.raises(EngineError, match="connection to the engine broke"):
            await _run(engine, via)
        assert behaviour.inspects == 0  # no status was waited for as if the output ended
    finally:
        await engine.aclose()


@pytest.mark.parametrize("via", ["exec", "attach"])
async def test_the_status_is_waited_for_while_the_engine_says_running(
    fake_engine: tuple[str, _Behaviour], via: str
) -> None:
    url, behaviour = fake_engine
    behaviour.send_trailer = False  # a remote trailer that never came: same path
    behaviour.running_looks = 3
    engine = SdkEngine(url)
    try:
        assert await _run(engine, via) == (3, b"out\n", b"err\n")
    finally:
        await engine.aclose()
    assert behaviour.inspects == 4


@pytest.mark.parametrize("via", ["exec", "attach"])
async def test_a_status_that_never_comes_is_a_clear_error(
    fake_engine: tuple[str, _Behaviour], via: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, behaviour = fake_engine
    behaviour.send_trailer = False
    behaviour.running_looks = -1
    behaviour.stdout = b"UNTRUSTED output\n"
    monkeypatch.setattr(attach_module, "STATUS_POLLS", 3, raising=False)
    engine = SdkEngine(url)
    try:
        with pytest.raises(EngineError, match="no exit status") as caught:
            await _run(engine, via)
    finally:
        await engine.aclose()
    assert "UNTRUSTED" not in caught.value.message
    assert behaviour.inspects == 3


async def test_a_cancelled_exec_start_returns_at_once_and_leaks_no_connection(
    fake_engine: tuple[str, _Behaviour],
) -> None:
    url, behaviour = fake_engine
    behaviour.hold_start = threading.Event()
    engine = SdkEngine(url)
    try:
        with anyio.move_on_after(0.2):
            await _run(engine, "exec")
        # Not waiting for the engine is what lets kill_marked bound its wait.
        assert not behaviour.start_answered
        behaviour.hold_start.set()
        # The abandoned start closes the connection it opened once it returns.
        assert await anyio.to_thread.run_sync(behaviour.start_closed.wait, 30)
    finally:
        behaviour.hold_start.set()
        await engine.aclose()


# --- a real engine, local and over ssh, under CPU load ---------------------------

_EXECS = 120
_HOGS = 2
_CONCURRENT = 4


@pytest.mark.parametrize("where", ["local", "ssh"])
async def test_every_exec_under_load_reports_its_status_and_output(
    where: str,
    anyio_backend: str,
    docker_ready: None,
    image: str,
    request: pytest.FixtureRequest,
) -> None:
    if where == "ssh" and anyio_backend != "asyncio":
        pytest.skip("the ssh transport runs on one anyio backend (asyncio) to save wall time")
    url = request.getfixturevalue("ssh_ready") if where == "ssh" else None
    started = await anyio.run_process(["docker", "run", "-d", "--rm", image, "sleep", "600"])
    container = started.stdout.decode().strip()
    hogs = [
        await anyio.open_process(["sh", "-c", "exec yes"], stdout=subprocess.DEVNULL)
        for _ in range(_HOGS)
    ]
    engine = SdkEngine(url)
    wrong: list[str] = []
    limit = anyio.Semaphore(_CONCURRENT)

    async def one(i: int) -> None:
        argv = ["sh", "-c", 'echo "out$1"; echo "err$1" >&2; exit "$2"', "x", str(i), str(i % 7)]
        async with limit:
            got = await _run(engine, "exec" if i % 2 else "attach", container, argv)
        if got != (i % 7, f"out{i}\n".encode(), f"err{i}\n".encode()):
            wrong.append(f"exec {i}: {got!r}")

    try:
        async with anyio.create_task_group() as tg:
            for i in range(_EXECS):
                tg.start_soon(one, i)
    finally:
        for hog in hogs:
            hog.kill()
            await hog.aclose()
        await engine.aclose()
        await anyio.run_process(["docker", "rm", "-f", container], check=False)
    assert not wrong, f"{len(wrong)} of {_EXECS} execs lost their status or output: {wrong[:5]}"
