"""Tool types: what a capability contributes and what an agent loop calls.

A capability author writes, per tool, an arguments class (see ``_schema``),
an async handler and optionally a renderer, and wraps them in a
:class:`ToolSpec`. The handler is typed end to end::

    async def git_log(env: ToolEnv[GitPolicy, Git], args: GitLogArgs) -> GitLog: ...

``env.policy`` is the capability's parsed policy, ``await env.module()`` the
workspace module it declared, and ``env.session`` the narrow
:class:`SessionControl` (only for capabilities that ask for it). Nothing in
the environment can close, reset or re-open the session's registry.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, cast

import attrs
from attrs import AttrsInstance

from ._schema import Arg, JsonSchema, args_schema

if TYPE_CHECKING:
    from ._data import WorkspaceRef
    from ._mount import PathView
    from ._regex import RegexEngine

__all__ = [
    "PreparedCall",
    "SessionControl",
    "Tool",
    "ToolContent",
    "ToolEnv",
    "ToolHandler",
    "ToolHints",
    "ToolImage",
    "ToolRenderer",
    "ToolResult",
    "ToolSpec",
    "render_json",
]

PolicyT = TypeVar("PolicyT", bound=AttrsInstance)
ModuleT = TypeVar("ModuleT")
PolicyT_co = TypeVar("PolicyT_co", bound=AttrsInstance, covariant=True)
ModuleT_co = TypeVar("ModuleT_co", covariant=True)
ArgsT = TypeVar("ArgsT", bound=AttrsInstance)
ResultT = TypeVar("ResultT")

# One encoder for every result: json.dumps with non-default options builds a new
# JSONEncoder on every call, which costs more than encoding a small result.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, default=str)

_CEncoder = Callable[[object, int], Sequence[str]]


def _c_encoder() -> _CEncoder | None:
    """CPython's C encoder for ``_ENCODER``'s options, built once (None without one: PyPy).

    ``_ENCODER.encode`` builds one per call behind two Python-level calls,
    about a third of a small result's encoding time. This one has no
    circular-reference bookkeeping (its ``markers`` dict is per call), so it
    holds no state and is shared; circular data ends in RecursionError, and
    :func:`_encode` then lets ``_ENCODER`` raise its own error.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    # The arguments JSONEncoder.iterencode passes for _ENCODER (markers None).
    return cast(
        _CEncoder,
        make(None, str, json.encoder.encode_basestring, None, ": ", ", ", False, False, True),
    )


_C_ENCODER: Final = _c_encoder()


def _encode(data: object) -> str:
    """``_ENCODER.encode(data)``: the same text, and the same errors."""
    if _C_ENCODER is None:
        return _ENCODER.encode(data)
    try:
        return "".join(_C_ENCODER(data, 0))
    except RecursionError:
        # Circular (or too deep): the checking encoder raises what it raises
        # (ValueError: Circular reference detected).
        return _ENCODER.encode(data)


def render_json(data: object) -> str:
    """The default renderer: text as it is, anything else as compact JSON."""
    if isinstance(data, ToolContent):
        data = data.data
    if isinstance(data, str):
        return data
    return _encode(data)


@attrs.frozen
class ToolImage:
    """An image a tool shows the model (a plotted figure), kept out of the text.

    Exporters give it to the model as an image (MCP image content, an
    Anthropic image block, an OpenAI Responses image part) instead of pasting
    base64 into the text, which models read as noise and which costs tokens.

    Attributes:
        mime_type: ``image/png`` or ``image/jpeg``.
        data: The image, base64-encoded.
    """

    mime_type: str
    data: str


def _images(value: Iterable[ToolImage]) -> tuple[ToolImage, ...]:
    return tuple(value)


@attrs.frozen
class ToolContent:
    """A handler's result with images beside its data (return it from a handler).

    Attributes:
        data: The JSON-compatible result (what ``ToolResult.data`` becomes).
        images: Images for the model, in order.
    """

    data: object
    images: tuple[ToolImage, ...] = attrs.field(default=(), converter=_images)


@attrs.frozen
class ToolResult:
    """What a tool call returns to the model.

    Attributes:
        content: Text for the model (JSON for structured results).
        is_error: The call failed; ``content`` says why in one clear line.
        data: The structured, JSON-compatible result (None on error). Typed
            ``Any`` on purpose: it is decoded-JSON-shaped data that callers
            index freely, like the result of ``json.loads``.
        error_code: Stable classification of a failure (``not_found``...).
        images: Images the result shows besides its text (a code cell's
            plots); ``content`` mentions each, exporters attach them.
    """

    content: str
    is_error: bool = False
    data: Any = None
    error_code: str | None = None
    images: tuple[ToolImage, ...] = attrs.field(default=(), converter=_images)


