"""Serving Gleaner to other programs (HTTP, MCP) and the keys that guard it.

Each command goes through the public ``gleaner`` API, as the services themselves do.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from workers.cli.common import EXIT_OK, UsageError

MCP_OWNER_VARIABLE = "GLEANER_MCP_OWNER"


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gleaner import load_settings

    load_settings()  # a bad GLEANER_* setting stops start-up here, naming the variable
    uvicorn.run(
        "service.http:from_environment",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        # Off by default: request lines carry owners and search queries.
        access_log=args.access_log,
        log_level=args.log_level,
    )
    return EXIT_OK


def cmd_mcp(args: argparse.Namespace) -> int:
    from gleaner import Gleaner
    from service.mcp import build_server

    owner = args.owner or os.environ.get(MCP_OWNER_VARIABLE)
    if not owner:
        raise UsageError(f"say whose memory the agent uses: --owner NAME or {MCP_OWNER_VARIABLE}")
    gleaner = Gleaner()
    name = gleaner.owner_name(owner)
    server = build_server(gleaner, name)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        from service.mcp import NoKeyRefused, serve_http

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
    key, token = Gleaner().create_api_key(None if args.all_owners else args.owner)
    if args.json:
        print(json.dumps({**key.model_dump(mode="json"), "token": token}, indent=2))
    else:
        print(f"key {key.id} for {key.owner or 'all owners'}; its token (shown only now):")
        print(token)
    return EXIT_OK


def cmd_keys_list(args: argparse.Namespace) -> int:
    from gleaner import Gleaner

    keys = Gleaner().api_keys()
    if args.json:
        print(json.dumps([key.model_dump(mode="json") for key in keys], indent=2))
        return EXIT_OK
    for key in keys:
        print(f"{key.id}  {key.owner or '(all owners)'}  created {key.created_at:%Y-%m-%d %H:%M}")
    if not keys:
        print("no API keys")
    return EXIT_OK


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from gleaner import Gleaner

    key = Gleaner().revoke_api_key(args.key_id)
    print(f"revoked key {key.id} ({key.owner or 'all owners'})")
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
    whose = create.add_mutually_exclusive_group()
    whose.add_argument("--owner", metavar="NAME", help="the one owner the key may act for")
    whose.add_argument("--all-owners", action="store_true", help="a key for every owner")
    create.add_argument("--json", action="store_true")
    create.set_defaults(func=cmd_keys_create)
    listed = actions.add_parser("list", help="every key: id, owner, created (never a token)")
    listed.add_argument("--json", action="store_true")
    listed.set_defaults(func=cmd_keys_list)
    revoke = actions.add_parser("revoke", help="delete a key: it stops working at once")
    revoke.add_argument("key_id", metavar="ID")
    revoke.set_defaults(func=cmd_keys_revoke)
