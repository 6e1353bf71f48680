"""Serving Gleaner to other programs (HTTP, MCP) and the keys that guard it.

Each command goes through the public ``gleaner`` API, as the services themselves do.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from gleaner.cli.common import EXIT_OK, UsageError, require_database

if TYPE_CHECKING:
    from gleaner import ApiKey

MCP_OWNER_VARIABLE = "GLEANER_MCP_OWNER"


# `gleaner serve` options that set a GLEANER_* setting for the server's processes.
SERVE_SETTINGS = {
    "max_connections": "GLEANER_HTTP_MAX_CONNECTIONS",
    "header_timeout": "GLEANER_HTTP_HEADER_TIMEOUT_SECONDS",
    "body_timeout": "GLEANER_HTTP_BODY_TIMEOUT_SECONDS",
    "max_body_bytes": "GLEANER_HTTP_MAX_BODY_BYTES",
}


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gleaner import load_settings

    for option, variable in SERVE_SETTINGS.items():
        if getattr(args, option) is not None:  # in the environment: every worker reads it
            os.environ[variable] = str(getattr(args, option))
    settings = load_settings()  # a bad GLEANER_* setting stops start-up here, naming it
    uvicorn.run(
        "gleaner.service.http:from_environment",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        # Closes connections that send no request in time (uvicorn alone never does).
        http="gleaner.service.connections:HeaderDeadlineProtocol",
        limit_concurrency=settings.http_max_connections,
        # Off by default: request lines carry owners and search queries.
        access_log=args.access_log,
        log_level=args.log_level,
    )
    return EXIT_OK


def cmd_mcp(args: argparse.Namespace) -> int:
    from gleaner import Gleaner
    from gleaner.service.mcp import build_server

    owner = args.owner or os.environ.get(MCP_OWNER_VARIABLE)
    if not owner:
        raise UsageError(f"say whose memory the agent uses: --owner NAME or {MCP_OWNER_VARIABLE}")
    gleaner = Gleaner()
    name = gleaner.owner_name(owner)
    server = build_server(gleaner, name)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        from gleaner.service.mcp import NoKeyRefused, serve_http

        try:
            serve_http(
                server,
                gleaner,
                name,
                host=args.host,
                port=args.port,
                no_key=args.no_key,
                extra_hosts=args.allowed_host,
            )
        except NoKeyRefused as exc:
            raise UsageError(str(exc)) from None
    return EXIT_OK


def cmd_keys_create(args: argparse.Namespace) -> int:
    from gleaner import Gleaner

    if not args.owner and not args.all_owners:
        raise UsageError("say which owner the key is for: --owner NAME or --all-owners")
    key, token = Gleaner().create_api_key(
        None if args.all_owners else args.owner, read_only=args.read_only
    )
    if args.json:
        print(json.dumps({**key.model_dump(mode="json"), "token": token}, indent=2))
    else:
        print(f"key {key.id} for {whose(key)}, {access(key)}; its token (shown only now):")
        print(token)
    return EXIT_OK


def whose(key: ApiKey) -> str:
    """The owners a key is allowed, as listed: an owner's name is always quoted (JSON
    style), so an owner named "(all owners)" never reads like a key for every owner."""
    return "all owners" if key.all_owners else f"owner {json.dumps(key.owner, ensure_ascii=False)}"


def access(key: ApiKey) -> str:
    return "read-only" if key.read_only else "read-write"


def cmd_keys_list(args: argparse.Namespace) -> int:
    from gleaner import Gleaner

    require_database()  # a listing creates no database
    keys = Gleaner().api_keys()
    if args.json:
        print(json.dumps([key.model_dump(mode="json") for key in keys], indent=2))
        return EXIT_OK
    for key in keys:
        print(f"{key.id}  {access(key):10}  {key.created_at:%Y-%m-%d %H:%M}  {whose(key)}")
    if not keys:
        print("no API keys")
    return EXIT_OK


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from gleaner import Gleaner

    require_database()
    key = Gleaner().revoke_api_key(args.key_id)
    print(f"revoked key {key.id} ({whose(key)})")
    return EXIT_OK


def register(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve the HTTP API (needs API keys: gleaner keys create)",
        description="Serve Gleaner over HTTP (FastAPI on uvicorn): POST a conversation, follow "
        "its job, search, read a note, the index text, forget. Requests carry an API key "
        "(Authorization: Bearer ...). OpenAPI at /openapi.json, docs at /docs.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    serve.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="open connections per process; a request over it is 503 "
        "(GLEANER_HTTP_MAX_CONNECTIONS)",
    )
    serve.add_argument(
        "--header-timeout",
        type=float,
        metavar="SECONDS",
        help="close a connection sending no whole request line and headers in this time "
        "(GLEANER_HTTP_HEADER_TIMEOUT_SECONDS)",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        metavar="SECONDS",
        help="408 for a body not whole in this time (GLEANER_HTTP_BODY_TIMEOUT_SECONDS)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="N",
        help="413 for a larger request body (GLEANER_HTTP_MAX_BODY_BYTES)",
    )
    serve.add_argument(
        "--access-log", action="store_true", help="log each request (paths name owners)"
    )
    serve.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )
    serve.set_defaults(func=cmd_serve)

    mcp = sub.add_parser(
        "mcp",
        help="serve the MCP tools to an agent, scoped to one owner",
        description="An MCP server (stdio, or streamable HTTP at /mcp) with the tools mem_save, "
        "mem_session_summary, mem_search, mem_read and mem_index, all acting for one owner. "
        "Over HTTP every request needs an API key that allows that owner (unless --no-key, "
        "on a loopback address only), and must name the bound address in Host and Origin "
        "(DNS-rebinding protection).",
    )
    mcp.add_argument(
        "--owner", metavar="NAME", help=f"whose memory the agent uses (or {MCP_OWNER_VARIABLE})"
    )
    mcp.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="streamable HTTP: address")
    mcp.add_argument("--port", type=int, default=8001, help="streamable HTTP: port")
    keyless = mcp.add_mutually_exclusive_group()
    keyless.add_argument(
        "--no-key",
        action="store_true",
        help="streamable HTTP: no API key (any local process can then use the memory); "
        "refused on any address but loopback",
    )
    keyless.add_argument(
        "--require-key", action="store_true", help="streamable HTTP: the default; kept for scripts"
    )
    mcp.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="streamable HTTP: another name clients reach the server by (a proxy's, a DNS "
        "name), let through the DNS-rebinding check; repeatable",
    )
    mcp.set_defaults(func=cmd_mcp)

    keys = sub.add_parser(
        "keys", help="API keys of the HTTP service and of MCP over HTTP: create, list, revoke"
    )
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="a new key; its token is printed once")
    owners = create.add_mutually_exclusive_group()
    owners.add_argument("--owner", metavar="NAME", help="the one owner the key may act for")
    owners.add_argument("--all-owners", action="store_true", help="a key for every owner")
    create.add_argument(
        "--read-only",
        action="store_true",
        help="the key may search, read, get the index and follow jobs, but not submit, pin, "
        "delete or forget",
    )
    create.add_argument("--json", action="store_true")
    create.set_defaults(func=cmd_keys_create)
    listed = actions.add_parser(
        "list",
        help="every key: id, read-only or read-write, created, then its owner quoted or "
        "'all owners' (never a token)",
    )
    listed.add_argument("--json", action="store_true")
    listed.set_defaults(func=cmd_keys_list)
    revoke = actions.add_parser("revoke", help="delete a key: it stops working at once")
    revoke.add_argument("key_id", metavar="ID")
    revoke.set_defaults(func=cmd_keys_revoke)
