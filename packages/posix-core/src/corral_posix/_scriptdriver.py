"""The drivers a ``script`` call runs in a fresh box, and the host side of their protocol.

local-sandbox (a bubblewrap box) and docker (a container) run one script per
fresh box with a real interpreter: ``python3 -I`` or ``node``. The program is
delivered on the interpreter's stdin (``python3 -I -u -`` / ``node -``), so
no byte of the script is on a command line; the script's text is embedded
in the driver as an ASCII JSON string literal, so nothing in it can end the
literal.

The script's own ``print``/``console.log`` output goes to the process's real
stdout and stderr, untouched (a child process it starts writes there too).
When the script ends, the driver writes one *frame* to a result channel:
``MARK + {"result": json-text|null, "error": {name, value, traceback}|null}``
plus a newline, where ``MARK`` is ``\\0corral-script-NONCE:`` with a nonce
fresh per call. The channel is a private fd where the box can pass one
(local-sandbox: fd 3), else stderr (docker), where the host finds the frame
in the stream's tail. A script could read the nonce out of the driver and
forge a frame -- it can only lie about its own result, which it could do
anyway by returning the lie.

Results follow the isolate's contract:

- JavaScript: the completion value of the script (the value of its last
  expression statement, as indirect ``eval`` gives it), awaited when it is a
  promise, through ``JSON.stringify`` (None when that gives ``undefined``).
- Python: the value of the last statement when it is an expression (as a
  notebook cell shows it), awaited with ``asyncio.run`` when it is a
  coroutine, through ``json.dumps(allow_nan=False)``; ``None`` gives no
  result; a value with no JSON form is a ``TypeError``/``ValueError``.
  ``sys.exit(0)`` ends the script without a result, any other status is
  a ``SystemExit`` error.
"""

from __future__ import annotations

import json
import secrets
from typing import Final, Literal

import attrs

from corral.provider import ExecError

__all__ = [
    "LANGUAGE_PROGRAMS",
    "ScriptFrame",
    "ScriptProgram",
    "find_frame",
    "make_program",
]

Language = Literal["python", "javascript"]

LANGUAGE_PROGRAMS: Final[dict[str, str]] = {"python": "python3", "javascript": "node"}
"""The interpreter each script language needs in the box."""

_PYTHON: Final = r"""
import asyncio as _asyncio, ast as _ast, json as _json, os as _os, sys as _sys
import traceback as _traceback
_FD, _MARK, _CAP, _SRC = __FD__, __MARK__, __CAP__, __SOURCE__
_dumps, _write, _exit = _json.dumps, _os.write, _os._exit
del _sys.argv[:]


def _describe(exc):
    frames = _traceback.extract_tb(exc.__traceback__)
    # Drop the driver's own frames: the traceback starts where the script does.
    while frames and frames[0].filename != "<script>":
        frames.pop(0)
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += _traceback.format_list(frames)
    lines += _traceback.format_exception_only(type(exc), exc)
    return {"name": type(exc).__name__, "value": str(exc), "traceback": "".join(lines)}


def _run():
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    tree = _ast.parse(_SRC, "<script>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], _ast.Expr):
        last = _ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<script>", "exec"), scope)
    if last is None:
        return None
    value = eval(compile(last, "<script>", "eval"), scope)
    if _asyncio.iscoroutine(value):
        value = _asyncio.run(value)
    return None if value is None else _dumps(value, allow_nan=False)


def _main():
    frame = {"result": None, "error": None}
    try:
        text = _run()
        if text is not None and len(text.encode("utf-8", "replace")) > _CAP:
            raise ValueError(f"the result's JSON is larger than {_CAP} bytes")
        frame["result"] = text
    except SystemExit as exc:
        if exc.code not in (None, 0):
            frame["error"] = {"name": "SystemExit", "value": str(exc.code),
                              "traceback": f"SystemExit: {exc.code}\n"}
    except BaseException as exc:
        frame["error"] = _describe(exc)
    for stream in (_sys.stdout, _sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    data = (_MARK + _dumps(frame, ensure_ascii=True) + "\n").encode()
    while data:
        data = data[_write(_FD, data):]
    _exit(1 if frame["error"] else 0)


_main()
"""

