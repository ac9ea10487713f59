"""Test doubles: a scripted ProcessManager and a provider that adds it to in-memory workspaces.

The fake honours the protocol's cursor contract (byte offsets, a retained
window, ``CursorExpiredError`` naming the earliest cursor, ``wait_s``
long-polls, ``ended``) with a tiny command language:

* ``echo TEXT`` writes ``TEXT\\n`` and exits 0;
* ``cat`` copies stdin to stdout until stdin closes, then exits 0;
* ``count N`` writes ``0\\n`` .. ``N-1\\n`` and exits 0;
* ``fail`` writes ``oops\\n`` to stderr and exits 3;
* anything else runs until killed.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import attrs

from corral.provider import (
    CursorExpiredError,
    OpenedWorkspace,
    OperationError,
    ProcessInfo,
    ProcessRequest,
    ProviderConfig,
    SessionRef,
    StreamChunk,
    StreamName,
    TerminalSize,
    Workspace,
    WorkspaceRef,
)
from corral_memory import InMemoryProvider
from corral_server import LocalBlobStore, WorkspaceService, open_store, serve


class _Proc:
    def __init__(self, pid: str, request: ProcessRequest) -> None:
        self.pid = pid
        self.request = request
        self.out = {"stdout": bytearray(), "stderr": bytearray()}
        self.start = {"stdout": 0, "stderr": 0}
        self.info = ProcessInfo(
            process_id=pid,
            command=request.command,
            state="running",
            started_at=time.time(),
            terminal=request.terminal,
            stdin_open=True,
        )
        self.changed = anyio.Event()

    def end(self) -> int:
        return 0


class FakeProcessManager:
    """An in-process ProcessManager following the protocol's contract."""

    def __init__(self) -> None:
        self.procs: dict[str, _Proc] = {}
        self.closed = False
        self._n = 0

    def _get(self, pid: str) -> _Proc:
        if self.closed:
            raise OperationError("closed", code="closed")
        try:
            return self.procs[pid]
        except KeyError:
            raise OperationError("no such process", code="not_found") from None

    def _notify(self, p: _Proc) -> None:
        p.changed.set()
        p.changed = anyio.Event()

    def emit(self, p: _Proc, stream: str, data: bytes) -> None:
        buf = p.out[stream]
        buf += data
        total = p.start[stream] + len(buf)
        keep = p.request.retained_bytes
        if len(buf) > keep:
            drop = len(buf) - keep
            del buf[:drop]
            p.start[stream] += drop
        field = "stdout_end" if stream == "stdout" else "stderr_end"
        start_field = "stdout_start" if stream == "stdout" else "stderr_start"
        p.info = attrs.evolve(p.info, **{field: total, start_field: p.start[stream]})
        self._notify(p)

    def finish(
        self, p: _Proc, state: str = "exited", code: int | None = 0, reason: str | None = None
    ) -> None:
        if p.info.state != "running":
            return
        p.info = attrs.evolve(
            p.info,
            state=state,
            exit_code=code,
            ended_at=time.time(),
            stdin_open=False,
            reason=reason,
        )
        self._notify(p)

    async def start(self, request: ProcessRequest) -> ProcessInfo:
        if self.closed:
            raise OperationError("closed", code="closed")
        self._n += 1
        pid = f"p{self._n:016x}"
        p = self.procs[pid] = _Proc(pid, request)
        cmd = request.command
        if cmd.startswith("echo "):
            self.emit(p, "stdout", cmd[5:].encode() + b"\n")
            self.finish(p)
        elif cmd.startswith("count "):
            n = int(cmd.split()[1])
            self.emit(p, "stdout", b"".join(f"{i}\n".encode() for i in range(n)))
            self.finish(p)
        elif cmd == "fail":
            self.emit(p, "stderr", b"oops\n")
            self.finish(p, code=3)
        return p.info

    async def read(
        self,
        process_id: str,
        stream: StreamName = "stdout",
        *,
        cursor: int = 0,
        max_bytes: int = 65536,
        wait_s: float = 0.0,
    ) -> StreamChunk:
        p = self._get(process_id)
        if cursor < 0 or max_bytes < 1 or wait_s < 0:
            raise OperationError("bad argument", code="invalid_argument")
        with anyio.move_on_after(wait_s):
            while True:
                end = p.start[stream] + len(p.out[stream])
                if cursor < end or p.info.state != "running":
                    break
                await p.changed.wait()
        start = p.start[stream]
        end = start + len(p.out[stream])
        if cursor < start:
            raise CursorExpiredError("expired", earliest=start)
        ended = p.info.state != "running"
        if cursor > end and ended:
            raise OperationError("beyond the end", code="invalid_argument")
        data = bytes(p.out[stream][cursor - start : cursor - start + max_bytes])
        nxt = cursor + len(data)
        return StreamChunk(data=data, cursor=cursor, next_cursor=nxt, ended=ended and nxt == end)

    async def write_stdin(self, process_id: str, data: bytes) -> None:
        p = self._get(process_id)
        if not p.info.stdin_open:
            raise OperationError("stdin closed", code="closed")
        if p.request.command == "cat":
            self.emit(p, "stdout", data)

    async def close_stdin(self, process_id: str) -> None:
        p = self._get(process_id)
        if p.request.command == "cat":
            self.finish(p)
        p.info = attrs.evolve(p.info, stdin_open=False)

    async def wait(self, process_id: str, *, timeout_s: float) -> ProcessInfo:
        p = self._get(process_id)
        with anyio.move_on_after(timeout_s):
            while p.info.state == "running":
                await p.changed.wait()
        return p.info

    async def signal(self, process_id: str, signal: int) -> None:
        p = self._get(process_id)
        if p.info.state == "running":
            p.info = attrs.evolve(p.info, signal=signal)
            self.finish(p, state="exited", code=None)

    async def kill(self, process_id: str) -> ProcessInfo:
        p = self._get(process_id)
        self.finish(p, state="killed", code=None, reason="killed")
        return p.info

    async def resize(self, process_id: str, size: TerminalSize) -> None:
        p = self._get(process_id)
        if p.info.terminal is None:
            raise OperationError("no terminal", code="invalid_argument")
        p.info = attrs.evolve(p.info, terminal=size)

    async def info(self, process_id: str) -> ProcessInfo:
        return self._get(process_id).info

    async def list(self) -> Sequence[ProcessInfo]:
        return [p.info for p in self.procs.values()]

    async def remove(self, process_id: str) -> None:
        self.procs.pop(process_id, None)

    def close(self) -> None:
        for p in self.procs.values():
            self.finish(p, state="killed", code=None, reason="workspace closed")
        self.closed = True


