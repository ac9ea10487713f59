"""Row group 11: attached exec streams and the ``process`` module on docker.

* time to the first output byte of ``echo hi`` started as a process
  (start + a read that waits) against ``workspace_run`` of it (goal 1.2x);

* process output throughput: ``head -c N /dev/zero`` started as a process
  until every byte is recorded on the host, against the same command piped
  out of a raw ``docker exec`` into ``/dev/null`` (goal: at least 0.3x the
  pipe's throughput, i.e. at most 3.33x its time);
* ``workspace_run`` with 1 MiB of stdin (only possible attached) against
  ``docker exec -i`` fed by the CLI;
* before/after: 60 KiB of stdin through the attached stream against the old
  environment-variable transport (which capped stdin at 64 KiB).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio.to_thread

import corral
import corral.provider

from _harness import BenchSkip, Ctx, Goal, Row, fmt_num, paired, run_pair, skip_reason
from _providers import DOCKER_IMAGE, precheck


def _row(key: str, title: str, subject: str, baseline: str, goal: Goal | None = None) -> Row:
    return Row(
        id=f"dockerproc.{key}.docker",
        group="11 docker process",
        title=title,
        provider="docker",
        subject=subject,
        baseline=baseline,
        goal=goal,
    )


class _EnvOnlyEngine:
    """The SDK engine without ``attach_exec``: the shell falls back to stdin in the environment."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def remote(self) -> bool:
        return bool(self._inner.remote)

    async def exec(
        self,
        container_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        workdir: str,
        user: str,
        max_output_bytes: int,
    ) -> Any:
        return await self._inner.exec(
            container_id,
            argv,
            env=env,
            workdir=workdir,
            user=user,
            max_output_bytes=max_output_bytes,
        )


async def docker_process_rows(ctx: Ctx) -> list[Row]:
    """Group 11: process throughput, attached stdin, stdin before/after."""
    size = (128 if ctx.quick else 1024) << 20
    label = f"{size >> 20} MiB"
    thru = _row(
        "throughput",
        f"process output `head -c {label}`",
        "process handle (recorded)",
        "docker exec pipe",
        Goal("ratio", 3.33),
    )
    stdin_mib = _row("stdin_1m", "run `wc -c` with 1 MiB stdin", "workspace_run", "docker exec -i")
    before = _row(
        "stdin_60k",
        "run `wc -c` with 60 KiB stdin",
        "attached stdin (after)",
        "stdin in the environment (before)",
    )
    first = _row(
        "first_byte",
        "first byte of `echo hi`",
        "process start + read",
        "workspace_run",
        Goal("ratio", 1.2),
    )
    rows = [thru, first, stdin_mib, before]
    reason = precheck("docker")
    if reason is not None:
        for row in rows:
            row.skipped = reason
        return rows
    from corral_docker import DockerProvider
    from corral_docker._shell import DockerShell

    provider = DockerProvider(image=DOCKER_IMAGE, pull=False, tmpdir_root=str(ctx.tmp))
    try:
        opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("bench"))
    except corral.WorkspaceFailedError as exc:
        for row in rows:
            row.skipped = skip_reason(exc)
        await provider.aclose()
        return rows
    ws = opened.workspace
    cid = str(corral.provider.describe_workspace(ws)["container_id"])
    try:
        try:
            await _throughput(ctx, thru, ws.module("process"), cid, size)  # type: ignore[attr-defined]
        except (BenchSkip, corral.OperationError) as exc:
            thru.skipped = skip_reason(exc)
        shell = ws.shell
        assert isinstance(shell, DockerShell)
        await run_pair(
            ctx,
            first,
            _first_byte(ws.module("process")),
            _run_echo(shell),
            slow=True,  # type: ignore[attr-defined]
        )
        one_mib = "x" * (1 << 20)
        await run_pair(
            ctx,
            stdin_mib,
            _run_wc(shell, one_mib),
            _cli_exec_stdin(cid, one_mib.encode()),
            slow=True,
        )
        legacy = DockerShell(
            _EnvOnlyEngine(provider.engine),  # type: ignore[arg-type]
            _fixed(cid),
            shell._checker,
            user=shell._user,
            closed=lambda: False,
        )
        sixty = "y" * (60 << 10)
        await run_pair(ctx, before, _run_wc(shell, sixty), _run_wc(legacy, sixty), slow=True)
    finally:
        await ws.close()
        await provider.aclose()
    return rows


