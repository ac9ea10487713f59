"""The ``corral mcp`` subcommand: serve a (resumable) session's workspace over MCP."""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import signal
import sys
from typing import Any, Final

import anyio
import anyio.abc

import corral
import corral.capability
from corral import ConfigError, RefStore, WorkspaceFailedError, WorkspaceRef

from ._address import (
    DEFAULT_HTTP_PATH,
    DEFAULT_SERVER_NAME,
    REMOTE_WARNING,
    check_bind_host,
    parse_http_address,
)

__all__ = ["MCP_COMMAND"]

log = logging.getLogger("corral.mcp")


def _json_object(text: str | None, what: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        raise ConfigError(f"{what} is not valid JSON") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object")
    return value


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve a workspace's tools to an MCP host: over stdio by default, or over "
        "streamable HTTP with --http. The session's workspace ref is stored (see "
        "'corral sessions'), so a restarted server with the same --session resumes it."
    )
    parser.add_argument("--provider", help="provider kind (default: the session's, or local-bash)")
    parser.add_argument("--capabilities", help="capability config as JSON (default: all supported)")
    parser.add_argument("--provider-options", help="provider factory options as JSON")
    parser.add_argument(
        "--session",
        help="session id to create or resume (default: a fresh id, printed on stderr)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the workspace when the server stops, so the same --session resumes it "
        "(default: close it; 'corral close --session ID' closes a kept one)",
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP on this address (loopback only unless --allow-remote), "
        "instead of stdio",
    )
    parser.add_argument("--http-path", default=DEFAULT_HTTP_PATH, help="HTTP endpoint path")
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help=f"allow --http on a non-loopback address; dangerous: {REMOTE_WARNING}",
    )
    parser.add_argument("--name", default=DEFAULT_SERVER_NAME, help="server name sent to clients")
    parser.add_argument(
        "--workspace",
        metavar="ID",
        help="serve this durable workspace of a 'corral serve' (needs corral-server): the "
        "tools act on it through the service's API, and what they do stays in it",
    )
    parser.add_argument(
        "--server-url", help="with --workspace: the server (default $CORRAL_SERVER_URL)"
    )
    parser.add_argument(
        "--server-token",
        help="with --workspace: the project token (default $CORRAL_SERVER_TOKEN, which "
        "keeps it off the command line)",
    )
    parser.add_argument(
        "--backend",
        choices=["asyncio", "trio"],
        default="asyncio",
        help="event loop the server runs on (default: asyncio)",
    )


