"""``maskops token``: create, list and revoke the API's bearer tokens.

``maskops token create --name ci --scope write [--expires-in-days 30]`` prints the new
token once (only its hash is stored). The database is the control plane's
(``MASKOPS_DATABASE_URL``, or ``--database-url``).
"""

from __future__ import annotations

import argparse
from typing import Any

from maskops.cli.common import EXIT_OK, CLIError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "token", help="manage REST API tokens", description=__doc__.split("\n\n")[1]
    )
    actions = parser.add_subparsers(dest="token_action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a token and print it (once)")
    create.add_argument("--name", required=True, help="what the token is for")
    create.add_argument("--scope", choices=("read", "write", "admin"), default="read")
    create.add_argument("--expires-in-days", type=float, default=None)
    listing = actions.add_parser("list", help="list tokens (never their secrets)")
    revoke = actions.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id", type=int)
    for sub in (create, listing, revoke):
        sub.add_argument("--database-url", default=None, help="default: MASKOPS_DATABASE_URL")
        sub.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    # The database stack is imported only when this command runs (parsers are built for
    # every maskops command).
    from maskops_api.cli_tokens import TokenCommandError, run_token_command

    try:
        for line in run_token_command(
            args.token_action,
            database_url=args.database_url,
            name=getattr(args, "name", None),
            scope=getattr(args, "scope", None),
            expires_in_days=getattr(args, "expires_in_days", None),
            token_id=getattr(args, "id", None),
        ):
            print(line)
    except TokenCommandError as exc:
        raise CLIError(str(exc)) from None
    return EXIT_OK
