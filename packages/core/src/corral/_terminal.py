"""Terminals for the model: named keys, and the screen a person would see.

A terminal's output is a byte stream full of escape sequences (cursor moves,
clears, colours); a model reading it raw sees noise where a person sees a
prompt or a full-screen program. :class:`ScreenCache` replays the stream into
a ``pyte`` terminal emulator and keeps it per terminal, so each render feeds
only the bytes that arrived since the last one. The screen is a pure function
of the bytes, so the cache is an optimisation, never a source of truth: a
cache entry that fell behind the retained window is rebuilt from the earliest
byte still available (and says so).

``pyte`` is the optional ``terminal`` extra of corral-core (pure Python, two
small packages); without it the screen tool fails with the exact
``pip install`` to run.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import anyio
import attrs

from ._errors import OperationError
from ._process import CursorExpiredError, ProcessManager

if TYPE_CHECKING:
    import pyte

__all__ = ["KEYS", "Screen", "ScreenCache", "render_screen", "require_pyte"]

_CTRL: Final = {f"Ctrl-{chr(c)}": bytes([c - 64]) for c in range(ord("A"), ord("Z") + 1)}

KEYS: Final[Mapping[str, bytes]] = {
    "Enter": b"\r",
    "Tab": b"\t",
    "Escape": b"\x1b",
    "Backspace": b"\x7f",
    "Delete": b"\x1b[3~",
    "Space": b" ",
    "Up": b"\x1b[A",
    "Down": b"\x1b[B",
    "Right": b"\x1b[C",
    "Left": b"\x1b[D",
    "Home": b"\x1b[H",
    "End": b"\x1b[F",
    "PageUp": b"\x1b[5~",
    "PageDown": b"\x1b[6~",
    **_CTRL,
}
"""Named keys the terminal tools accept, and the bytes a VT100-style terminal sends.

Enter sends carriage return, as a real keyboard does (the terminal's line
discipline turns it into a newline for line-based programs).
"""

_INSTALL: Final = "rendering a terminal screen needs pyte: pip install 'corral-core[terminal]'"
_READ_CHUNK: Final = 1 << 20
_MAX_TERMINALS: Final = 64
"""Screens cached per process manager; the least recently used is dropped beyond this."""


def require_pyte() -> None:
    """Check that screens can be rendered before starting anything that needs one.

    Raises:
        OperationError: ``unsupported``, naming the ``pip install`` to run.
    """
    _pyte()


def _pyte() -> object:
    try:
        import pyte
    except ImportError:
        raise OperationError(_INSTALL, code="unsupported") from None
    return pyte


@attrs.frozen
class Screen:
    """A rendered terminal screen.

    Attributes:
        lines: Each row's text, trailing spaces removed.
        cursor_row: The cursor's row (0-based).
        cursor_col: The cursor's column (0-based).
        cols: Width in cells.
        rows: Height in cells.
        next_cursor: Byte offset of the output the screen shows up to.
        partial: Output before the retained window was lost: the screen
            was rebuilt from the earliest byte still available and may miss
            what earlier bytes drew.
    """

    lines: tuple[str, ...]
    cursor_row: int
    cursor_col: int
    cols: int
    rows: int
    next_cursor: int
    partial: bool = False

    @property
    def text(self) -> str:
        """The rows joined by newlines, blank rows at the bottom dropped."""
        lines = list(self.lines)
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines)


class _Replay:
    """One terminal's emulator and how far into its stream it has been fed."""

    def __init__(self, cols: int, rows: int, start: int) -> None:
        module = _pyte()
        self.screen: pyte.Screen = module.Screen(cols, rows)  # type: ignore[attr-defined]
        # ByteStream decodes UTF-8 incrementally: a character split across two
        # feeds is drawn once, whole.
        self.stream: pyte.ByteStream = module.ByteStream(self.screen)  # type: ignore[attr-defined]
        self.cursor = start
        self.partial = start > 0
        self.lock = anyio.Lock()
        self._rendered: Screen | None = None

    def resize(self, cols: int, rows: int) -> None:
        if (self.screen.columns, self.screen.lines) != (cols, rows):
            self.screen.resize(lines=rows, columns=cols)

    def render(self) -> Screen:
        # pyte builds every row anew on each ``display`` (~2 ms for 80x24):
        # nothing fed and no resize since the last render means the same screen.
        last = self._rendered
        screen = self.screen
        if (
            last is not None
            and last.next_cursor == self.cursor
            and (last.cols, last.rows) == (screen.columns, screen.lines)
            and last.partial == self.partial
        ):
            return last
        self._rendered = Screen(
            lines=tuple(line.rstrip() for line in screen.display),
            cursor_row=screen.cursor.y,
            cursor_col=screen.cursor.x,
            cols=screen.columns,
            rows=screen.lines,
            next_cursor=self.cursor,
            partial=self.partial,
        )
        return self._rendered