class _WithProcess:
    def __init__(self, inner: Workspace, pm: FakeProcessManager) -> None:
        self._inner = inner
        self._pm = pm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def fs(self) -> Any:
        return self._inner.fs

    def module(self, name: str) -> object | None:
        return self._pm if name == "process" else self._inner.module(name)

    async def close(self) -> None:
        self._pm.close()
        await self._inner.close()


class ProcessMemoryProvider:
    """``in-memory`` plus a fake ``process`` module (per workspace, found again on resolve)."""

    provider_id = "in-memory"
    capabilities = frozenset({"fs", "snapshot", "process"})
    schema_version = 2

    def __init__(self) -> None:
        self.inner = InMemoryProvider()
        self.managers: dict[str, FakeProcessManager] = {}
        self.opened = 0
        self.openable = True

    async def open(
        self, config: ProviderConfig, session: SessionRef, declared: frozenset[str] | None = None
    ) -> OpenedWorkspace:
        if not self.openable:
            raise AssertionError("the provider must not be opened here")
        self.opened += 1
        opened = await self.inner.open(config, session, (declared or frozenset()) - {"process"})
        pm = self.managers.setdefault(opened.workspace.id, FakeProcessManager())
        return OpenedWorkspace(workspace=_WithProcess(opened.workspace, pm), ref=opened.ref)  # type: ignore[arg-type]

    async def resolve(self, ref: WorkspaceRef) -> Workspace:
        if not self.openable:
            raise AssertionError("the provider must not be resolved here")
        ws = await self.inner.resolve(ref)
        pm = self.managers.setdefault(ws.id, FakeProcessManager())
        return _WithProcess(ws, pm)  # type: ignore[return-value]