@attrs.frozen(kw_only=True)
class ToolHints:
    """What a tool does to the world, for hosts that ask before acting.

    These are MCP's tool annotations (``readOnlyHint``...) and travel with
    the tool to every exporter that has a place for them. They are hints for
    a host's confirmation prompts, never a security boundary: policies are.

    Attributes:
        read_only: The tool changes nothing (in the workspace or elsewhere).
        destructive: It may overwrite or delete what was there (meaningful
            only when not read-only).
        idempotent: Calling it again with the same arguments changes nothing
            more.
        open_world: It may reach beyond the workspace (network, the host).
    """

    read_only: bool = False
    destructive: bool = True
    idempotent: bool = False
    open_world: bool = True


class SessionControl(Protocol):
    """What a tool may change about its session: which workspace it uses.

    Handed only to capabilities registered with ``controls_session=True``
    (core's ``snapshot``: restore and branch). It deliberately cannot close,
    reset or re-open the registry, nor reach another provider's workspaces.
    """

    async def adopt(self, ref: WorkspaceRef) -> str:
        """Make ``ref`` (of the session's own provider) the session's workspace.

        Returns the id of the workspace now in use.

        Raises:
            WorkspaceFailedError: The ref is foreign, does not resolve, or the
                session is closed; the session keeps its previous workspace.
        """
        ...

    def emit(
        self, name: str, *, status: str = "ok", detail: Mapping[str, str] | None = None
    ) -> None:
        """Report what happened (``snapshot``...) to the session's observers.

        It reaches them as a ``CapabilityEvent`` naming the capability.

        Raises:
            ValueError: ``name`` is not a lowercase identifier.
        """
        ...


class ToolEnv(Protocol[PolicyT_co, ModuleT_co]):
    """What a tool handler receives besides its validated arguments."""

    @property
    def policy(self) -> PolicyT_co:
        """The capability's parsed policy."""
        ...

    @property
    def regex_engine(self) -> RegexEngine:
        """The engine grep compiles patterns with."""
        ...

    @property
    def session(self) -> SessionControl:
        """Session control; raises RuntimeError unless the capability asked for it."""
        ...

    async def module(self) -> ModuleT_co:
        """The capability's workspace module (opening the workspace if needed)."""
        ...

    async def paths(self) -> PathView:
        """How the model names this workspace's paths (opening it if needed).

        Results show paths through ``PathView.show`` so that a path a tool
        returns works as-is in a command (see ``corral._mount``).
        """
        ...


ToolHandler = Callable[[ToolEnv[PolicyT, ModuleT], ArgsT], Awaitable[ResultT]]
"""``async def handler(env, args) -> result``: does the work once arguments are valid.

The result is JSON-compatible data (it becomes :attr:`ToolResult.data`) or text.
"""

ToolRenderer = Callable[[ResultT], str]
"""Turns a tool's result into the text the model reads (default: :func:`render_json`)."""


class PreparedCall(Generic[PolicyT, ModuleT]):
    """A tool call whose arguments passed validation, ready to run (and re-run).

    Built only by :meth:`ToolSpec.prepare`, once per call on the hot path: so
    it is two slots and no closures, the work being done by functions its
    spec built once.

    Attributes:
        arguments: The validated arguments object.
    """

    __slots__ = ("_spec", "arguments")

    def __init__(self, spec: ToolSpec[PolicyT, ModuleT], arguments: object) -> None:
        self._spec = spec
        self.arguments = arguments

    def run(self, env: ToolEnv[PolicyT, ModuleT]) -> Awaitable[ToolResult]:
        """Run handler and renderer in ``env``; the tool's (successful) result."""
        return self._spec._run(env, self.arguments)

    def as_mapping(self) -> dict[str, object]:
        """The arguments keyed by their JSON names (computed on demand, for result filters)."""
        return self._spec._as_mapping(self.arguments)


