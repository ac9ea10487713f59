"""The JavaScript that wraps a script, and the host side of its output protocol.

The wrapper runs as an ES module (so the engine awaits it and runs the
promise jobs it queues). It takes the engine's only native printer for
itself, removes it and the command-line globals from the global object, and
installs a ``console`` whose every method writes one JSON frame per call.
The script is then evaluated by indirect ``eval`` in the global scope: it
cannot see the wrapper's bindings, so every byte the guest writes to
standard output is a frame the wrapper made, and a script cannot forge a
result or an error.

Frames (one JSON array per line): ``["o", text]`` / ``["e", text]`` console
output, ``["O"]`` / ``["E"]`` that stream went past the cap, ``["r", json]``
the result's JSON text (null when the value has none), ``["x", {name,
message, stack}]`` an uncaught error.
"""

from __future__ import annotations

import json
from typing import Final

import attrs

from corral.provider import ExecError

__all__ = ["Frames", "parse_frames", "wrap"]

_WRAPPER: Final = r"""
const write = globalThis.print;
const stringify = JSON.stringify;
const StringOf = String;
const CAP = __CAP__;
const sent = { o: 0, e: 0 };
const emit = (frame) => write(stringify(frame));
for (const name of ["print", "scriptArgs", "execArgv", "argv0"]) delete globalThis[name];
const show = (value) => {
  if (typeof value === "string") return value;
  if (value instanceof Error) return `${value.name}: ${value.message}`;
  if (value === undefined || typeof value === "function" || typeof value === "symbol"
      || typeof value === "bigint") return StringOf(value);
  try { const s = stringify(value); return s === undefined ? StringOf(value) : s; }
  catch { return StringOf(value); }
};
const out = (stream) => (...args) => {
  if (sent[stream] > CAP) return;
  const text = args.map(show).join(" ") + "\n";
  const room = CAP + 1 - sent[stream];
  sent[stream] += text.length;
  if (text.length > room) { emit([stream, text.slice(0, room)]); emit([stream.toUpperCase()]); }
  else emit([stream, text]);
};
const log = out("o");
const err = out("e");
globalThis.console = Object.freeze({
  log, info: log, debug: log, trace: log, dir: log, error: err, warn: err,
});
const ours = /\(<cmdline>|^\s*at eval \(native\)/;
const fail = (e) => {
  let name = "Error", message = "", stack = "";
  try {
    if (e !== null && typeof e === "object" && typeof e.name === "string") name = e.name;
    message = (e !== null && typeof e === "object" && typeof e.message === "string")
      ? e.message : StringOf(e);
    if (e !== null && typeof e === "object" && typeof e.stack === "string") {
      stack = e.stack.split("\n").filter((line) => !ours.test(line)).join("\n");
    }
  } catch { message = "(the thrown value could not be described)"; }
  emit(["x", { name: StringOf(name), message: StringOf(message), stack: StringOf(stack) }]);
};
try {
  const value = await (0, eval)(__SOURCE__);
  const text = stringify(value);
  if (text !== undefined && text.length > CAP) {
    const why = `the result's JSON has ${text.length} characters; at most ${CAP} are returned`;
    throw new RangeError(why);
  }
  emit(["r", text === undefined ? null : text]);
} catch (e) {
  fail(e);
}
"""


def wrap(source: str, cap: int) -> str:
    """The module that runs ``source`` under the output protocol.

    The source is embedded as an ASCII JSON string literal, so no byte of
    it (NUL, lone surrogates, line separators) can end the literal.
    """
    literal = json.dumps(source, ensure_ascii=True)
    return _WRAPPER.replace("__CAP__", str(cap)).replace("__SOURCE__", literal)


@attrs.frozen
class Frames:
    """What the wrapper reported, decoded."""

    stdout: str
    stderr: str
    stdout_overflow: bool
    stderr_overflow: bool
    result_json: str | None
    error: ExecError | None
    finished: bool
    """A result or error frame arrived (the script ran to its end)."""


def _clean(text: str) -> str:
    """Lone surrogates (legal in JavaScript strings) become U+FFFD."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def parse_frames(raw: bytes) -> Frames:
    """Decode the guest's standard output; anything malformed is ignored.

    Only the wrapper writes there, so a malformed line means the guest was
    stopped mid-write (a timeout or a trap); the frames before it stand.
    """
    out: list[str] = []
    err: list[str] = []
    flags = {"O": False, "E": False}
    result: str | None = None
    error: ExecError | None = None
    finished = False
    for line in raw.split(b"\n"):
        try:
            frame = json.loads(line)
        except ValueError:
            continue
        if not isinstance(frame, list) or not frame or not isinstance(frame[0], str):
            continue
        kind = frame[0]
        if kind in ("o", "e") and len(frame) == 2 and isinstance(frame[1], str):
            (out if kind == "o" else err).append(frame[1])
        elif kind in flags:
            flags[kind] = True
        elif kind == "r" and len(frame) == 2 and (frame[1] is None or isinstance(frame[1], str)):
            result, finished = frame[1], True
        elif kind == "x" and len(frame) == 2 and isinstance(frame[1], dict):
            info = frame[1]
            name, message, stack = (str(info.get(k, "")) for k in ("name", "message", "stack"))
            head = f"{name}: {message}" if message else name
            error = ExecError(
                name=_clean(name),
                value=_clean(message),
                traceback=_clean(f"{head}\n{stack}".rstrip("\n") + "\n"),
            )
            finished = True
    return Frames(
        stdout=_clean("".join(out)),
        stderr=_clean("".join(err)),
        stdout_overflow=flags["O"],
        stderr_overflow=flags["E"],
        result_json=None if result is None else _clean(result),
        error=error,
        finished=finished,
    )