def make_service(
    tmp_path: Path, provider: Any, *, url: str | None = None, **kw: Any
) -> WorkspaceService:
    """A service over a SQLite file (or ``url``) whose every sandbox uses ``provider``."""
    store = open_store(url or str(tmp_path / "state.db"))
    blobs = LocalBlobStore(str(tmp_path / "blobs"))
    kw.setdefault("holder", "test-holder")
    return WorkspaceService(store, blobs, providers=lambda _s: provider, **kw)


@asynccontextmanager
async def running(service: WorkspaceService, **kw: Any) -> AsyncIterator[tuple[str, str]]:
    """Serve ``service`` on a free loopback port: yields ``(base_url, token of project 'p1')``."""
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(
            lambda task_status: serve(service, port=0, task_status=task_status, **kw)
        )
        if await service.store.project_by_name("p1") is None:
            _pid, token = await service.create_project("p1")
        else:
            token = await service.add_token(str(await service.store.project_by_name("p1")))
        try:
            yield f"http://{host}:{port}", token
        finally:
            tg.cancel_scope.cancel()


SANDBOX = {"provider": "in-memory", "capabilities": ["fs", "process"]}
"""A sandbox definition the fake provider accepts."""

REQUIRE_POSTGRES = os.environ.get("CORRAL_REQUIRE_POSTGRES") == "1"


def _reachable_by_others(path: str) -> bool:
    """Whether every directory down to ``path`` lets other users pass (mode o+x)."""
    import stat

    p = Path(path).resolve()
    return all(os.stat(d).st_mode & stat.S_IXOTH for d in [p, *p.parents])


