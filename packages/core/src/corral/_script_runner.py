"""The front every ``script`` module shares: checks, the timeout ceiling, no contexts.

A ``script`` module is a :class:`~corral.provider.CodeInterpreter` with no
state: one fresh isolate, box or container per call. What differs between
providers is only how a snippet runs; what a caller may ask, and how a
wrong question is answered, is the same everywhere, so it lives here once:
a closed runner refuses, an unknown language names the available ones, a
timeout must be a positive number and is clamped to the runner's ceiling,
and the context calls are refused (a script keeps nothing between calls).
"""

from __future__ import annotations

import abc
import math

from ._data import ExecResult
from ._errors import OperationError
from ._workspace import workspace_closed

__all__ = ["StatelessScriptRunner"]


class StatelessScriptRunner(abc.ABC):
    """Base of a ``script`` module: subclasses only run one checked snippet.

    Subclasses implement :meth:`_run_script`; ``run_code`` calls it with a
    language this runner has and a timeout already clamped to
    ``max_timeout_s``.

    Args:
        languages: The languages this runner really has.
        max_timeout_s: Ceiling of a run's timeout, whatever the caller asks.
        missing: What the error says is available when ``languages`` is
            empty (why there is nothing: which interpreter is missing).
    """

    def __init__(
        self, languages: frozenset[str], *, max_timeout_s: float, missing: str = "none"
    ) -> None:
        self._languages = languages
        self._max_timeout = max_timeout_s
        self._missing = missing
        self._closed = False

    @property
    def languages(self) -> frozenset[str]:
        """The languages this runner accepts."""
        return self._languages

    @property
    def max_timeout_s(self) -> float:
        """Ceiling of a run's timeout."""
        return self._max_timeout

    @property
    def has_network(self) -> bool:
        """Whether a script reaches the network: False here (a runner that gives it says so).

        ``workspace_script`` refuses to run when its policy asks for the
        network (``ScriptPolicy(network="on")``) and the runner has none,
        rather than let the model believe its scripts are online.
        """
        return False

    def close(self) -> None:
        """Refuse every later call (the workspace closed)."""
        self._closed = True

    async def run_code(self, language: str, code: str, *, timeout_s: float) -> ExecResult:
        """Run ``code`` afresh and report its output, result or error.

        Raises:
            OperationError: ``invalid_argument`` for a language this runner
                lacks (the message lists the available ones) or a timeout
                that is not a positive number; ``closed`` after close; what
                the subclass raises.
        """
        if self._closed:
            raise workspace_closed()
        if language not in self._languages:
            shown = (
                repr(language)
                if len(language) <= 32 and language.isprintable()
                else "this language"
            )
            available = ", ".join(sorted(self._languages)) or self._missing
            raise OperationError(
                f"script language {shown} is not available (available: {available})",
                code="invalid_argument",
            )
        if isinstance(timeout_s, bool) or not 0 < timeout_s < math.inf:
            raise OperationError("timeout_s must be a positive number", code="invalid_argument")
        return await self._run_script(language, code, min(float(timeout_s), self._max_timeout))

    @abc.abstractmethod
    async def _run_script(self, language: str, code: str, timeout_s: float) -> ExecResult:
        """Run one checked snippet in a fresh isolate or box (``timeout_s`` already clamped)."""

    async def create_context(self, language: str) -> str:
        """Refused: scripts are stateless (contexts belong to the ``code`` capability).

        Raises:
            OperationError: Always, with code ``unsupported``.
        """
        raise _no_contexts()

    async def run_in_context(self, context_id: str, code: str, *, timeout_s: float) -> ExecResult:
        """Refused: there are no contexts.

        Raises:
            OperationError: Always, with code ``unsupported``.
        """
        raise _no_contexts()

    async def delete_context(self, context_id: str) -> None:
        """Refused: there are no contexts.

        Raises:
            OperationError: Always, with code ``unsupported``.
        """
        raise _no_contexts()


def _no_contexts() -> OperationError:
    return OperationError(
        "the script runner is stateless: it has no code contexts (use the code capability)",
        code="unsupported",
    )
