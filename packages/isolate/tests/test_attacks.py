"""Scripts that try to leave the isolate or exhaust the host: each ends within its budget."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import anyio
import pytest

import corral
from corral_conformance import loopback_listener

pytestmark = pytest.mark.anyio

_READS = [
    "import('qjs:std').then(s => s.loadFile('/etc/passwd'))",
    "import('qjs:std').then(s => s.open('/etc/passwd', 'r'))",
    "import('qjs:std').then(s => s.getenviron())",
    "import('qjs:os').then(o => o.readdir('/')[0])",
    "import('qjs:os').then(o => o.open('/etc/passwd', o.O_RDONLY))",
    "import('qjs:os').then(o => o.stat('/etc/passwd')[0])",
    "import('qjs:os').then(o => o.readdir('.')[0])",
    "import('/etc/passwd').then(() => 'loaded', e => 'refused')",
]


@pytest.mark.parametrize("code", _READS)
async def test_host_files_are_out_of_reach(run, code: str) -> None:
    result = await run(code)
    assert "root:" not in (result.result_json or "") + result.stdout + result.stderr
    assert result.exit_code == 0, result
    value = json.loads(result.result_json)
    refused = value in (None, [], {}, "refused") or (isinstance(value, int) and value < 0)
    assert refused, f"{code} gave {value!r}"


async def test_writes_leave_no_file_on_the_host(run, tmp_path) -> None:
    target = tmp_path / "planted.txt"
    path = json.dumps(str(target))
    code = f"import('qjs:std').then(s => {{ const f = s.open({path}, 'w'); return f === null; }})"
    result = await run(code)
    assert result.result_json == "true"
    assert not target.exists()


async def test_loopback_is_unreachable(run) -> None:
    with loopback_listener() as witness:
        port = witness.port
        probes = await run(
            f"""
            const seen = [typeof fetch, typeof XMLHttpRequest, typeof WebSocket,
                          typeof require, typeof process];
            const net = /socket|connect|net|listen|bind/i;
            import('qjs:os').then(o => [seen, Object.keys(o).filter(k => net.test(k))])
            .then(v => {{ try {{ import('http://127.0.0.1:{port}/') }} catch {{}} return v; }})
            """
        )
    assert json.loads(probes.result_json) == [["undefined"] * 5, []]
    assert witness.accepted == 0, "a script reached a loopback server"


async def test_no_state_survives_a_call(run) -> None:
    first = await run("globalThis.leak = 41; Object.prototype.polluted = 1; Math.random = () => 7")
    assert first.exit_code == 0
    second = await run("[typeof leak, ({}).polluted, Math.random() === 7]")
    assert json.loads(second.result_json) == ["undefined", None, False]


async def test_infinite_loop_ends_at_the_deadline(run) -> None:
    started = time.monotonic()
    result = await run("console.log('start'); while (true) {}", timeout_s=0.3)
    elapsed = time.monotonic() - started
    assert result.timed_out
    assert result.exit_code is None
    assert result.stdout == "start\n"
    assert elapsed < 5, f"a 0.3 s budget took {elapsed:.1f} s"
    after = await run("1")
    assert after.result_json == "1", "the engine is unusable after a timeout"


async def test_a_pending_promise_is_a_timeout_not_a_hang(run) -> None:
    result = await run("new Promise(() => {})", timeout_s=0.3)
    assert result.timed_out


async def test_cancelling_the_caller_stops_the_isolate(runner) -> None:
    started = time.monotonic()
    with anyio.move_on_after(0.3):
        await runner.run_code("javascript", "while (true) {}", timeout_s=60)
    assert time.monotonic() - started < 5, "cancellation waited for the script"
    result = await runner.run_code("javascript", "2", timeout_s=5)
    assert result.result_json == "2"


async def test_interrupting_one_run_leaves_a_concurrent_one(runner) -> None:
    results: dict[str, corral.ExecResult] = {}

    async def spin() -> None:
        results["spin"] = await runner.run_code("javascript", "while (true) {}", timeout_s=0.3)

    async def work() -> None:
        code = "let s = 0; for (let i = 0; i < 3e6; i++) s += i; s"
        results["work"] = await runner.run_code("javascript", code, timeout_s=30)

    async with anyio.create_task_group() as tg:
        tg.start_soon(spin)
        tg.start_soon(work)
    assert results["spin"].timed_out
    assert results["work"].result_json == str(sum(range(3_000_000)))


async def test_deep_recursion_is_an_error(run) -> None:
    result = await run("function f(n) { return f(n + 1) + 1 } f(0)")
    assert result.exit_code == 1
    assert result.error is not None
    assert result.error.name == "RangeError"
    assert (await run("3")).result_json == "3"


async def test_huge_output_is_capped(run) -> None:
    result = await run("for (let i = 0; i < 1e5; i++) console.log('x'.repeat(100)); 'done'")
    assert result.stdout_truncated
    assert len(result.stdout.encode()) <= 1000 + 200
    assert result.result_json == '"done"'


async def test_allocation_bomb_is_an_error(run) -> None:
    result = await run("const a = []; while (true) a.push(new Array(1e6).fill(1))")
    assert result.exit_code == 1
    assert result.error is not None
    assert result.error.name == "InternalError"
    assert "memory" in result.error.value


_BOMB = textwrap.dedent(
    """
    import resource, anyio, json
    from corral_isolate import IsolateProvider
    import corral

    async def main():
        provider = IsolateProvider(memory_bytes=32 << 20)
        opened = await provider.open(corral.ProviderConfig("isolate"), corral.SessionRef("b"))
        script = opened.workspace.script
        await script.run_code("javascript", "1", timeout_s=30)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        outcomes = []
        for code in ("const a = []; while (true) a.push('x'.repeat(1 << 20) + Math.random())",
                     "new ArrayBuffer(2 ** 31)",
                     "const b = []; while (true) b.push(new Float64Array(1 << 18))"):
            result = await script.run_code("javascript", code, timeout_s=30)
            outcomes.append(result.error.name if result.error else repr(result))
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"grew_kib": after - before, "outcomes": outcomes}))

    anyio.run(main)
    """
)


def test_allocation_bombs_leave_the_host_process_unharmed() -> None:
    """In a child process, so its peak memory is measured from a clean start."""
    child = subprocess.run(
        [sys.executable, "-c", _BOMB], capture_output=True, timeout=120, check=False
    )
    assert child.returncode == 0, child.stderr.decode(errors="replace")[-2000:]
    report = json.loads(child.stdout.decode().strip().splitlines()[-1])
    assert all(name in ("InternalError", "RangeError") for name in report["outcomes"]), report
    # 32 MiB of guest memory plus the engine's own bookkeeping: far below what was asked for.
    assert report["grew_kib"] < 96 * 1024, report


_HANDLERS = textwrap.dedent(
    """
    import faulthandler, signal, anyio
    from corral_isolate import IsolateProvider
    import corral

    async def main():
        provider = IsolateProvider()
        opened = await provider.open(corral.ProviderConfig("isolate"), corral.SessionRef("h"))
        script = opened.workspace.script
        deep = "function f(n) { return f(n + 1) + 1 } f(0)"
        first = await script.run_code("javascript", deep, timeout_s=30)
        # What an in-process pytest run or a crash reporter does to signal handlers.
        faulthandler.enable()
        faulthandler.disable()
        for sig in (signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGFPE):
            signal.signal(sig, signal.SIG_DFL)
        second = await script.run_code("javascript", deep, timeout_s=30)
        bomb = await script.run_code("javascript", "new ArrayBuffer(2 ** 31)", timeout_s=30)
        print(first.error.name, second.error.name, bomb.error.name)

    faulthandler.enable()
    anyio.run(main)
    """
)


def test_traps_do_not_depend_on_the_hosts_signal_handlers() -> None:
    """A host that resets SIGSEGV/SIGILL handlers still survives a trapping script."""
    child = subprocess.run(
        [sys.executable, "-c", _HANDLERS], capture_output=True, timeout=120, check=False
    )
    assert child.returncode == 0, child.stderr.decode(errors="replace")[-2000:]
    assert child.stdout.split() == [b"RangeError", b"RangeError", b"RangeError"], child.stdout
