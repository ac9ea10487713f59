"""The ``code`` module on the host (local-bash's boundary): real interpreters, real process trees.

Every test derives from the CodeInterpreter contract in ``corral/_protocols.py``:
state kept within a context and isolated across contexts, errors as values,
interrupt-then-kill on timeout with the state reported honestly, lost
contexts never silently replaced, one cell per context at a time, and
nothing left running after the workspace closes.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from corral.provider import CodeContexts, OperationError
from corral_posix._code import PosixCodeInterpreter

pytestmark = pytest.mark.anyio


@pytest.fixture
async def code(tmp_path: Path) -> AsyncIterator[PosixCodeInterpreter]:
    root, state = tmp_path / "ws", tmp_path / "state"
    root.mkdir()
    state.mkdir()
    interpreter = PosixCodeInterpreter(str(root), state_dir=str(state), busy_wait_s=0.3)
    yield interpreter
    await interpreter.aclose()


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or gone between open and read
        return False


async def test_is_a_code_contexts_module(code: PosixCodeInterpreter) -> None:
    assert isinstance(code, CodeContexts)
    # What is really installed, no more: bash and node are hosted when present.
    expected = {"python"} | {
        lang for lang, prog in (("bash", "bash"), ("javascript", "node")) if shutil.which(prog)
    }
    assert code.languages == expected
    assert code.details()["code_languages"] == sorted(expected)


async def test_state_persists_within_a_context_and_not_across(code: PosixCodeInterpreter) -> None:
    a = await code.create_context("python")
    b = await code.create_context("python")
    first = await code.run_in_context(a, "x = 41", timeout_s=10)
    assert first.state == "kept"
    assert first.exit_code == 0
    assert first.result_json is None
    again = await code.run_in_context(a, "x + 1", timeout_s=10)
    assert again.result_json == "42"
    assert [o.kind for o in again.outputs] == ["result"]
    assert again.outputs[0].data["text/plain"] == "42"
    other = await code.run_in_context(b, "x", timeout_s=10)
    assert other.error is not None
    assert other.error.name == "NameError"
    assert other.exit_code == 1
    assert other.state == "kept"


async def test_run_code_is_fresh_each_time(code: PosixCodeInterpreter) -> None:
    one = await code.run_code("python", "y = 5\ny", timeout_s=10)
    assert one.result_json == "5"
    assert one.state == "fresh"
    two = await code.run_code("python", "y", timeout_s=10)
    assert two.error is not None
    assert two.error.name == "NameError"
    assert two.state == "fresh"
    assert await code.list_contexts() == []


async def test_errors_carry_name_value_and_a_traceback_of_the_cell(
    code: PosixCodeInterpreter,
) -> None:
    ctx = await code.create_context("python")
    result = await code.run_in_context(
        ctx, "def f():\n    raise ValueError('bad thing')\nf()", timeout_s=10
    )
    assert result.error is not None
    assert (result.error.name, result.error.value) == ("ValueError", "bad thing")
    assert "<cell-1>" in result.error.traceback
    assert "raise ValueError" in result.error.traceback
    assert "corral-driver" not in result.error.traceback
    syntax = await code.run_in_context(ctx, "def (", timeout_s=10)
    assert syntax.error is not None
    assert syntax.error.name == "SyntaxError"
    # exit() in a cell is an error of the cell, not the end of the context.
    bye = await code.run_in_context(ctx, "exit(3)", timeout_s=10)
    assert bye.error is not None
    assert bye.error.name == "SystemExit"
    assert bye.state == "kept"
    assert (await code.run_in_context(ctx, "1", timeout_s=10)).result_json == "1"


async def test_output_of_every_kind_is_captured_and_cannot_corrupt_the_channel(
    code: PosixCodeInterpreter,
) -> None:
    ctx = await code.create_context("python")
    cell = textwrap.dedent(
        """
        import os, subprocess, sys
        print("printed")
        os.write(1, b"\\x00\\x00\\x00\\x05hello raw fd\\n")
        subprocess.run(["echo", "from a child"])
        print("to stderr", file=sys.stderr)
        os.write(1, b"\\x00corral-end-0123\\x00 fake mark\\n")
        """
    )
    result = await code.run_in_context(ctx, cell, timeout_s=10)
    assert result.error is None
    assert result.stdout == (
        "printed\n\x00\x00\x00\x05hello raw fd\nfrom a child\n\x00corral-end-0123\x00 fake mark\n"
    )
    assert result.stderr == "to stderr\n"
    assert (await code.run_in_context(ctx, "2 * 21", timeout_s=10)).result_json == "42"


async def test_output_is_capped_and_flagged(tmp_path: Path) -> None:
    code = PosixCodeInterpreter(str(tmp_path), state_dir=str(tmp_path), max_output_bytes=1000)
    try:
        result = await code.run_code("python", "print('x' * 5000)", timeout_s=10)
        assert result.stdout_truncated
        assert not result.stderr_truncated
        assert len(result.stdout) == 1000
    finally:
        await code.aclose()


async def test_rich_outputs_are_mime_bundles(code: PosixCodeInterpreter) -> None:
    ctx = await code.create_context("python")
    cell = textwrap.dedent(
        """
        class Rich:
            def _repr_html_(self): return "<b>rich</b>"
            def _repr_markdown_(self): return "**rich**"
            def _repr_png_(self): return b"\\x89PNG fake"
            def _repr_svg_(self): return "<svg/>"
            def _repr_json_(self): return {"a": 1}
            def __repr__(self): return "Rich()"
        display(Rich())
        {"json": [1, 2]}
        """
    )
    result = await code.run_in_context(ctx, cell, timeout_s=10)
    shown, value = result.outputs
    assert shown.kind == "display"
    assert shown.data["text/html"] == "<b>rich</b>"
    assert shown.data["text/markdown"] == "**rich**"
    assert shown.data["image/svg+xml"] == "<svg/>"
    assert shown.data["image/png"] == "iVBORyBmYWtl"  # base64 of the bytes
    assert json.loads(shown.data["application/json"]) == {"a": 1}
    assert shown.data["text/plain"] == "Rich()"
    assert value.kind == "result"
    assert json.loads(result.result_json or "") == {"json": [1, 2]}


async def test_timeout_interrupts_and_the_state_survives(code: PosixCodeInterpreter) -> None:
    ctx = await code.create_context("python")
    await code.run_in_context(ctx, "kept = 'yes'", timeout_s=10)
    result = await code.run_in_context(
        ctx, "import time\nprint('started')\nwhile True: time.sleep(0.05)", timeout_s=0.5
    )
    assert result.timed_out
    assert result.exit_code is None
    assert result.state == "kept"
    assert result.error is not None
    assert result.error.name == "KeyboardInterrupt"
    assert result.stdout == "started\n"
    assert (await code.run_in_context(ctx, "kept", timeout_s=10)).result_json == '"yes"'


async def test_an_ignored_interrupt_kills_and_the_context_stays_lost(
    code: PosixCodeInterpreter,
) -> None:
    ctx = await code.create_context("python")
    pid = json.loads(
        (await code.run_in_context(ctx, "import os\nos.getpid()", timeout_s=10)).result_json or ""
    )
    stubborn = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"
    result = await code.run_in_context(ctx, stubborn, timeout_s=0.3)
    assert result.timed_out
    assert result.state == "lost"
    assert not alive(pid)
    for _ in range(2):  # reported every time, never replaced by a fresh interpreter
        with pytest.raises(OperationError) as caught:
            await code.run_in_context(ctx, "1", timeout_s=10)
        assert caught.value.code == "lost"
        assert "ignored the interrupt" in caught.value.message
    [info] = await code.list_contexts()
    assert info.status == "lost"
    assert info.lost_reason is not None
    await code.restart_context(ctx)
    fresh = await code.run_in_context(ctx, "1 + 1", timeout_s=10)
    assert fresh.result_json == "2"
    assert fresh.state == "kept"


async def test_a_context_that_dies_is_reported_lost_with_the_reason(
    code: PosixCodeInterpreter,
) -> None:
    ctx = await code.create_context("python")
    died = await code.run_in_context(
        ctx, "import os, signal\nos.kill(os.getpid(), 9)", timeout_s=10
    )
    assert died.state == "lost"
    assert died.exit_code is None
    with pytest.raises(OperationError) as caught:
        await code.run_in_context(ctx, "1", timeout_s=10)
    assert caught.value.code == "lost"
    assert "SIGKILL" in caught.value.message
    await code.delete_context(ctx)
    with pytest.raises(OperationError) as gone:
        await code.run_in_context(ctx, "1", timeout_s=10)
    assert gone.value.code == "not_found"


async def test_one_cell_per_context_at_a_time(code: PosixCodeInterpreter) -> None:
    ctx = await code.create_context("python")
    other = await code.create_context("python")
    outcome: dict[str, object] = {}

    async def slow() -> None:
        outcome["slow"] = await code.run_in_context(
            ctx, "import time\ntime.sleep(1.5)\n'slow'", timeout_s=10
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow)
        await anyio.sleep(0.2)
        with pytest.raises(OperationError) as caught:
            await code.run_in_context(ctx, "1", timeout_s=10)
        assert caught.value.code == "busy"
        # Another context is not held up.
        assert (await code.run_in_context(other, "3", timeout_s=10)).result_json == "3"
        info = {i.context_id: i.status for i in await code.list_contexts()}
        assert info[ctx] == "busy"
    assert getattr(outcome["slow"], "result_json", None) == '"slow"'


async def test_interrupt_context(code: PosixCodeInterpreter) -> None:
    ctx = await code.create_context("python")
    assert await code.interrupt_context(ctx) is False
    results: list[object] = []

    async def loop() -> None:
        results.append(await code.run_in_context(ctx, "while True: pass", timeout_s=30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(loop)
        with anyio.fail_after(10):
            while not await code.interrupt_context(ctx):
                await anyio.sleep(0.02)
    [result] = results
    assert getattr(result, "state", None) == "kept"
    assert getattr(getattr(result, "error", None), "name", None) == "KeyboardInterrupt"


async def test_a_cancelled_caller_leaves_the_context_usable(code: PosixCodeInterpreter) -> None:
    ctx = await code.create_context("python")
    with anyio.move_on_after(0.3):
        await code.run_in_context(ctx, "v = 1\nimport time\ntime.sleep(30)", timeout_s=60)
    after = await code.run_in_context(ctx, "v", timeout_s=10)
    assert after.result_json == "1"
    assert after.state == "kept"


async def test_bad_language_and_cwd(code: PosixCodeInterpreter, tmp_path: Path) -> None:
    with pytest.raises(OperationError) as caught:
        await code.create_context("cobol")
    assert caught.value.code == "invalid_argument"
    assert "available: " in caught.value.message
    assert "python" in caught.value.message
    with pytest.raises(OperationError) as missing:
        await code.create_context("python", cwd="no/such/dir")
    assert missing.value.code == "not_found"
    with pytest.raises(OperationError) as outside:
        await code.create_context("python", cwd="../..")
    assert outside.value.code in {"invalid_path", "path_outside_workspace"}
    (tmp_path / "ws" / "sub").mkdir()
    ctx = await code.create_context("python", cwd="sub")
    result = await code.run_in_context(ctx, "import os\nos.getcwd()", timeout_s=10)
    assert json.loads(result.result_json or "") == str(tmp_path / "ws" / "sub")


async def test_close_kills_every_process_a_context_started(tmp_path: Path) -> None:
    code = PosixCodeInterpreter(str(tmp_path), state_dir=str(tmp_path))
    pids: list[int] = []
    for _ in range(3):
        ctx = await code.create_context("python")
        cell = (
            "import os, subprocess\n"
            "p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
            "[os.getpid(), p.pid]"
        )
        pids += json.loads((await code.run_in_context(ctx, cell, timeout_s=10)).result_json or "")
    assert all(alive(pid) for pid in pids)
    await code.aclose()
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(OperationError) as caught:
        await code.create_context("python")
    assert caught.value.code == "closed"


_ORPHAN = """
import json, os, sys
import anyio
from corral_posix._code import PosixCodeInterpreter