async def _stop_on_signal(
    scope: anyio.CancelScope,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        task_status.started()
        async for signum in signals:
            log.info("received %s; shutting down", signal.Signals(signum).name)
            scope.cancel()
            return


async def _durable_provider(args: argparse.Namespace) -> corral.provider.WorkspaceProvider:
    """The provider of ``--workspace``: corral-server's adapter, imported only here."""
    for flag, value in (
        ("--provider", args.provider),
        ("--provider-options", args.provider_options),
        ("--session", args.session),
    ):
        if value is not None:
            raise ConfigError(f"{flag} does not apply with --workspace")
    try:
        from corral_server import DurableWorkspaceProvider
    except ImportError:
        raise ConfigError(
            "--workspace needs corral-server: pip install 'corral-mcp[server]'"
        ) from None
    return await DurableWorkspaceProvider.connect(
        args.workspace, url=args.server_url, token=args.server_token
    )


async def _serve_durable(args: argparse.Namespace, http: tuple[str, int] | None) -> int:
    """Serve a durable workspace: no ref is stored (the service keeps the workspace)."""
    plugins = corral.default_plugins()
    provider = await _durable_provider(args)
    caps = _json_object(args.capabilities, "--capabilities")
    if caps is None:
        caps = {n: True for n in sorted(provider.capabilities) if n in plugins.capabilities}
    async with corral.open_workspace(
        provider,
        caps,
        session_id=f"mcp-{secrets.token_hex(6)}",
        open_strategy="eager",
        plugins=plugins,
    ) as ws:
        await _serve_session(ws, http, args, f"workspace {args.workspace}")
    _announce(f"workspace {args.workspace}: MCP session ended (the workspace stays)")
    return 0


async def _serve_session(
    ws: corral.WorkspaceSession,
    http: tuple[str, int] | None,
    args: argparse.Namespace,
    what: str,
) -> None:
    where = "stdio" if http is None else "http"
    async with anyio.create_task_group() as tg:
        await tg.start(_stop_on_signal, tg.cancel_scope)
        if http is None:
            from ._serve import serve_stdio  # the SDK loads only when serving

            _announce(f"{what}; serving MCP on {where}")
            await serve_stdio(ws, name=args.name)
        else:
            host, port = await tg.start(_serve_http, ws, http, args)
            shown = f"[{host}]" if ":" in host else host
            _announce(f"{what}; serving MCP on http://{shown}:{port}{args.http_path}")
            await anyio.sleep_forever()
        tg.cancel_scope.cancel()


async def _serve(args: argparse.Namespace, http: tuple[str, int] | None) -> int:
    if args.workspace is not None:
        return await _serve_durable(args, http)
    plugins = corral.default_plugins()
    store = RefStore(args.state)
    session_id: str = args.session or f"mcp-{secrets.token_hex(6)}"
    stored = await store.load(session_id) if args.session else None
    kind = args.provider or (
        stored.provider_kind if stored else corral.default_provider_kind(plugins)
    )
    if stored is not None and stored.provider_kind != kind:
        raise ConfigError(f"session {session_id!r} belongs to provider {stored.provider_kind!r}")
    options = _json_object(args.provider_options, "--provider-options")
    if options is None:
        options = dict(stored.provider_options) if stored else {}
    caps = _json_object(args.capabilities, "--capabilities")
    if caps is None and stored is not None and stored.capabilities is not None:
        caps = dict(stored.capabilities)
    provider = plugins.provider(kind).create(options)
    if caps is None:
        caps = {n: True for n in sorted(provider.capabilities) if n in plugins.capabilities}
    resume = stored.ref if stored else None

    async def persist(ref: WorkspaceRef | None) -> None:
        if ref is None:
            await store.delete(session_id)
        else:
            await store.save(session_id, kind, ref, capabilities=caps, provider_options=options)

    opened = False
    try:
        async with corral.open_workspace(
            provider,
            caps,
            session_id=session_id,
            ref=resume,
            persist_ref=persist,
            open_strategy="eager",
            close_on_exit=not args.keep,
            plugins=plugins,
        ) as ws:
            opened = True
            if ws.ref is not None:
                await persist(ws.ref)
            verb = "resumed" if resume is not None else "opened"
            await _serve_session(ws, http, args, f"{verb} session {session_id} ({kind})")
    except WorkspaceFailedError as exc:
        if resume is None or opened:
            raise
        raise WorkspaceFailedError(
            f"cannot resume session {session_id!r}: {exc.message}; "
            f"'corral close --session {session_id}' forgets it"
        ) from None
    kept = " (workspace kept)" if args.keep else ""
    _announce(f"session {session_id} stopped{kept}")
    return 0


async def _serve_http(
    ws: corral.WorkspaceSession,
    address: tuple[str, int],
    args: argparse.Namespace,
    *,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    from ._serve import serve_http  # the SDK loads only when serving

    await serve_http(
        ws,
        address[0],
        address[1],
        path=args.http_path,
        allow_remote=args.allow_remote,
        name=args.name,
        task_status=task_status,
    )


def _announce(message: str) -> None:
    # stderr, never stdout: in stdio mode stdout is the protocol wire.
    print(f"corral mcp: {message}", file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    http = None
    if args.http is not None:
        host, port = parse_http_address(args.http)
        http = (check_bind_host(host, allow_remote=args.allow_remote), port)
    elif args.allow_remote:
        raise ConfigError("--allow-remote only applies with --http")
    try:
        return anyio.run(_serve, args, http, backend=args.backend)
    except OSError as exc:
        raise ConfigError(f"cannot serve MCP: {exc.strerror or exc}") from None


MCP_COMMAND: Final = corral.capability.CliCommand(
    name="mcp",
    help="serve a workspace's tools over MCP (stdio, or streamable HTTP with --http)",
    configure=_configure,
    run=_run,
)
"""The ``corral mcp`` subcommand, registered by the plugin."""
