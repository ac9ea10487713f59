"""Tool arguments as attrs classes: the one source of their JSON Schema and validation.

A tool's arguments are a frozen attrs class. Each field's type says what JSON
it accepts and ``Annotated[..., Arg(...)]`` adds what the type cannot (a
description for the model, bounds, path normalisation)::

    @attrs.frozen(kw_only=True)
    class ReadArgs:
        path: Annotated[str, Arg("Workspace path", min_length=1, path=True)]
        limit: Annotated[int, Arg("Max lines", minimum=1)] = 2000

From that class :func:`args_schema` derives both the JSON Schema the model
reads and a validator compiled once per class, so the two can never disagree.
Supported types: ``str``, ``int``, ``float``, ``bool``, ``Literal[...]`` of
strings or of integers, ``list[X]``/``tuple[X, ...]``/``Sequence[X]``,
``dict[str, X]``/``Mapping[str, X]``, and ``X | None`` for an optional field
whose default is None (JSON ``null`` is still refused: the schema does not
allow it). Anything else is refused when the class is first used, naming the
field, so a capability author learns at import time, not from a model.

Validation is strict and happens before any I/O: a string is not a list, a
bool is not an int, unknown and missing keys are errors. Each error names the
argument and the rule and never echoes the value.

``args_schema(cls, strict=True)`` compiles the *strict-mode* form that OpenAI's
structured outputs (and the OpenAI Agents SDK's default) require: every
property listed in ``required`` (an optional one becomes nullable and
``null`` means its default), no ``default`` keyword (the default is said in
the description instead), no string length keywords, and no open maps: a
``dict[str, X]`` argument becomes a list of ``{"name", "value"}`` objects. Its
validator accepts that form and the ordinary one, so a strict-mode model and
any other caller can share one tool.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Final, Generic, Literal, TypeVar, Union, get_args, get_origin

import attrs
from attrs import AttrsInstance

from ._echo import echo_if_short
from ._errors import OperationError
from ._paths import normalize_path

__all__ = ["Arg", "ArgsSchema", "JsonSchema", "WorkspacePath", "args_schema"]

ArgsT = TypeVar("ArgsT", bound=AttrsInstance)

JsonSchema = dict[str, object]
"""A JSON Schema document as plain, JSON-encodable dicts and lists."""

Check = Callable[[object], object]
"""Validates one value and returns it in its final form (raises :class:`_Invalid`)."""

_OMIT: Final = object()
"""What a strict-mode check returns for ``null``: the argument takes its default."""


def _choices(value: Sequence[str | int] | None) -> tuple[str | int, ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen
class Arg:
    """What a tool argument's type cannot say, attached with ``Annotated[T, Arg(...)]``.

    Several ``Arg`` on one type merge, later ones winning field by field, so a
    shared alias (``WorkspacePath = Annotated[str, Arg(..., path=True)]``) can
    be narrowed where it is used.

    Attributes:
        description: What the model reads about this argument (schema ``description``).
        min_length: Shortest string (``minLength``).
        max_length: Longest string (``maxLength``).
        minimum: Smallest number (``minimum``).
        maximum: Largest number (``maximum``).
        max_items: Longest array (``maxItems``).
        choices: The only values accepted (``enum``), for ``str`` and ``int``;
            a tool narrows an argument to what its policy allows with this.
        path: The string is a workspace path: validated and normalised
            (``a/../b`` -> ``/b``; ``..`` above the root is an error) before
            the handler runs, so handlers only ever see canonical paths.
    """

    description: str = ""
    min_length: int | None = attrs.field(default=None, kw_only=True)
    max_length: int | None = attrs.field(default=None, kw_only=True)
    minimum: int | float | None = attrs.field(default=None, kw_only=True)
    maximum: int | float | None = attrs.field(default=None, kw_only=True)
    max_items: int | None = attrs.field(default=None, kw_only=True)
    choices: tuple[str | int, ...] | None = attrs.field(
        default=None, kw_only=True, converter=_choices
    )
    path: bool = attrs.field(default=False, kw_only=True)

    def merged(self, other: Arg) -> Arg:
        """This ``Arg`` with every field ``other`` sets taken from ``other``."""
        changes = {
            f.name: getattr(other, f.name)
            for f in attrs.fields(Arg)
            if getattr(other, f.name) != f.default
        }
        return attrs.evolve(self, **changes) if changes else self


class _Invalid(Exception):
    """A value broke a rule; the caller adds where (``limit``, ``env.HOME``)."""

    def __init__(self, rule: str, where: str = "") -> None:
        super().__init__(rule)
        self.rule = rule
        self.where = where


def _invalid_argument(where: str, rule: str) -> OperationError:
    return OperationError(f"argument {where!r}: {rule}", code="invalid_argument")


@attrs.frozen(eq=False)
class ArgsSchema(Generic[ArgsT]):
    """The compiled form of an arguments class: its JSON Schema and its validator.

    Build it with :func:`args_schema` (cached per class and refinement).

    Attributes:
        cls: The arguments class.
        json_schema: The object schema the model sees. Shared: copy before mutating.
    """

    cls: type[ArgsT]
    json_schema: JsonSchema
    _checks: Mapping[str, Check] = attrs.field(alias="checks")
    _required: tuple[str, ...] = attrs.field(alias="required")
    _names: tuple[tuple[str, str], ...] = attrs.field(alias="names")

    def parse(self, arguments: object) -> ArgsT:
        """Validate the model's arguments and build the arguments object.

        ``None`` counts as no arguments.

        Raises:
            OperationError: ``code="invalid_argument"`` (or ``invalid_path``)
                naming the argument and the rule, never the value.
        """
        if arguments is None:
            arguments = {}
        # ``type is dict`` first: decoded JSON always is one, and the ABC check costs more.
        if type(arguments) is not dict and not isinstance(arguments, Mapping):
            raise OperationError("arguments must be a JSON object", code="invalid_argument")
        checks = self._checks
        values: dict[str, object] = {}
        for key, item in arguments.items():
            check = checks.get(key) if isinstance(key, str) else None
            if check is None:
                raise self._unknown(key)
            try:
                value = check(item)
            except _Invalid as exc:
                raise _invalid_argument(key + exc.where, exc.rule) from None
            if value is not _OMIT:
                values[key] = value
        for name in self._required:
            if name not in values:
                raise OperationError(f"missing required argument {name!r}", code="invalid_argument")
        try:
            return self.cls(**values)
        except (TypeError, ValueError):
            # An attrs validator of the class refused the combination; its
            # message may quote the value, so it stays in the operator's logs.
            raise OperationError(
                "the arguments are not valid together", code="invalid_argument"
            ) from None

    def as_mapping(self, parsed: ArgsT) -> dict[str, object]:
        """The parsed arguments keyed by their JSON names (for result filters)."""
        return {key: getattr(parsed, attr) for key, attr in self._names}

    def _unknown(self, key: object) -> OperationError:
        if not isinstance(key, str):
            return OperationError("argument keys must be strings", code="invalid_argument")
        known = ", ".join(sorted(self._checks)) or "none"
        return OperationError(
            f"unknown argument {echo_if_short(key)!r} (expected: {known})", code="invalid_argument"
        )


def args_schema(
    cls: type[ArgsT], refine: Mapping[str, Arg] | None = None, *, strict: bool = False
) -> ArgsSchema[ArgsT]:
    """Compile (once) the schema and validator of an arguments class.

    Args:
        cls: A frozen attrs class whose fields are the tool's arguments.
        refine: Per-argument constraints merged over the class's own, for
            what a policy decides (``{"language": Arg(choices=("python",))}``).
        strict: Compile the strict-mode form (see the module docstring): the
            schema OpenAI strict mode accepts, and a validator that takes
            both that form and the ordinary one.

    Raises:
        TypeError: The class is not an attrs class, a field type is not
            supported, a constraint does not fit its type, or ``refine``
            names an argument the class does not have.
    """
    items = tuple(sorted((refine or {}).items()))
    return _compile_class(cls, items, strict)


@functools.lru_cache(maxsize=512)
def _compile_class(
    cls: type[ArgsT], refine: tuple[tuple[str, Arg], ...], strict: bool
) -> ArgsSchema[ArgsT]:
    if not attrs.has(cls):
        raise TypeError(f"tool arguments must be an attrs class, not {cls.__qualname__}")
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        raise TypeError(
            f"cannot resolve the annotations of {cls.__qualname__} ({type(exc).__name__}); "
            "define argument classes at module level"
        ) from None
    fields = attrs.fields(cls)
    by_key = {f.alias: f for f in fields}
    extra = dict(refine)
    for key in extra:
        if key not in by_key:
            raise TypeError(f"{cls.__qualname__} has no argument {key!r} to refine")
    properties: JsonSchema = {}
    checks: dict[str, Check] = {}
    required: list[str] = []
    for f in fields:
        if not f.init:
            continue
        key = f.alias
        where = f"{cls.__qualname__}.{key}"
        tp, arg = _unwrap(hints[f.name], Arg())
        has_default = f.default is not attrs.NOTHING
        if _is_optional(tp):
            if not has_default or f.default is not None:
                raise TypeError(f"{where}: an optional argument needs the default None")
            tp = _without_none(tp, where)
            tp, arg = _unwrap(tp, arg)
        if key in extra:
            arg = arg.merged(extra[key])
        schema, check = _compile(tp, arg, where, strict)
        description = arg.description
        shown_default = has_default and isinstance(f.default, str | int | float)
        if strict and has_default:
            # Strict mode lists every property as required and has no
            # ``default`` keyword: an optional argument is nullable, null
            # means the default, and the description names it.
            if shown_default:
                said = f"Default: {f.default!r}."
                description = f"{description.rstrip('.')}. {said}" if description else said
            schema = {"anyOf": [schema, {"type": "null"}]}
            check = _nullable(check)
        if description:
            schema["description"] = description
        if shown_default and not strict:
            schema["default"] = f.default
        if not has_default:
            required.append(key)
        properties[key] = schema
        checks[key] = check
    document: JsonSchema = {
        "type": "object",
        "properties": properties,
        "required": list(properties) if strict else required,
        "additionalProperties": False,
    }
    names = tuple((f.alias, f.name) for f in fields if f.init)
    return ArgsSchema(cls, document, checks=checks, required=tuple(required), names=names)


def _nullable(check: Check) -> Check:
    def nullable(value: object) -> object:
        return _OMIT if value is None else check(value)

    return nullable


def _unwrap(tp: object, arg: Arg) -> tuple[object, Arg]:
    if get_origin(tp) is Annotated:
        base, *extras = get_args(tp)
        for extra in extras:
            if isinstance(extra, Arg):
                arg = arg.merged(extra)
        return base, arg
    return tp, arg


def _is_optional(tp: object) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def _without_none(tp: object, where: str) -> object:
    rest = [a for a in get_args(tp) if a is not type(None)]
    if len(rest) != 1:
        raise TypeError(f"{where}: unions other than 'X | None' are not supported")
    return rest[0]


_ARTICLE: Final = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
}


def _compile(tp: object, arg: Arg, where: str, strict: bool) -> tuple[JsonSchema, Check]:
    origin = get_origin(tp)
    if tp is str:
        return _string(arg, where, strict)
    if tp is bool:
        _only(arg, where, "boolean")
        return {"type": "boolean"}, _boolean
    if tp is int or tp is float:
        return _number(tp is int, arg, where)
    if origin is Literal:
        return _literal(get_args(tp), arg, where)
    if origin in (list, tuple, Sequence):
        return _array(tp, origin, arg, where, strict)
    if origin in (dict, Mapping):
        return _object(tp, arg, where, strict)
    raise TypeError(f"{where}: argument type {tp!r} is not supported")


def _only(arg: Arg, where: str, kind: str, *allowed: str) -> None:
    for f in attrs.fields(Arg):
        if f.name in ("description", *allowed):
            continue
        if getattr(arg, f.name) != f.default:
            raise TypeError(f"{where}: {f.name} does not apply to {_ARTICLE[kind]} argument")


def _boolean(value: object) -> object:
    if not isinstance(value, bool):
        raise _Invalid("expected a boolean")
    return value


def _string(arg: Arg, where: str, strict: bool) -> tuple[JsonSchema, Check]:
    _only(arg, where, "string", "min_length", "max_length", "choices", "path")
    schema: JsonSchema = {"type": "string"}
    lo, hi, path = arg.min_length, arg.max_length, arg.path
    allowed = frozenset(arg.choices) if arg.choices is not None else None
    listed = ""
    if arg.choices is not None:
        if not all(isinstance(c, str) for c in arg.choices):
            raise TypeError(f"{where}: choices of a string argument must be strings")
        schema["enum"] = list(arg.choices)
        listed = ", ".join(repr(c) for c in arg.choices)
    # Strict mode refuses length keywords; the validator still enforces them.
    if lo is not None and not strict:
        schema["minLength"] = lo
    if hi is not None and not strict:
        schema["maxLength"] = hi

    def check(value: object) -> object:
        if not isinstance(value, str):
            raise _Invalid("expected a string")
        if allowed is not None and value not in allowed:
            raise _Invalid(f"must be one of {listed}")
        if hi is not None and len(value) > hi:
            raise _Invalid(f"longer than {hi} characters")
        if lo is not None and len(value) < lo:
            raise _Invalid(f"shorter than {lo} characters")
        return normalize_path(value) if path else value

    return schema, check


def _number(integer: bool, arg: Arg, where: str) -> tuple[JsonSchema, Check]:
    kind = "integer" if integer else "number"
    _only(arg, where, kind, "minimum", "maximum", *(("choices",) if integer else ()))
    schema: JsonSchema = {"type": kind}
    lo, hi = arg.minimum, arg.maximum
    allowed = frozenset(arg.choices) if arg.choices is not None else None
    listed = ""
    if arg.choices is not None:
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in arg.choices):
            raise TypeError(f"{where}: choices of an integer argument must be integers")
        schema["enum"] = list(arg.choices)
        listed = ", ".join(repr(c) for c in arg.choices)
    if lo is not None:
        schema["minimum"] = lo
    if hi is not None:
        schema["maximum"] = hi
    article = _ARTICLE[kind]

    def check(value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Invalid(f"expected {article}")
        if integer:
            if not isinstance(value, int):
                raise _Invalid(f"expected {article}")
            if allowed is not None and value not in allowed:
                raise _Invalid(f"must be one of {listed}")
        else:
            try:
                value = float(value)
            except OverflowError:
                raise _Invalid("must be a finite number") from None
            if not math.isfinite(value):
                raise _Invalid("must be a finite number")
        if lo is not None and value < lo:
            raise _Invalid(f"must be at least {lo}")
        if hi is not None and value > hi:
            raise _Invalid(f"must be at most {hi}")
        return value

    return schema, check


def _literal(values: tuple[object, ...], arg: Arg, where: str) -> tuple[JsonSchema, Check]:
    if values and all(isinstance(v, str) for v in values):
        kind = "string"
    elif values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        kind = "integer"
    else:
        raise TypeError(f"{where}: Literal arguments must be all strings or all integers")
    _only(arg, where, kind, "choices")
    if arg.choices is not None:
        if not set(arg.choices) <= set(values):
            raise TypeError(f"{where}: choices must be values of the Literal")
        values = tuple(arg.choices)
    allowed = frozenset(values)
    listed = ", ".join(repr(v) for v in values)
    accepted: type = str if kind == "string" else int
    article = _ARTICLE[kind]

    def check(value: object) -> object:
        if not isinstance(value, accepted) or isinstance(value, bool):
            raise _Invalid(f"expected {article}")
        if value not in allowed:
            raise _Invalid(f"must be one of {listed}")
        return value

    return {"type": kind, "enum": list(values)}, check


def _array(
    tp: object, origin: object, arg: Arg, where: str, strict: bool
) -> tuple[JsonSchema, Check]:
    params = get_args(tp)
    if origin is tuple and (len(params) != 2 or params[1] is not Ellipsis):
        raise TypeError(f"{where}: only tuple[X, ...] is supported")
    if not params:
        raise TypeError(f"{where}: say what the array holds (list[str])")
    _only(arg, where, "array", "max_items")
    item_tp, item_arg = _unwrap(params[0], Arg())
    item_schema, item_check = _compile(item_tp, item_arg, f"{where}[]", strict)
    schema: JsonSchema = {"type": "array", "items": item_schema}
    most = arg.max_items
    if most is not None:
        schema["maxItems"] = most
    as_list = origin is list

    def check(value: object) -> object:
        if not isinstance(value, list | tuple):
            raise _Invalid("expected an array")
        if most is not None and len(value) > most:
            raise _Invalid(f"more than {most} items")
        out = []
        for i, item in enumerate(value):
            try:
                out.append(item_check(item))
            except _Invalid as exc:
                raise _Invalid(exc.rule, f"[{i}]{exc.where}") from None
        return out if as_list else tuple(out)

    return schema, check


def _object(tp: object, arg: Arg, where: str, strict: bool) -> tuple[JsonSchema, Check]:
    params = get_args(tp)
    if len(params) != 2 or params[0] is not str:
        raise TypeError(f"{where}: only dict[str, X] is supported")
    _only(arg, where, "object")
    value_tp, value_arg = _unwrap(params[1], Arg())
    value_schema, value_check = _compile(value_tp, value_arg, f"{where}{{}}", strict)

    def check(value: object) -> object:
        if strict and isinstance(value, list | tuple):
            value = _pairs(value)
        if not isinstance(value, Mapping):
            raise _Invalid(
                "expected an array of {name, value} objects" if strict else "expected an object"
            )
        out: dict[str, object] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Invalid("keys must be strings")
            try:
                out[key] = value_check(item)
            except _Invalid as exc:
                raise _Invalid(exc.rule, f".{echo_if_short(key)}{exc.where}") from None
        return out

    if strict:
        # Strict mode has no open maps: the same map as a list of entries.
        entry: JsonSchema = {
            "type": "object",
            "properties": {"name": {"type": "string"}, "value": value_schema},
            "required": ["name", "value"],
            "additionalProperties": False,
        }
        return {"type": "array", "items": entry}, check
    return {"type": "object", "additionalProperties": value_schema}, check


def _pairs(entries: Sequence[object]) -> dict[object, object]:
    """A strict-mode map (``[{"name": k, "value": v}, ...]``) as a mapping."""
    out: dict[object, object] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or set(entry) != {"name", "value"}:
            raise _Invalid("expected an object with exactly 'name' and 'value'", f"[{i}]")
        name = entry["name"]
        if not isinstance(name, str):
            raise _Invalid("'name' must be a string", f"[{i}]")
        if name in out:
            raise _Invalid("a name appears twice", f"[{i}]")
        out[name] = entry["value"]
    return out


WorkspacePath = Annotated[
    str,
    Arg("Workspace path, e.g. /notes/a.txt", min_length=1, max_length=4096, path=True),
]
"""A required workspace path argument, normalised before the handler sees it."""