class ToolSpec(Generic[PolicyT, ModuleT]):
    """A tool as a capability declares it.

    The arguments class is the single source of the JSON Schema (for the
    model and MCP) and of validation; handler and renderer are checked
    against it and against each other by the type checker.

    Args:
        name: ``workspace_<op>``.
        description: What the model reads.
        args: The frozen attrs class of the arguments.
        handler: ``async (env, args) -> result``.
        op: Usage name suffix (``workspace.<op>``); default: ``name``
            without its ``workspace_`` prefix.
        render: Result -> text for the model (default :func:`render_json`).
        refine: Per-argument constraints the policy decides, merged over the
            class's own (``{"language": Arg(choices=policy.languages)}``).
        hints: What the tool does to the world (MCP annotations); None says
            nothing, so hosts assume the worst.
        output_schema: JSON Schema (an object) of the handler's result, for
            hosts that validate structured results (MCP ``outputSchema``).

    Raises:
        TypeError: The arguments class cannot be compiled (see
            :func:`corral.capability.args_schema`).
    """

    __slots__ = (
        "_as_mapping",
        "_parse",
        "_parse_strict",
        "_run",
        "args_type",
        "description",
        "hints",
        "name",
        "op",
        "output_schema",
        "parameters",
        "strict_parameters",
    )

    name: str
    description: str
    op: str
    parameters: JsonSchema
    strict_parameters: JsonSchema
    args_type: type[AttrsInstance]
    hints: ToolHints | None
    output_schema: JsonSchema | None

    def __init__(
        self,
        name: str,
        description: str,
        args: type[ArgsT],
        handler: ToolHandler[PolicyT, ModuleT, ArgsT, ResultT],
        *,
        op: str | None = None,
        render: ToolRenderer[ResultT] | None = None,
        refine: Mapping[str, Arg] | None = None,
        hints: ToolHints | None = None,
        output_schema: JsonSchema | None = None,
    ) -> None:
        compiled = args_schema(args, refine)
        strict = args_schema(args, refine, strict=True)
        renderer: Callable[[ResultT], str] = render if render is not None else render_json
        self.name = name
        self.description = description
        self.op = op if op is not None else name.removeprefix("workspace_")
        # A private copy: callers may mutate what they export, the cache is shared.
        self.parameters = copy.deepcopy(compiled.json_schema)
        self.strict_parameters = copy.deepcopy(strict.json_schema)
        self.args_type = args
        self.hints = hints
        self.output_schema = copy.deepcopy(output_schema)

        # Built once per spec, not per call: a call allocates only its PreparedCall.
        self._parse: Callable[[object], object] = compiled.parse
        self._parse_strict: Callable[[object], object] = strict.parse

        # The one trust point of the erased runner: a PreparedCall carries only
        # what this spec's own validators returned (see ``prepare``), so its
        # arguments object is an ArgsT.
        async def run(env: ToolEnv[PolicyT, ModuleT], parsed: object) -> ToolResult:
            data = await handler(env, cast(ArgsT, parsed))
            if isinstance(data, ToolContent):
                return ToolResult(renderer(data), data=data.data, images=data.images)
            return ToolResult(renderer(data), data=data)

        def as_mapping(parsed: object) -> dict[str, object]:
            return compiled.as_mapping(cast(ArgsT, parsed))

        self._run: Callable[[ToolEnv[PolicyT, ModuleT], object], Awaitable[ToolResult]] = run
        self._as_mapping: Callable[[object], dict[str, object]] = as_mapping

    def prepare(self, arguments: object, *, strict: bool = False) -> PreparedCall[PolicyT, ModuleT]:
        """Validate the model's arguments (no I/O) and return the runnable call.

        Args:
            arguments: The model's arguments (decoded JSON).
            strict: Also accept the strict-mode form (``null`` for an optional
                argument, maps as name/value lists), as a model given
                :attr:`strict_parameters` sends it.

        Raises:
            OperationError: ``invalid_argument``/``invalid_path``, naming the
                argument and never echoing its value.
        """
        return PreparedCall(self, (self._parse_strict if strict else self._parse)(arguments))

    def __repr__(self) -> str:
        return f"ToolSpec({self.name!r}, args={self.args_type.__qualname__})"


@attrs.frozen
class Tool:
    """A tool bound to a session's workspace, ready for an agent loop.

    Call it with the model's arguments; it never raises for a failed
    operation or bad arguments: it returns an error :class:`ToolResult`.

    Attributes:
        parameters: JSON Schema of the arguments.
        strict_parameters: The same arguments in strict-mode form (OpenAI
            strict mode); call with ``strict=True`` when the model saw these.
        hints: What the tool does to the world (MCP annotations), if declared.
        output_schema: JSON Schema of the structured result, if declared.
    """

    name: str
    description: str
    parameters: Mapping[str, object]
    capability: str
    _invoke: Callable[[object, bool], Awaitable[ToolResult]] = attrs.field(
        alias="invoke", repr=False
    )
    strict_parameters: Mapping[str, object] = attrs.field(factory=dict, kw_only=True)
    hints: ToolHints | None = attrs.field(default=None, kw_only=True)
    output_schema: Mapping[str, object] | None = attrs.field(default=None, kw_only=True)

    async def __call__(self, arguments: object, *, strict: bool = False) -> ToolResult:
        """Validate ``arguments`` and run the tool.

        Args:
            arguments: The model's arguments (decoded JSON).
            strict: Also accept the strict-mode form of the arguments (see
                :attr:`strict_parameters`); the ordinary form stays accepted.
        """
        return await self._invoke(arguments, strict)