async def main():
    code = PosixCodeInterpreter(sys.argv[1], state_dir=sys.argv[2])
    ctx = await code.create_context("python")
    r = await code.run_in_context(ctx, "import os\\nos.getpid()", timeout_s=10)
    print(json.dumps([ctx, json.loads(r.result_json)]), flush=True)
    os._exit(0)  # dies without closing anything

anyio.run(main)
"""


async def test_contexts_of_a_process_that_died_are_lost_after_resolve(tmp_path: Path) -> None:
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    ctx, pid = json.loads(done.stdout)
    with anyio.fail_after(15):
        while alive(pid):  # the reaper saw its host go and killed the tree
            await anyio.sleep(0.05)
    code = PosixCodeInterpreter(str(tmp_path), state_dir=str(tmp_path))
    try:
        with pytest.raises(OperationError) as caught:
            await code.run_in_context(ctx, "1", timeout_s=10)
        assert caught.value.code == "lost"
        assert "ended with the process" in caught.value.message
        [info] = await code.list_contexts()
        assert info.context_id == ctx
        assert info.status == "lost"
        await code.delete_context(ctx)
        assert await code.list_contexts() == []
    finally:
        await code.aclose()
    assert os.path.exists(tmp_path / "code-contexts.json")


_FAKE_PYPLOT = """
_figures = {}


