"""The ``corral`` command line: providers, tools, call, sessions, close, demo.

Errors are one line on stderr and a non-zero exit status (2 for usage and
configuration, 1 for a failed call), never a traceback.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import anyio

from ._errors import ConfigError, WorkspaceError, WorkspaceFailedError
from ._plugins import KNOWN_COMMANDS, PluginSet
from ._progress_bar import ProgressBar
from ._session import (
    default_capabilities,
    default_plugins,
    default_provider_kind,
    open_workspace,
    resolve_provider,
)
from ._store import RefStore
from ._tool import ToolResult

__all__ = ["main"]


class _Fail(Exception):
    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        raise _Fail(f"{what} is not valid JSON", 2) from None
    if not isinstance(value, dict):
        raise _Fail(f"{what} must be a JSON object", 2)
    return value


def _print_result(result: ToolResult, as_json: bool) -> int:
    if as_json:
        out = {
            "is_error": result.is_error,
            "content": result.content,
            "data": result.data,
            "error_code": result.error_code,
        }
        print(json.dumps(out, ensure_ascii=False, default=str))
    elif result.is_error:
        print(f"error ({result.error_code}): {result.content}", file=sys.stderr)
    else:
        print(result.content)
    return 1 if result.is_error else 0


# -- subcommands -------------------------------------------------------------------


def _cmd_providers(args: argparse.Namespace, plugins: PluginSet) -> int:
    rows: list[dict[str, Any]] = []
    for spec in sorted(plugins.providers.values(), key=lambda s: s.kind):
        problem = spec.availability()
        rows.append(
            {
                "kind": spec.kind,
                "version": spec.version,
                "distribution": spec.distribution,
                "capabilities": sorted(spec.capabilities),
                "available": problem is None,
                "unavailable_reason": problem,
                "outlives_process": spec.outlives_process,
                "summary": spec.summary,
            }
        )
    if args.json:
        print(json.dumps({"providers": rows, "failed_plugins": dict(plugins.failed)}, indent=2))
        return 0
    if not rows:
        print("no providers installed (pip install corral-local-bash or corral-memory)")
        return 0
    table = [("KIND", "VERSION", "CAPABILITIES", "RUNS HERE", "SUMMARY")]
    for r in rows:
        here = "yes" if r["available"] else f"no: {r['unavailable_reason']}"
        table.append(
            (r["kind"], r["version"] or "-", ",".join(r["capabilities"]), here, r["summary"])
        )
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        cells = [f"{cell:<{w}}" for cell, w in zip(row[:4], widths, strict=True)]
        print("  ".join([*cells, row[4]]).rstrip())
    for name, why in sorted(plugins.failed.items()):
        print(f"plugin {name!r} failed to load: {why}", file=sys.stderr)
    return 0


def _cmd_tools(args: argparse.Namespace, plugins: PluginSet) -> int:
    kind = args.provider or default_provider_kind(plugins)
    options = _json_arg(args.provider_options, "--provider-options")

    async def build() -> Sequence[Mapping[str, object]]:
        provider = resolve_provider(kind, plugins, options)
        caps = _json_arg(args.capabilities, "--capabilities")
        caps = caps if caps is not None else default_capabilities(provider, plugins)
        # Listing tools opens nothing; the capability check still runs.
        async with open_workspace(provider, caps, plugins=plugins, open_strategy="lazy") as ws:
            if args.format == "openai":
                return ws.openai_tools()
            if args.format == "anthropic":
                return ws.anthropic_tools()
            return [
                {"name": t.name, "description": t.description, "parameters": dict(t.parameters)}
                for t in ws.tools
            ]

    print(json.dumps(anyio.run(build), indent=2))
    return 0


def _cmd_call(args: argparse.Namespace, plugins: PluginSet) -> int:
    arguments = _json_arg(args.arguments, "ARGS_JSON") or {}
    store = RefStore(args.state)
    say = functools.partial(print, file=sys.stderr)

    async def run() -> int:
        stored = await store.load(args.session)
        kind = args.provider or (stored.provider_kind if stored else default_provider_kind(plugins))
        if stored is not None and stored.provider_kind != kind:
            raise _Fail(f"session {args.session!r} belongs to provider {stored.provider_kind!r}", 2)
        options = _json_arg(args.provider_options, "--provider-options")
        if options is None:
            options = dict(stored.provider_options) if stored else {}
        caps = _json_arg(args.capabilities, "--capabilities")
        if caps is None and stored is not None:
            caps = stored.capabilities
        provider = resolve_provider(kind, plugins, options)
        caps = caps if caps is not None else default_capabilities(provider, plugins)
        spec = plugins.providers.get(kind)
        durable = spec is None or spec.outlives_process
        if not durable:
            say(
                f"corral: note: {kind} workspaces live in this process's memory and end "
                f"with it; session {args.session!r} is not stored (use local-bash, "
                "local-sandbox or docker to resume it in a later call)"
            )

        async def persist(ref: Any) -> None:
            if not durable:
                return
            if ref is None:
                await store.delete(args.session)
            else:
                await store.save(
                    args.session, kind, ref, capabilities=caps, provider_options=options
                )

        # Snapshots, restores and image pulls of big trees take a while: show
        # a bar, but only to a person at a terminal (never into a pipe).
        bar = ProgressBar.for_terminal(sys.stderr)
        try:
            async with open_workspace(
                provider,
                caps,
                session_id=args.session,
                ref=stored.ref if stored else None,
                persist_ref=persist,
                close_on_exit=not durable,
                plugins=plugins,
                on_progress=bar,
            ) as ws:
                result = await ws.call(args.tool, arguments)
                if ws.ref is not None:
                    await persist(ws.ref)
        finally:
            if bar is not None:
                bar.clear()
        return _print_result(result, args.json)

    return anyio.run(run)


def _cmd_sessions(args: argparse.Namespace, plugins: PluginSet) -> int:
    rows = anyio.run(RefStore(args.state).sessions)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "session_id": r.session_id,
                        "provider": r.provider_kind,
                        "workspace_open": r.ref is not None,
                        "updated_at": r.updated_at,
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
    elif not rows:
        print("no stored sessions (corral call --session NAME ... starts one)")
    else:
        for r in rows:
            print(f"{r.session_id}\t{r.provider_kind}")
    return 0


def _cmd_close(args: argparse.Namespace, plugins: PluginSet) -> int:
    store = RefStore(args.state)

    async def run() -> int:
        stored = await store.load(args.session)
        if stored is None:
            raise _Fail(f"no stored session {args.session!r}")
        provider = resolve_provider(stored.provider_kind, plugins, stored.provider_options)
        try:
            if stored.ref is not None:
                async with open_workspace(
                    provider,
                    stored.capabilities,
                    session_id=args.session,
                    ref=stored.ref,
                    plugins=plugins,
                    open_strategy="eager",
                ):
                    pass
        except WorkspaceFailedError as exc:
            await store.delete(args.session)
            print(
                f"session {args.session} forgotten; its workspace was already gone ({exc.message})"
            )
            return 0
        await store.delete(args.session)
        print(f"session {args.session} closed")
        return 0

    return anyio.run(run)


def _cmd_demo(args: argparse.Namespace, plugins: PluginSet) -> int:
    from ._demo import run_demo

    kind = args.provider or default_provider_kind(plugins)
    return anyio.run(run_demo, kind, plugins)


# -- parser ------------------------------------------------------------------------


def build_parser(plugins: PluginSet) -> argparse.ArgumentParser:
    """The argument parser, including plugin subcommands."""
    parser = argparse.ArgumentParser(prog="corral", description="Workspaces for AI agents.")
    parser.add_argument("--version", action="version", version=f"corral {_version()}")
    parser.add_argument("--state", help="session database (default: $CORRAL_STATE_DIR/...)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("providers", help="list installed providers")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_providers)

    p = sub.add_parser("tools", help="print the tool specs as JSON")
    p.add_argument("--provider", help="provider kind (default: the embedded default)")
    p.add_argument("--capabilities", help="capability config as JSON")
    p.add_argument("--provider-options", help="provider factory options as JSON")
    p.add_argument("--format", choices=["corral", "openai", "anthropic"], default="corral")
    p.set_defaults(func=_cmd_tools)

    p = sub.add_parser("call", help="make one tool call for a session (resumes its workspace)")
    p.add_argument("--provider", help="provider kind (default: the session's, or the default)")
    p.add_argument("--session", required=True, help="session id")
    p.add_argument("--capabilities", help="capability config as JSON (default: all supported)")
    p.add_argument("--provider-options", help="provider factory options as JSON")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("tool", metavar="TOOL", help="tool name, e.g. workspace_read_file")
    p.add_argument(
        "arguments", metavar="ARGS_JSON", nargs="?", default="{}", help="tool arguments as JSON"
    )
    p.set_defaults(func=_cmd_call)

    p = sub.add_parser("sessions", help="list stored sessions")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_sessions)

    p = sub.add_parser("close", help="close a session's workspace and forget it")
    p.add_argument("--session", required=True, help="session id")
    p.set_defaults(func=_cmd_close)

    p = sub.add_parser("demo", help="play a scripted agent session")
    p.add_argument("--provider", help="provider kind (default: the embedded default)")
    p.set_defaults(func=_cmd_demo)

    for command in plugins.commands.values():
        p = sub.add_parser(command.name, help=command.help)
        command.configure(p)
        p.set_defaults(plugin_run=command.run)
    for name, dist in KNOWN_COMMANDS.items():
        if name in plugins.commands:
            continue
        # Not argparse's "invalid choice": say which distribution adds the verb.
        p = sub.add_parser(name, help=f"(needs {dist}: pip install {dist})", add_help=False)
        p.set_defaults(func=_missing_command(name, dist), takes_any_arguments=True)
    return parser


def _missing_command(name: str, dist: str) -> Any:
    def run(args: argparse.Namespace, plugins: PluginSet) -> int:
        broken = plugins.failed.get(name)
        why = f" (its plugin failed to load: {broken})" if broken else ""
        raise _Fail(f"corral {name} needs {dist}: pip install {dist}{why}", 2)

    return run


def _version() -> str:
    try:
        return importlib.metadata.version("corral-core")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _die(message: str, status: int) -> NoReturn:
    print(f"corral: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``corral`` script."""
    level = os.environ.get("CORRAL_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.WARNING), format="corral: %(levelname)s: %(message)s"
    )
    try:
        plugins = default_plugins()
    except Exception as exc:  # a broken third-party plugin must not hide the CLI
        _die(f"loading plugins failed: {type(exc).__name__}: {exc}", 2)
    parser = build_parser(plugins)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        run = getattr(args, "plugin_run", None)
        status = int(run(args)) if run is not None else int(args.func(args, plugins))
        sys.stdout.flush()  # inside the try: a reader that left is handled below
    except _Fail as exc:
        _die(str(exc), exc.status)
    except ConfigError as exc:
        _die(str(exc), 2)
    except WorkspaceError as exc:
        _die(str(exc), 1)
    except KeyboardInterrupt:
        _die("interrupted", 130)
    except BaseException as exc:
        if not _is_broken_pipe(exc):
            raise
        # `corral demo | head`: the reader left. Point stdout at /dev/null so the
        # interpreter's final flush does not fail again, and exit quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a killed writer
    return status


def _is_broken_pipe(exc: BaseException) -> bool:
    if isinstance(exc, BrokenPipeError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_broken_pipe(e) for e in exc.exceptions)
    return False


if __name__ == "__main__":
    sys.exit(main())
