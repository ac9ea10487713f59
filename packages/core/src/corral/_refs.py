"""Ref (de)serialisation, untrusted-payload validation and the N±1 version rule.

Refs come back from storage the process does not control, so everything
here treats them as hostile: types are checked strictly (no coercion of
``"1"`` into ``1``), unknown keys are refused, sizes are bounded, and every
error is a bare :class:`WorkspaceFailedError` that never repeats the input.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn

from ._data import WorkspaceRef
from ._errors import WorkspaceFailedError

__all__ = [
    "MAX_REF_BYTES",
    "check_ref",
    "check_ref_schema_version",
    "converter",
    "ref_from_dict",
    "ref_from_json",
    "ref_to_dict",
    "ref_to_json",
    "structure_payload",
    "unstructure_payload",
]

log = logging.getLogger("corral.refs")

MAX_REF_BYTES: Final = 64 * 1024
MAX_ID_LENGTH: Final = 200

T = TypeVar("T")


def _strict(kind: type[Any]) -> Any:
    def hook(value: Any, _t: Any) -> Any:
        # bool is an int subclass; refuse it where an int or float is expected.
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise TypeError(f"expected {kind.__name__}")
        return value

    return hook


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    for kind in (str, int, bool):
        conv.register_structure_hook(kind, _strict(kind))

    def float_hook(value: Any, _t: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError("expected number")
        return float(value)

    conv.register_structure_hook(float, float_hook)
    conv.register_structure_hook_factory(
        attrs.has,
        lambda cl: make_dict_structure_fn(cl, conv, _cattrs_forbid_extra_keys=True),
    )
    return conv


converter: Final = _make_converter()
"""The one converter for refs and provider payloads: strict types, no extra keys."""


def _bad(provider_id: str | None, what: str = "workspace ref is malformed") -> WorkspaceFailedError:
    return WorkspaceFailedError(what, provider_id=provider_id)


def _is_json_value(value: Any, depth: int = 0) -> bool:
    if depth > 16:
        return False
    if value is None or isinstance(value, str | bool | int | float):
        return True
    if isinstance(value, list | tuple):
        return all(_is_json_value(v, depth + 1) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_json_value(v, depth + 1) for k, v in value.items())
    return False


def ref_to_dict(ref: WorkspaceRef) -> dict[str, Any]:
    """A JSON-ready dict (capabilities sorted, so output is deterministic)."""
    return {
        "provider_id": ref.provider_id,
        "payload": dict(ref.payload),
        "capabilities": sorted(ref.capabilities),
        "schema_version": ref.schema_version,
    }


def ref_to_json(ref: WorkspaceRef) -> str:
    """Serialise a ref to compact JSON."""
    return json.dumps(ref_to_dict(ref), separators=(",", ":"), sort_keys=True)


def ref_from_dict(data: Any) -> WorkspaceRef:
    """Validate an untrusted mapping into a :class:`WorkspaceRef`.

    Raises:
        WorkspaceFailedError: The data is not a well-formed ref.
    """
    if not isinstance(data, Mapping) or set(data) - {
        "provider_id",
        "payload",
        "capabilities",
        "schema_version",
    }:
        raise _bad(None)
    provider_id = data.get("provider_id")
    if not isinstance(provider_id, str) or not 0 < len(provider_id) <= MAX_ID_LENGTH:
        raise _bad(None)
    payload = data.get("payload", {})
    if not isinstance(payload, Mapping) or not _is_json_value(payload):
        raise _bad(provider_id)
    caps = data.get("capabilities", [])
    if isinstance(caps, Mapping):  # the spec's {fs: true} form
        caps = [k for k, v in caps.items() if v is True]
    if not isinstance(caps, list | tuple) or not all(
        isinstance(c, str) and 0 < len(c) <= MAX_ID_LENGTH for c in caps
    ):
        raise _bad(provider_id)
    version = data.get("schema_version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise _bad(provider_id)
    return WorkspaceRef(
        provider_id=provider_id,
        payload=dict(payload),
        capabilities=frozenset(caps),
        schema_version=version,
    )


def ref_from_json(text: str | bytes) -> WorkspaceRef:
    """Parse and validate a ref from JSON.

    Raises:
        WorkspaceFailedError: Not JSON, too large, or not a well-formed ref.
    """
    if len(text) > MAX_REF_BYTES:
        raise _bad(None, "workspace ref is too large")
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise _bad(None, "workspace ref is not valid JSON") from None
    return ref_from_dict(data)


def check_ref_schema_version(
    version: int | None,
    *,
    provider_id: str,
    current: int,
    logger: logging.Logger | None = None,
) -> None:
    """Enforce the N±1 contract: accept None, ``current - 1`` and ``current``.

    A version is an ``int`` and nothing else: ``True`` (an int subclass equal
    to 1), ``2.0`` or ``"2"`` are refused like any other unsupported version.

    Raises:
        WorkspaceFailedError: Any other version; the message names the
            supported set.
    """
    supported = (current - 1, current) if current > 1 else (current,)
    if version is not None and type(version) is not int:
        names = ", ".join(str(v) for v in supported)
        raise WorkspaceFailedError(
            f"unsupported workspace ref schema_version (not an integer); {provider_id} "
            f"supports None, {names}",
            provider_id=provider_id,
        )
    if version is None or version == current:
        return
    if version in supported:
        (logger or log).info(
            "workspace ref: migrating ref from v%d to v%d",
            version,
            current,
            extra={"provider_id": provider_id},
        )
        return
    names = ", ".join(str(v) for v in supported)
    shown = version if isinstance(version, int) and abs(version) < 10**6 else "out of range"
    raise WorkspaceFailedError(
        f"unsupported workspace ref schema_version {shown}; {provider_id} supports None, {names}",
        provider_id=provider_id,
    )


def check_ref(ref: WorkspaceRef, *, provider_id: str, current: int) -> None:
    """Refuse a foreign ref and an unsupported version before touching the payload."""
    if ref.provider_id != provider_id:
        raise WorkspaceFailedError(
            f"refusing a workspace ref made by another provider (expected {provider_id})",
            provider_id=provider_id,
        )
    check_ref_schema_version(ref.schema_version, provider_id=provider_id, current=current)


def structure_payload(payload: Any, cls: type[T], *, provider_id: str) -> T:
    """Validate an untrusted payload into an attrs class, strictly.

    Raises:
        WorkspaceFailedError: ``"workspace ref payload is malformed"``, bare.
    """
    if not isinstance(payload, Mapping):
        raise _bad(provider_id, "workspace ref payload is malformed")
    try:
        return converter.structure(dict(payload), cls)
    except Exception:  # cattrs raises ClassValidationError groups and more
        raise _bad(provider_id, "workspace ref payload is malformed") from None


def unstructure_payload(obj: Any) -> dict[str, Any]:
    """The JSON-ready dict of a payload object."""
    result = converter.unstructure(obj)
    assert isinstance(result, dict)
    return result