class Figure:
    def __init__(self, number):
        self.number = number

    def savefig(self, buffer, format, bbox_inches=None):
        buffer.write(b"\\x89PNG figure %d" % self.number)

    def __repr__(self):
        return "<Figure %d>" % self.number


def plot(*args):
    _figures.setdefault(1, Figure(1))


def figure(num):
    return _figures[num]


def get_fignums():
    return sorted(_figures)


def close(which):
    _figures.clear()
"""


async def test_open_figures_come_back_as_png_and_are_closed(tmp_path: Path) -> None:
    # A venv whose matplotlib is a stand-in speaking pyplot's API: the capture
    # path runs without the real (large) package being installed.
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    [site] = venv.glob("lib/python3*/site-packages")
    (site / "matplotlib").mkdir()
    (site / "matplotlib" / "__init__.py").write_text("")
    (site / "matplotlib" / "pyplot.py").write_text(_FAKE_PYPLOT)
    code = PosixCodeInterpreter(
        str(tmp_path), state_dir=str(tmp_path), python=str(venv / "bin" / "python")
    )
    try:
        ctx = await code.create_context("python")
        cell = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\n'drawn'"
        result = await code.run_in_context(ctx, cell, timeout_s=30)
        assert [o.kind for o in result.outputs] == ["result", "display"]
        figure = result.outputs[1].data
        assert figure["image/png"] == base64.b64encode(b"\x89PNG figure 1").decode()
        assert figure["text/plain"] == "<Figure 1>"
        again = await code.run_in_context(ctx, "plt.get_fignums()", timeout_s=30)
        assert again.result_json == "[]"
        assert [o.kind for o in again.outputs] == ["result"]
    finally:
        await code.aclose()


async def test_output_streams_to_the_caller_as_it_arrives(code: PosixCodeInterpreter) -> None:
    ctx = await code.create_context("python")
    seen: list[tuple[str, str, float]] = []
    cell = (
        "import sys, time\nprint('first', flush=True)\ntime.sleep(0.5)\n"
        "print('late', file=sys.stderr)"
    )
    started = anyio.current_time()
    result = await code.run_in_context(
        ctx,
        cell,
        timeout_s=10,
        on_output=lambda name, text: seen.append((name, text, anyio.current_time() - started)),
    )
    assert "".join(t for n, t, _ in seen if n == "stdout") == "first\n"
    assert "".join(t for n, t, _ in seen if n == "stderr") == "late\n"
    first_out = min(at for n, _, at in seen if n == "stdout")
    first_err = min(at for n, _, at in seen if n == "stderr")
    assert first_out < first_err  # stdout arrived before the cell went on to stderr
    assert result.stdout == "first\n"
    assert result.stderr == "late\n"


async def test_delete_or_close_while_a_cell_runs_reports_it_lost(tmp_path: Path) -> None:
    code = PosixCodeInterpreter(str(tmp_path), state_dir=str(tmp_path))
    ctx = await code.create_context("python")
    other = await code.create_context("python")
    pid = json.loads(
        (await code.run_in_context(ctx, "import os\nos.getpid()", timeout_s=10)).result_json or ""
    )
    results: dict[str, object] = {}

    async def run(name: str, context: str) -> None:
        results[name] = await code.run_in_context(
            context, "import time\ntime.sleep(60)", timeout_s=90
        )

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "deleted", ctx)
            tg.start_soon(run, "closed", other)
            await anyio.sleep(0.5)
            await code.delete_context(ctx)
            await anyio.sleep(0.2)
            await code.aclose()
    assert getattr(results["deleted"], "state", None) == "lost"
    assert getattr(results["closed"], "state", None) == "lost"
    with anyio.fail_after(15):
        while alive(pid):
            await anyio.sleep(0.05)


async def test_bash_is_a_persistent_session(code: PosixCodeInterpreter) -> None:
    ctx = await code.create_context("bash")
    first = await code.run_in_context(ctx, "mkdir -p sub && cd sub\ngreeting=hello", timeout_s=10)
    assert first.exit_code == 0
    assert first.state == "kept"
    again = await code.run_in_context(ctx, 'echo "$greeting from $(basename "$PWD")"', timeout_s=10)
    assert again.stdout == "hello from sub\n"
    failed = await code.run_in_context(ctx, "echo oops >&2\nfalse", timeout_s=10)
    assert failed.exit_code == 1
    assert failed.stderr == "oops\n"
    assert failed.error is not None
    syntax = await code.run_in_context(ctx, "if then fi (", timeout_s=10)
    assert syntax.exit_code != 0
    assert "syntax error" in syntax.stderr
    # A timeout interrupts the running command and skips the rest of the cell.
    slow = await code.run_in_context(ctx, "sleep 30\necho not reached", timeout_s=0.5)
    assert slow.timed_out
    assert slow.state == "kept"
    assert "not reached" not in slow.stdout
    loop = await code.run_in_context(ctx, "while :; do :; done", timeout_s=0.5)
    assert loop.timed_out
    assert loop.state == "kept"
    assert (await code.run_in_context(ctx, "echo $greeting", timeout_s=10)).stdout == "hello\n"
    gone = await code.run_in_context(ctx, "exit 3", timeout_s=10)
    assert gone.state == "lost"
    with pytest.raises(OperationError) as caught:
        await code.run_in_context(ctx, "true", timeout_s=10)
    assert caught.value.code == "lost"
    assert "status 3" in caught.value.message


async def test_javascript_is_a_persistent_node_session(code: PosixCodeInterpreter) -> None:
    if "javascript" not in code.languages:
        pytest.skip("node is not installed")
    ctx = await code.create_context("javascript")
    first = await code.run_in_context(ctx, "let a = 20; console.log('hi'); a + 22", timeout_s=10)
    assert first.result_json == "42"
    assert first.stdout == "hi\n"
    assert first.outputs[0].data["text/plain"] == "42"
    assert (await code.run_in_context(ctx, "({x: [a]})", timeout_s=10)).result_json == '{"x":[20]}'
    awaited = await code.run_in_context(
        ctx, "new Promise(r => setTimeout(() => r(a + 1), 50))", timeout_s=10
    )
    assert awaited.result_json == "21"
    failed = await code.run_in_context(ctx, "throw new TypeError('bad')", timeout_s=10)
    assert failed.exit_code == 1
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("TypeError", "bad")
    for stuck in ("while (true) {}", "new Promise(() => {})"):
        result = await code.run_in_context(ctx, stuck, timeout_s=0.5)
        assert result.timed_out
        assert result.state == "kept"
    assert (await code.run_in_context(ctx, "a", timeout_s=10)).result_json == "20"
    gone = await code.run_in_context(ctx, "process.exit(4)", timeout_s=10)
    assert gone.state == "lost"
