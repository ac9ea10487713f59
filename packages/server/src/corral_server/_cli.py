"""``corral serve`` and ``corral ws ...``: the service and its command-line client.

``corral serve`` needs no setup: state in ``<data>/state.db`` (SQLite),
blobs in ``<data>/blobs``, and on first start a project ``default`` whose
token is written to ``<data>/token`` (mode 0600) for the local CLI. The
replica id (the lease holder) is kept in ``<data>/replica-id`` so a
restarted server resumes its own live boxes at once. ``--store
postgresql://...`` shares state between replicas (give each its own
``--replica-id``; the blob directory must be shared too).

``corral ws`` finds the server through ``CORRAL_SERVER_URL`` (default
``http://127.0.0.1:8420``) and its token through ``CORRAL_SERVER_TOKEN`` or
the data directory's token file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
import anyio.to_thread
import attrs

import corral.capability
from corral import ConfigError

from ._blobs import LocalBlobStore
from ._client import ApiError, Client, client_settings
from ._errors import ServiceError
from ._gc import DEFAULT_GRACE_S, DEFAULT_SKEW_S
from ._serve import check_bind, serve
from ._service import ProviderFactory, WorkspaceService, plugin_providers
from ._store import open_store

__all__ = ["SERVE_COMMAND", "WS_COMMAND"]

log = logging.getLogger("corral.server")

DEFAULT_PORT: Final = 8420


def default_data_dir() -> Path:
    """``$CORRAL_SERVER_DATA`` or ``~/.local/state/corral/server``."""
    env = os.environ.get("CORRAL_SERVER_DATA")
    if env:
        return Path(env)
    return Path.home() / ".local" / "state" / "corral" / "server"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _replica_id(data: Path, given: str | None) -> str:
    if given:
        return given
    path = data / "replica-id"
    if path.exists():
        return path.read_text().strip()
    rid = f"srv-{secrets.token_hex(8)}"
    _write_private(path, rid)
    return rid


def _configure_serve(parser: argparse.ArgumentParser) -> None:
    parser.description = "Serve durable workspaces over HTTP (state in SQLite unless --store)."
    parser.add_argument("--host", default="127.0.0.1", help="IP to bind (loopback by default)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (0: any free)")
    parser.add_argument("--data", type=Path, default=None, help="data directory")
    parser.add_argument("--store", help="postgresql://... (default: SQLite in the data dir)")
    parser.add_argument("--blobs", type=Path, help="blob directory (default: <data>/blobs)")
    parser.add_argument("--replica-id", help="lease holder id of this replica")
    parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback bind")
    parser.add_argument("--tls-cert", help="TLS certificate (PEM); required with --allow-remote")
    parser.add_argument("--tls-key", help="TLS private key (PEM)")
    parser.add_argument("--idle-stop", type=float, default=600.0, help="stop idle boxes after S")
    parser.add_argument("--lease-ttl", type=float, default=30.0, help="lease lifetime in seconds")
    parser.add_argument("--max-body", type=int, default=1 << 20, help="largest request body")
    parser.add_argument(
        "--no-validate-open",
        action="store_true",
        help="do not open a throw-away box to check definitions at create",
    )
    parser.add_argument(
        "--provider",
        action="append",
        default=None,
        metavar="KIND[=JSON]",
        help="offer this provider kind, with these factory options (repeatable; "
        "default: every installed provider with its default options)",
    )
    parser.add_argument(
        "--allow-client-provider-options",
        action="store_true",
        help="let clients set provider factory options (host paths, engines): trusted clients only",
    )
    parser.add_argument(
        "--new-token",
        metavar="PROJECT",
        help="print a new token of PROJECT (created when missing) and exit, without serving",
    )
    parser.add_argument(
        "--gc-interval",
        type=float,
        default=3600.0,
        help="collect unreferenced version blobs every S seconds (0: never)",
    )
    parser.add_argument(
        "--gc-grace",
        type=float,
        default=DEFAULT_GRACE_S,
        help="never collect a blob written less than S seconds ago (default 3600); blobs "
        "of versions being taken are kept however long they take",
    )
    parser.add_argument(
        "--gc-skew",
        type=float,
        default=DEFAULT_SKEW_S,
        help="how far the replicas' and the blob store's clocks may disagree (default 60)",
    )
    parser.add_argument(
        "--gc",
        action="store_true",
        help="collect unreferenced blobs once, print what was done, and exit without serving",
    )
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")


async def _serve_main(args: argparse.Namespace) -> int:
    data: Path = args.data or default_data_dir()
    await anyio.to_thread.run_sync(lambda: data.mkdir(parents=True, exist_ok=True, mode=0o700))
    store = open_store(args.store or str(data / "state.db"))
    blobs = LocalBlobStore(str(args.blobs or data / "blobs"))
    service = WorkspaceService(
        store,
        blobs,
        holder=_replica_id(data, args.replica_id),
        lease_ttl_s=args.lease_ttl,
        idle_stop_s=args.idle_stop if args.idle_stop > 0 else None,
        validate_open=not args.no_validate_open,
        client_provider_options=args.allow_client_provider_options,
        providers=_offered(args.provider),
        gc_interval_s=args.gc_interval if args.gc_interval > 0 else None,
        gc_grace_s=args.gc_grace,
        gc_skew_s=args.gc_skew,
    )
    await store.migrate()
    if args.gc:
        report = await service.collect_garbage()
        print(json.dumps(attrs.asdict(report)), flush=True)
        await store.aclose()
        return 0
    if args.new_token:
        project = await store.project_by_name(args.new_token)
        if project is None:
            _project, token = await service.create_project(args.new_token)
        else:
            token = await service.add_token(project)
        print(token, flush=True)
        await store.aclose()
        return 0
    token_file = data / "token"
    if await store.project_by_name("default") is None:
        _pid, token = await service.create_project("default")
        _write_private(token_file, token + "\n")
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(
            lambda task_status: serve(
                service,
                args.host,
                args.port,
                allow_remote=args.allow_remote,
                certfile=args.tls_cert,
                keyfile=args.tls_key,
                max_body_bytes=args.max_body,
                task_status=task_status,
            )
        )
        scheme = "https" if args.tls_cert else "http"
        shown = f"[{host}]" if ":" in host else host
        print(f"corral serve: listening on {scheme}://{shown}:{port}", flush=True)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break
        tg.cancel_scope.cancel()
    await store.aclose()
    return 0


def _offered(specs: list[str] | None) -> ProviderFactory:
    """The providers ``--provider KIND[=JSON]`` offers (all installed ones when none)."""
    if not specs:
        return plugin_providers()
    options: dict[str, dict[str, Any]] = {}
    for spec in specs:
        kind, _, raw = spec.partition("=")
        options[kind] = (_json_object(raw, f"--provider {kind}") or {}) if raw else {}
    return plugin_providers(options, kinds=frozenset(options))


def _run_serve(args: argparse.Namespace) -> int:
    try:
        check_bind(
            args.host, allow_remote=args.allow_remote, certfile=args.tls_cert, keyfile=args.tls_key
        )
        return anyio.run(_serve_main, args, backend=args.backend)
    except ServiceError as exc:
        raise ConfigError(exc.message) from None
    except OSError as exc:
        raise ConfigError(f"cannot serve: {exc.strerror or type(exc).__name__}") from None


SERVE_COMMAND: Final = corral.capability.CliCommand(
    name="serve",
    help="serve durable workspaces over HTTP (corral-server)",
    configure=_configure_serve,
    run=_run_serve,
)
"""``corral serve``."""


# -- corral ws -----------------------------------------------------------------


def _configure_ws(parser: argparse.ArgumentParser) -> None:
    parser.description = "Work with the durable workspaces of a 'corral serve'."
    parser.add_argument("--url", default=None, help="server URL (default $CORRAL_SERVER_URL)")
    parser.add_argument("--token", default=None, help="token (default $CORRAL_SERVER_TOKEN)")
    parser.add_argument("--data", type=Path, default=None, help="data dir holding the token")
    sub = parser.add_subparsers(dest="verb", required=True)
    create = sub.add_parser("create", help="create a workspace")
    create.add_argument("--provider", default="local-bash")
    create.add_argument("--image")
    create.add_argument("--options", help="per-workspace provider options (JSON object)")
    create.add_argument("--provider-options", help="provider factory options (JSON object)")
    create.add_argument("--capabilities", default="fs,shell,process")
    create.add_argument("--mount-path", default="/workspace")
    create.add_argument("--metadata", help="JSON object")
    create.add_argument("--tag", action="append", default=[])
    lst = sub.add_parser("list", help="list workspaces")
    lst.add_argument("--tag")
    lst.add_argument("--state", choices=["active", "archived"])
    lst.add_argument("--limit", type=int, default=50)
    lst.add_argument("--cursor")
    for verb in ("show", "archive", "delete", "connect", "stop"):
        sub.add_parser(verb, help=f"{verb} a workspace").add_argument("id")
    prune = sub.add_parser(
        "prune", help="delete all but the newest versions (the collector frees their blobs)"
    )
    prune.add_argument("id")
    prune.add_argument("--keep", type=int, default=1, help="versions to keep (default 1)")
    upd = sub.add_parser("update", help="replace metadata and/or tags")
    upd.add_argument("id")
    upd.add_argument("--metadata", help="JSON object")
    upd.add_argument("--tag", action="append", default=None)
    files = sub.add_parser("files", help="read files from versions")
    fsub = files.add_subparsers(dest="files_verb", required=True)
    for verb in ("read", "ls", "stat"):
        p = fsub.add_parser(verb)
        p.add_argument("id")
        p.add_argument("path", nargs="?" if verb == "ls" else None, default="/")
        p.add_argument("--version", help="a version id (default: the current version)")
    pt = sub.add_parser("pty", help="attach this terminal to a new terminal in the workspace")
    pt.add_argument("id")
    pt.add_argument("--command", default="/bin/sh", help="the program (default /bin/sh)")
    pt.add_argument("--cwd")
    ex = sub.add_parser("exec", help="run a command in the workspace, streaming its output")
    ex.add_argument("id")
    ex.add_argument("command", help="the command line")
    ex.add_argument("--cwd")
    ex.add_argument("--timeout", type=float)


def _client(args: argparse.Namespace) -> Client:
    return Client(*client_settings(args.url, args.token, args.data))


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


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _run_ws(args: argparse.Namespace) -> int:
    try:
        with _client(args) as client:
            return _ws_verb(client, args)
    except ApiError as exc:
        print(f"corral ws: {exc.code}: {exc.message}", file=sys.stderr)
        return 1


def _ws_verb(client: Client, args: argparse.Namespace) -> int:
    verb = args.verb
    if verb == "create":
        sandbox: dict[str, Any] = {
            "provider": args.provider,
            "capabilities": [c for c in args.capabilities.split(",") if c],
            "mount_path": args.mount_path,
        }
        if args.image:
            sandbox["image"] = args.image
        if args.options:
            sandbox["options"] = _json_object(args.options, "--options")
        if args.provider_options:
            sandbox["provider_options"] = _json_object(args.provider_options, "--provider-options")
        meta = _json_object(args.metadata, "--metadata") or {}
        _print(client.create(sandbox, metadata=meta, tags=args.tag))
    elif verb == "list":
        _print(
            client.list_workspaces(
                tag=args.tag, state=args.state, limit=args.limit, cursor=args.cursor
            )
        )
    elif verb == "show":
        _print(client.get(args.id))
    elif verb == "update":
        _print(
            client.update(
                args.id, metadata=_json_object(args.metadata, "--metadata"), tags=args.tag
            )
        )
    elif verb in ("archive", "connect", "stop"):
        _print(getattr(client, verb)(args.id))
    elif verb == "delete":
        client.delete(args.id)
    elif verb == "prune":
        _print({"removed": client.prune_versions(args.id, args.keep)})
    elif verb == "files":
        return _files(client, args)
    elif verb == "exec":
        return _exec(client, args)
    elif verb == "pty":
        from ._attach import attach

        return attach(client, args.id, args.command, cwd=args.cwd)
    return 0


def _files(client: Client, args: argparse.Namespace) -> int:
    kw = {"version_id": args.version} if args.version else {}
    if args.files_verb == "read":
        sys.stdout.buffer.write(client.read_file(args.id, args.path, **kw))
        sys.stdout.buffer.flush()
    elif args.files_verb == "ls":
        for entry in client.ls(args.id, args.path, **kw):
            suffix = "/" if entry["type"] == "dir" else ""
            print(f"{entry['name']}{suffix}")
    else:
        _print(client.stat(args.id, args.path, **kw))
    return 0


def _exec(client: Client, args: argparse.Namespace) -> int:
    options: dict[str, Any] = {}
    if args.cwd:
        options["cwd"] = args.cwd
    if args.timeout:
        options["timeout_s"] = args.timeout
    handle = client.exec(args.id, args.command, **options)
    for data in client.output(args.id, handle["id"]):
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    for data in client.output(args.id, handle["id"], stream="stderr"):
        sys.stderr.buffer.write(data)
    info = client.wait(args.id, handle["id"], timeout_s=60.0)
    code = info.get("exit_code")
    return int(code) if isinstance(code, int) else 1


WS_COMMAND: Final = corral.capability.CliCommand(
    name="ws",
    help="work with durable workspaces of a 'corral serve' (create, list, files, exec...)",
    configure=_configure_ws,
    run=_run_ws,
)
"""``corral ws``."""
