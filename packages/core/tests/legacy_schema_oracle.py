"""The hand-written JSON Schema validator corral used before argument classes.

Kept verbatim as a test oracle: the generated validators must accept and refuse
exactly what it did (path normalisation aside, which moved from handlers into
validation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from corral import OperationError

__all__ = ["validate_arguments"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (Mapping,),
    "array": (list, tuple),
}

_ARTICLE = {"integer": "an integer", "object": "an object", "array": "an array"}


def _fail(where: str, rule: str) -> OperationError:
    return OperationError(f"argument {where!r}: {rule}", code="invalid_argument")


def _check(schema: Mapping[str, Any], value: Any, where: str) -> Any:
    kind = schema.get("type")
    if kind is not None:
        accepted = _TYPES[kind]
        is_bool = isinstance(value, bool)
        if not isinstance(value, accepted) or (is_bool and kind != "boolean"):
            raise _fail(where, f"expected {_ARTICLE.get(kind, 'a ' + kind)}")
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(repr(v) for v in schema["enum"])
        raise _fail(where, f"must be one of {allowed}")
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise _fail(where, f"longer than {schema['maxLength']} characters")
        if "minLength" in schema and len(value) < schema["minLength"]:
            raise _fail(where, f"shorter than {schema['minLength']} characters")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise _fail(where, "must be a finite number")
        if "minimum" in schema and value < schema["minimum"]:
            raise _fail(where, f"must be at least {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise _fail(where, f"must be at most {schema['maximum']}")
    if isinstance(value, list | tuple):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise _fail(where, f"more than {schema['maxItems']} items")
        items = schema.get("items")
        if items is not None:
            value = [_check(items, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        value = _check_object(schema, value, where)
    return value


def _check_object(
    schema: Mapping[str, Any], value: Mapping[Any, Any], where: str
) -> dict[str, Any]:
    props: Mapping[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise _fail(where or "arguments", "keys must be strings")
        child = f"{where}.{key}" if where else key
        if key in props:
            out[key] = _check(props[key], item, child)
        elif extra is False:
            shown = key if len(key) <= 64 and key.isprintable() else "?"
            known = ", ".join(sorted(props)) or "none"
            raise OperationError(
                f"unknown argument {shown!r} (expected: {known})", code="invalid_argument"
            )
        elif isinstance(extra, Mapping):
            out[key] = _check(extra, item, child)
        else:
            out[key] = item
    for key in schema.get("required", ()):
        if key not in out:
            raise OperationError(f"missing required argument {key!r}", code="invalid_argument")
    return out


def validate_arguments(schema: Mapping[str, Any], arguments: Any) -> dict[str, Any]:
    """Check tool arguments and return them as a plain dict.

    ``None`` counts as no arguments. Raises:
        OperationError: ``code="invalid_argument"`` naming the argument and rule.
    """
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise OperationError("arguments must be a JSON object", code="invalid_argument")
    return _check_object(schema, arguments, "")