class PostgresCluster:
    """A private PostgreSQL cluster in a temp dir (initdb + pg_ctl), torn down by :meth:`stop`.

    root cannot run postgres: as root the cluster belongs to the ``postgres``
    system user (Debian's package creates it); otherwise to the current user.
    """

    def __init__(self) -> None:
        import glob
        import pwd
        import shutil
        import socket
        import subprocess
        import tempfile

        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        initdb = bins[-1] if bins else shutil.which("initdb")
        if initdb is None:
            raise RuntimeError("PostgreSQL is not installed (no initdb)")
        self.bin = os.path.dirname(initdb)
        # Not under pytest's tmp (mode 0700, owned by root): the cluster's user must reach it.
        parent = tempfile.gettempdir()
        if os.geteuid() == 0 and not _reachable_by_others(parent):
            parent = "/tmp"  # CI's private TMPDIR is 0700: postgres could not enter it
        base = Path(tempfile.mkdtemp(prefix="corral-pg-", dir=parent))
        os.chmod(base, 0o755)
        self.base = base
        self.dir = base / "pg"
        self.dir.mkdir(mode=0o700)
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(base, pw.pw_uid, pw.pw_gid)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._run = subprocess.run
        data = str(self.dir / "data")
        self._run(
            [
                *self.prefix,
                f"{self.bin}/initdb",
                "-D",
                data,
                "--auth=trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
        )
        self._run(
            [
                *self.prefix,
                f"{self.bin}/pg_ctl",
                "-D",
                data,
                "-l",
                str(self.dir / "log"),
                "-w",
                "-t",
                "60",
                "-o",
                f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off",
                "start",
            ],
            check=True,
            capture_output=True,
        )
        self.data = data
        self._n = 0

    def new_database(self) -> str:
        """A fresh database on the cluster: its URL."""
        import psycopg

        self._n += 1
        name = f"t{os.getpid()}_{self._n}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def url(self, db: str) -> str:
        """The URL of a database of the cluster."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        """Stop the cluster (fast shutdown) and remove its files."""
        import shutil

        self._run(
            [*self.prefix, f"{self.bin}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(self.base, ignore_errors=True)


async def raw_events(client: Any, ws: str, h: str, *, until: Any, headers: str = "") -> list[str]:
    """GET a handle's event stream over a bare socket and hang up once ``until(text)`` holds.

    A bare socket, not httpx: hanging up mid-stream is the point, and
    httpx's stream generators left unfinished would warn under trio.
    """
    base = str(client._http.base_url).rstrip("/")
    host, port = base.removeprefix("http://").rsplit(":", 1)
    token = client._http.headers["authorization"]
    request = (
        f"GET /v1/workspaces/{ws}/handles/{h}/events HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: {token}\r\n{headers}\r\n"
    ).encode()
    text = ""
    async with await anyio.connect_tcp(host, int(port)) as sock:
        await sock.send(request)
        with anyio.fail_after(20):
            while not until(text):
                text += (await sock.receive()).decode()
    return [
        line.strip().lower()
        if ":" in line and not line.startswith(("data", "id", ":"))
        else line.strip()
        for line in text.split("\n")
    ]


class ServerProcess:
    """A real ``corral serve`` subprocess (killable with SIGKILL)."""

    def __init__(self, data: Path, *args: str, argv: list[str] | None = None) -> None:
        import subprocess
        import sys

        self.data = data
        self.args = args
        data.mkdir(parents=True, exist_ok=True)
        self.log = open(data / "server.log", "ab")  # noqa: SIM115 - closed in stop()
        command = argv or [
            sys.executable,
            "-m",
            "corral",
            "serve",
            "--port",
            "0",
            "--data",
            str(data),
        ]
        self.proc = subprocess.Popen(
            [*command, *args],
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if "listening on " not in line:
            self.stop()
            raise RuntimeError(
                "corral serve did not start: " + (data / "server.log").read_text()[-2000:]
            )
        self.url = line.split("listening on ", 1)[1].strip()

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind runs."""
        import signal

        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._close()

    def _close(self) -> None:
        self.log.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self) -> None:
        """SIGTERM and wait."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self._close()


class Box:
    """One server data dir + boxes dir, restartable."""

    def __init__(self, tmp_path: Path) -> None:
        self.data = tmp_path / "data"
        self.boxes = tmp_path / "boxes"
        self.boxes.mkdir()
        self.server: ServerProcess | None = None
        self.client: Any = None

    def start(self) -> Any:
        import sys

        argv = [
            sys.executable,
            os.path.join(os.path.dirname(__file__), "server_main.py"),
            str(self.data),
            str(self.boxes),
        ]
        self.server = ServerProcess(self.data, argv=argv)
        from corral_server import Client

        self.client = Client(self.server.url, (self.data / "token").read_text().strip())
        return self.client

    def kill(self) -> None:
        assert self.server is not None
        assert self.client is not None
        self.server.kill()
        self.client.close()

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.stop()


# A tree with modes, private dirs and every kind of symlink (relative, to the host,
# climbing out, dangling): what a version must carry and never follow.
TREE_SETUP = r"""
set -e
mkdir -p bin private/deep
printf '#!/bin/sh\necho ran-$1\n' > bin/tool
chmod 755 bin/tool
printf 'secret' > private/deep/key
chmod 600 private/deep/key
chmod 700 private
printf 'hello' > plain.txt
chmod 640 plain.txt
ln -s tool bin/alias
ln -s ../plain.txt bin/up
ln -s /etc/passwd host-file
ln -s ../../../../../../../../etc host-dir
ln -s does/not/exist dangling
"""