_JAVASCRIPT: Final = r"""
"use strict";
const FD = __FD__, MARK = __MARK__, CAP = __CAP__, SRC = __SOURCE__;
const fs = require("fs");
const stringify = JSON.stringify, StringOf = String, writeSync = fs.writeSync;
const exit = process.exit.bind(process);
globalThis.require = require;
process.argv.length = 0;
// The script's frames read "(eval at <anonymous> ([stdin]:L:C), <anonymous>:L:C)";
// every other frame is the driver's or node's own.
const scriptFrame = /\(?eval at .*, <anonymous>:(\d+:\d+)\)?$/;
const describe = (e) => {
  let name = "Error", value = "", traceback = "";
  try {
    if (e !== null && typeof e === "object" && typeof e.name === "string") name = e.name;
    value = (e !== null && typeof e === "object" && typeof e.message === "string")
      ? e.message : StringOf(e);
    const head = value ? `${name}: ${value}` : name;
    let stack = "";
    if (e !== null && typeof e === "object" && typeof e.stack === "string") {
      stack = e.stack.split("\n").slice(1).filter((line) => scriptFrame.test(line))
        .map((line) => line.replace(scriptFrame, "(<script>:$1)")).join("\n");
    }
    traceback = `${head}\n${stack}`.replace(/\n+$/, "") + "\n";
  } catch { value = "(the thrown value could not be described)"; }
  return { name: StringOf(name), value: StringOf(value), traceback: StringOf(traceback) };
};
const finish = (frame) => {
  const data = Buffer.from(MARK + stringify(frame) + "\n");
  let at = 0;
  while (at < data.length) at += writeSync(FD, data, at);
  exit(frame.error ? 1 : 0);
};
(async () => {
  try {
    const value = await (0, eval)(SRC);
    const text = stringify(value);
    if (text !== undefined && Buffer.byteLength(text) > CAP) {
      throw new RangeError(`the result's JSON is larger than ${CAP} bytes`);
    }
    finish({ result: text === undefined ? null : text, error: null });
  } catch (e) {
    finish({ result: null, error: describe(e) });
  }
})();
"""

_TEMPLATES: Final = {"python": _PYTHON, "javascript": _JAVASCRIPT}
_ARGV: Final = {"python": ("python3", "-I", "-u", "-"), "javascript": ("node", "-")}


@attrs.frozen
class ScriptProgram:
    """How to start one script: the interpreter's argv, its stdin, and the frame marker.

    Attributes:
        argv: The interpreter command (reads its program from stdin).
        stdin: The driver program with the script embedded.
        marker: The bytes that open the result frame.
    """

    argv: tuple[str, ...]
    stdin: str
    marker: bytes


def make_program(language: str, code: str, *, channel_fd: int, result_cap: int) -> ScriptProgram:
    """The driver of ``code`` in ``language``, writing its frame to ``channel_fd``.

    Raises:
        KeyError: ``language`` is not ``python`` or ``javascript`` (callers
            check the language first).
    """
    template = _TEMPLATES[language]
    mark = f"\0corral-script-{secrets.token_hex(8)}:"
    program = (
        template.replace("__FD__", str(int(channel_fd)))
        .replace("__MARK__", json.dumps(mark, ensure_ascii=True))
        .replace("__CAP__", str(int(result_cap)))
        .replace("__SOURCE__", json.dumps(code, ensure_ascii=True))
    )
    return ScriptProgram(argv=_ARGV[language], stdin=program, marker=mark.encode())


@attrs.frozen
class ScriptFrame:
    """The driver's last word: the result's JSON text or the uncaught error."""

    result_json: str | None
    error: ExecError | None


def _text(value: object, limit: int = 1 << 20) -> str:
    return value[:limit] if isinstance(value, str) else ""


def find_frame(data: bytes, marker: bytes) -> tuple[ScriptFrame | None, bytes]:
    """Find the result frame in ``data``; return it and ``data`` without it.

    The last well-formed frame wins (output before it is the script's own).
    Anything malformed means the driver was stopped mid-write: no frame.
    """
    at = data.rfind(marker)
    if at < 0:
        return None, data
    end = data.find(b"\n", at)
    if end < 0:
        return None, data
    try:
        frame = json.loads(data[at + len(marker) : end])
    except ValueError:
        return None, data
    if not isinstance(frame, dict):
        return None, data
    result = frame.get("result")
    error = frame.get("error")
    rest = data[:at] + data[end + 1 :]
    if isinstance(error, dict):
        exc = ExecError(
            name=_text(error.get("name")) or "Error",
            value=_text(error.get("value")),
            traceback=_text(error.get("traceback")),
        )
        return ScriptFrame(None, exc), rest
    return ScriptFrame(result if isinstance(result, str) else None, None), rest
