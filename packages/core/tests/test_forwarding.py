"""Forwarding bases forward every protocol method; the shared file cap is the tool layer's."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from corral import FsPolicy
from corral.provider import (
    DEFAULT_MAX_FILE_BYTES,
    CommandRequest,
    FileSystem,
    ForwardingFileSystem,
    ForwardingShell,
    Shell,
)


def _protocol_methods(protocol: type) -> list[str]:
    return sorted(
        name
        for name, value in vars(protocol).items()
        if not name.startswith("_") and inspect.isfunction(value)
    )


class _Recorder:
    """Answers every method with a token naming the call, and remembers the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.closed = 0

    def __getattr__(self, name: str) -> Any:
        async def method(*args: Any, **kwargs: Any) -> object:
            self.calls.append((name, args, kwargs))
            return ("result-of", name)

        return method

    def close(self) -> None:
        self.closed += 1

    async def aclose(self) -> None:
        self.closed += 1


def _arguments(method: Any) -> tuple[tuple[object, ...], dict[str, object]]:
    """One distinct sentinel per parameter, positional ones by position."""
    args: list[object] = []
    kwargs: dict[str, object] = {}
    for param in inspect.signature(method).parameters.values():
        if param.name == "self":
            continue
        token = f"<{param.name}>"
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[param.name] = token
        else:
            args.append(token)
    return tuple(args), kwargs


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("protocol", "base"), [(FileSystem, ForwardingFileSystem), (Shell, ForwardingShell)]
)
async def test_every_protocol_method_forwards_its_arguments_and_result(
    protocol: type, base: type
) -> None:
    methods = _protocol_methods(protocol)
    assert methods
    inner = _Recorder()
    wrapper = base(inner)
    assert wrapper.inner is inner
    for name in methods:
        assert name in vars(base), f"{base.__name__} does not forward {name}"
        args, kwargs = _arguments(getattr(protocol, name))
        result = await getattr(wrapper, name)(*args, **kwargs)
        assert result == ("result-of", name) or result is None
        assert inner.calls[-1] == (name, args, kwargs)


def test_the_bases_satisfy_their_protocols() -> None:
    fs: FileSystem = ForwardingFileSystem(_Recorder())  # type: ignore[arg-type]
    shell: Shell = ForwardingShell(_Recorder())  # type: ignore[arg-type]
    assert isinstance(shell, Shell)
    assert fs is not None


@pytest.mark.anyio
async def test_close_reaches_the_inner_module_when_it_has_one() -> None:
    inner = _Recorder()
    ForwardingFileSystem(inner).close()  # type: ignore[arg-type]
    await ForwardingShell(inner).aclose()  # type: ignore[arg-type]
    assert inner.closed == 2


@pytest.mark.anyio
async def test_a_subclass_overrides_only_what_changes() -> None:
    class Loud(ForwardingShell):
        async def run(self, request: CommandRequest) -> Any:
            result = await super().run(request)
            return ("loud", result)

    inner = _Recorder()
    assert await Loud(inner).run("<req>") == ("loud", ("result-of", "run"))  # type: ignore[arg-type]


def test_one_default_file_cap_matches_the_tool_layer_default() -> None:
    assert FsPolicy().max_file_bytes == DEFAULT_MAX_FILE_BYTES