def _fixed(value: str) -> Callable[[], Awaitable[str]]:
    async def get() -> str:
        return value

    return get


def _run_wc(shell: Any, stdin: str) -> Callable[[], Awaitable[None]]:
    request = corral.provider.CommandRequest("wc -c", stdin=stdin)

    async def call() -> None:
        result = await shell.run(request)
        if result.exit_code != 0 or int(result.stdout.split()[0]) != len(stdin):
            raise BenchSkip(f"wc -c failed: {result.stderr[:120]}")

    return call


def _first_byte(pm: Any) -> Callable[[], Awaitable[None]]:
    request = corral.provider.ProcessRequest("echo hi")

    async def call() -> None:
        info = await pm.start(request)
        chunk = await pm.read(info.process_id, cursor=0, wait_s=30)
        if chunk.data != b"hi\n":
            raise BenchSkip("echo hi printed something else")

    return call


def _run_echo(shell: Any) -> Callable[[], Awaitable[None]]:
    request = corral.provider.CommandRequest("echo hi")

    async def call() -> None:
        if (await shell.run(request)).stdout != "hi\n":
            raise BenchSkip("echo hi printed something else")

    return call


def _cli_exec_stdin(cid: str, data: bytes) -> Callable[[], None]:
    argv = ["docker", "exec", "-i", cid, "wc", "-c"]

    def call() -> None:
        subprocess.run(argv, input=data, check=True, capture_output=True)

    return call


async def _throughput(ctx: Ctx, row: Row, pm: Any, cid: str, size: int) -> None:
    command = f"head -c {size} /dev/zero"
    reps = 3 if ctx.quick else 5
    s_ns: list[float] = []
    b_ns: list[float] = []
    for i in range(reps):
        order = (_raw_pipe, _handle) if i % 2 else (_handle, _raw_pipe)
        for op in order:
            ns = await op(pm, cid, command, size)
            (s_ns if op is _handle else b_ns).append(ns)
    paired(row, s_ns, b_ns)
    assert row.subject_ns is not None
    assert row.baseline_ns is not None
    mbs = size / (row.subject_ns.median / 1e9) / 1e6
    raw = size / (row.baseline_ns.median / 1e9) / 1e6
    row.shown = f"{fmt_num(mbs)} MB/s vs {fmt_num(raw)} MB/s"
    row.extra = {"bytes": size, "handle_mb_s": mbs, "pipe_mb_s": raw}
    ctx.log(f"{row.id}: {row.shown}")


async def _handle(pm: Any, cid: str, command: str, size: int) -> float:
    del cid
    started = time.perf_counter_ns()
    info = await pm.start(corral.provider.ProcessRequest(command, retained_bytes=8 << 20))
    final = await pm.wait(info.process_id, timeout_s=600)
    ns = time.perf_counter_ns() - started
    if final.stdout_end != size:
        raise BenchSkip(f"the handle recorded {final.stdout_end} of {size} bytes")
    await pm.remove(info.process_id)
    return float(ns)


async def _raw_pipe(pm: Any, cid: str, command: str, size: int) -> float:
    del pm, size
    argv = ["docker", "exec", cid, "sh", "-c", command]

    def run() -> None:
        with open("/dev/null", "wb") as sink:
            subprocess.run(argv, stdout=sink, check=True)

    started = time.perf_counter_ns()
    await anyio.to_thread.run_sync(run)
    return float(time.perf_counter_ns() - started)