class ScreenCache:
    """Rendered screens of a manager's terminals, fed incrementally.

    Entries are keyed by manager (weakly: a closed workspace's screens go
    with it) and terminal id, at most :data:`_MAX_TERMINALS` per manager.
    """

    def __init__(self) -> None:
        self._by_manager: weakref.WeakKeyDictionary[object, OrderedDict[str, _Replay]] = (
            weakref.WeakKeyDictionary()
        )

    def _entries(self, manager: object) -> OrderedDict[str, _Replay]:
        try:
            return self._by_manager.setdefault(manager, OrderedDict())
        except TypeError:  # not weakly referenceable: no cache, rebuild each time
            return OrderedDict()

    def forget(self, manager: object, terminal_id: str) -> None:
        """Drop one terminal's screen (after it was closed)."""
        try:
            entries = self._by_manager.get(manager)
        except TypeError:
            return
        if entries is not None:
            entries.pop(terminal_id, None)

    async def render(self, manager: ProcessManager, terminal_id: str) -> Screen:
        """The terminal's screen after every byte it has produced so far.

        Raises:
            OperationError: ``invalid_argument`` when the process has no
                terminal; ``unsupported`` without pyte; the manager's errors.
        """
        info = await manager.info(terminal_id)
        if info.terminal is None:
            raise OperationError("process is not a terminal", code="invalid_argument")
        entries = self._entries(manager)
        replay = entries.get(terminal_id)
        if replay is None or replay.cursor < info.stdout_start:
            replay = _Replay(info.terminal.cols, info.terminal.rows, info.stdout_start)
            entries[terminal_id] = replay
        entries.move_to_end(terminal_id)
        while len(entries) > _MAX_TERMINALS:
            entries.popitem(last=False)
        async with replay.lock:
            size = info.terminal
            replay.resize(size.cols, size.rows)
            # Feed up to the end seen in ``info``: reading past an ended
            # stream's end is an error, and later bytes belong to a later render.
            while replay.cursor < info.stdout_end:
                try:
                    chunk = await manager.read(
                        terminal_id,
                        "stdout",
                        cursor=replay.cursor,
                        max_bytes=min(_READ_CHUNK, info.stdout_end - replay.cursor),
                    )
                except CursorExpiredError as exc:
                    # The window moved while we fed: start over from its new start.
                    fresh = _Replay(size.cols, size.rows, exc.earliest)
                    replay.screen, replay.stream = fresh.screen, fresh.stream
                    replay.cursor, replay.partial = fresh.cursor, True
                    continue
                if not chunk.data:
                    break
                replay.stream.feed(chunk.data)
                replay.cursor = chunk.next_cursor
            return replay.render()


def render_screen(data: bytes, cols: int = 80, rows: int = 24) -> Screen:
    """Render a terminal byte stream from its first byte (tests, one-off views).

    Raises:
        OperationError: ``unsupported`` without pyte.
    """
    replay = _Replay(cols, rows, 0)
    replay.stream.feed(data)
    replay.cursor = len(data)
    return replay.render()
