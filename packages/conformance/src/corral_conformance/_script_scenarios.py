"""``script`` scenarios for providers that run each call in a fresh box, with their limits.

The conformance rules for ``script`` hold for every runner, the isolate
included. These scenarios are for the box runners (local-sandbox,
docker): they need a workspace opened with the provider's own memory or
process limit, or they check what only a real interpreter in a box can do
(write to its home and ``/tmp``, flood its streams). Each provider's suite
opens the workspace its way and runs the same scenario, then checks what
only it can see (cgroups, containers left behind).
"""

from __future__ import annotations

import json
import time

from corral.provider import CodeInterpreter, Workspace

__all__ = [
    "script_allocation_bomb_scenario",
    "script_fork_bomb_scenario",
    "script_leaves_nothing_scenario",
    "script_output_cap_scenario",
]

_MIB = 1 << 20
_DIRS = ("'.'", "'/tmp'", "os.path.expanduser('~')", "'/dev/shm'")
_JS_DIRS = "['.', '/tmp', os.homedir(), '/dev/shm']"


def _script(ws: Workspace) -> CodeInterpreter:
    assert ws.script is not None, "the workspace has no script module"
    return ws.script


async def script_leaves_nothing_scenario(ws: Workspace) -> None:
    """Files a script writes (cwd, ``/tmp``, home, ``/dev/shm``) are gone at the next call.

    ``ws`` needs ``script`` and ``fs``; the workspace must start empty (a
    script's box never sees it, so it must stay empty).
    """
    dirs = ", ".join(_DIRS)
    writes = {
        "python": f"import os\nfor d in ({dirs}):\n"
        "    open(os.path.join(d, 'left.txt'), 'w').write('x')\n'written'",
        "javascript": "const fs = require('fs'); const os = require('os');"
        f"for (const d of {_JS_DIRS}) fs.writeFileSync(d + '/left.txt', 'x'); 'written'",
    }
    reads = {
        "python": f"import os\n[os.path.exists(os.path.join(d, 'left.txt')) for d in ({dirs})]",
        "javascript": "const fs = require('fs'); const os = require('os');"
        f"{_JS_DIRS}.map(d => fs.existsSync(d + '/left.txt'))",
    }
    script = _script(ws)
    assert ws.fs is not None, "the workspace has no fs module"
    for lang in sorted(script.languages):
        first = await script.run_code(lang, writes[lang], timeout_s=30)
        assert first.result_json == '"written"', f"{lang}: {first!r}"
        second = await script.run_code(lang, reads[lang], timeout_s=30)
        assert second.result_json is not None, f"{lang}: {second!r}"
        assert json.loads(second.result_json) == [False] * 4, f"{lang}: {second.result_json}"
    assert [e.name for e in await ws.fs.ls("/")] == [], "a script wrote into the workspace"


async def script_output_cap_scenario(ws: Workspace, *, cap: int = _MIB) -> None:
    """3 MiB on each stream is cut and flagged, the result still arrives, no frame leaks.

    Args:
        ws: A workspace with ``script`` (python) and the default output cap.
        cap: The runner's output cap in bytes.
    """
    script = _script(ws)
    flood = "import sys\nsys.stdout.write('o' * (3 << 20))\nsys.stderr.write('e' * (3 << 20))\n42"
    result = await script.run_code("python", flood, timeout_s=60)
    assert result.result_json == "42", result.error
    assert result.stdout_truncated, "3 MiB of stdout was not flagged as cut"
    assert result.stderr_truncated, "3 MiB of stderr was not flagged as cut"
    assert len(result.stdout.encode()) < cap + 1024, "stdout was not cut at the cap"
    assert "\0corral-script" not in result.stderr, "the result frame leaked into stderr"
    small = await script.run_code(
        "python", "import sys\nsys.stderr.write('two\\n')\n1", timeout_s=30
    )
    assert small.stderr == "two\n", small


async def script_allocation_bomb_scenario(ws: Workspace, *, budget_s: float = 60.0) -> None:
    """An allocation bomb in every language fails on the box's memory limit, not the clock.

    ``ws`` must be opened with a small memory limit (256 MiB is plenty).
    """
    bombs = {
        # Filled, so every page is really allocated (no lazy zero pages).
        "python": "a = []\nwhile True: a.append(b'x' * (16 << 20))",
        "javascript": "const a = []; for (;;) a.push(Buffer.alloc(16 << 20, 1))",
    }
    script = _script(ws)
    for lang in sorted(script.languages):
        started = time.monotonic()
        result = await script.run_code(lang, bombs[lang], timeout_s=budget_s)
        elapsed = time.monotonic() - started
        assert result.error is not None, f"{lang}: the bomb did not fail: {result!r}"
        assert not result.timed_out, f"{lang}: the memory limit did not stop it: {result!r}"
        assert elapsed < budget_s, f"{lang}: took {elapsed:.1f} s"
    after = await script.run_code("python", "'alive'", timeout_s=30)
    assert after.result_json == '"alive"', after


async def script_fork_bomb_scenario(
    ws: Workspace, *, max_processes: int, budget_s: float = 30.0
) -> None:
    """A fork bomb stops at the process limit and the call does not wait for its sleepers.

    ``ws`` must be opened with a process limit of ``max_processes``; check
    afterwards that the box (and its sleeping children) is gone.
    """
    bomb = (
        "import os, time\nn = 0\ntry:\n    while n < 10000:\n        if os.fork() == 0:\n"
        "            time.sleep(60)\n            os._exit(0)\n        n += 1\n"
        "except OSError:\n    pass\nn"
    )
    script = _script(ws)
    started = time.monotonic()
    result = await script.run_code("python", bomb, timeout_s=budget_s)
    elapsed = time.monotonic() - started
    assert result.result_json is not None, result
    assert int(result.result_json) < max_processes, f"{result.result_json} processes forked"
    assert elapsed < budget_s, f"the call waited for the sleeping children ({elapsed:.1f} s)"
    after = await script.run_code("python", "'host fine'", timeout_s=30)
    assert after.result_json == '"host fine"', after
