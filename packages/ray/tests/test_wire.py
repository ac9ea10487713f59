"""What crosses the agent boundary: corral's errors keep type and code; nothing else leaks."""

from __future__ import annotations

import pickle

import pytest

from corral.provider import (
    ConfigError,
    CursorExpiredError,
    OperationError,
    WorkspaceEvictedError,
    WorkspaceFailedError,
)
from corral_ray._wire import decode, encode_error, full, ok


def roundtrip(exc: BaseException) -> BaseException:
    reply = pickle.loads(pickle.dumps(encode_error(exc)))  # as Ray ships it
    try:
        decode(reply)
    except Exception as exc:
        return exc
    raise AssertionError("decode did not raise")


def test_values_pass_through() -> None:
    assert decode(ok(b"bytes")) == b"bytes"


@pytest.mark.parametrize("code", ["not_found", "policy_denied", "too_large", "closed", "busy"])
def test_operation_errors_keep_code_and_message(code: str) -> None:
    got = roundtrip(OperationError("/a.txt does not exist", code=code))  # type: ignore[arg-type]
    assert type(got) is OperationError
    assert got.code == code  # type: ignore[attr-defined]
    assert got.message == "/a.txt does not exist"  # type: ignore[attr-defined]


def test_cursor_expired_keeps_the_earliest_cursor() -> None:
    got = roundtrip(CursorExpiredError("output before 10 was dropped", earliest=10))
    assert isinstance(got, CursorExpiredError)
    assert got.earliest == 10


def test_workspace_errors_keep_their_type() -> None:
    assert isinstance(roundtrip(WorkspaceEvictedError("gone")), WorkspaceEvictedError)
    failed = roundtrip(WorkspaceFailedError("no room", transient=True))
    assert isinstance(failed, WorkspaceFailedError)
    assert failed.transient
    assert isinstance(roundtrip(ConfigError("bad option x")), ConfigError)


def test_a_full_node_is_a_transient_failure() -> None:
    with pytest.raises(WorkspaceFailedError) as info:
        decode(full("ray: the node is full"))
    assert info.value.transient


def test_unexpected_errors_never_carry_host_paths_or_environment() -> None:
    secret = "/home/agent/.aws/credentials AWS_SECRET_ACCESS_KEY=abc123"
    got = roundtrip(RuntimeError(secret))
    assert type(got) is OperationError
    assert got.code == "failed"  # type: ignore[attr-defined]
    assert "credentials" not in str(got)
    assert "abc123" not in str(got)
    assert got.__cause__ is None


def test_an_unknown_code_from_a_newer_agent_becomes_failed() -> None:
    with pytest.raises(OperationError) as info:
        decode(("err", "operation", "something", "brand_new_code"))
    assert info.value.code == "failed"
