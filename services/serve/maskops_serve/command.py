"""``maskops serve``: the whole control plane in the foreground on this machine.

Starts the REST API (Swagger UI at /docs), a Celery worker and Triton (when the PyPI
server can start) on SQLite and a broker that needs no server (Redis when one answers on
127.0.0.1:6379), generates and registers the demo dataset, and prints where everything
is. ``--demo`` then walks the workflow over HTTP. Ctrl-C or SIGTERM stops it all.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from maskops.cli.common import CLIError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the API, a worker and Triton here", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--state-dir", type=Path, default=Path(".maskops"), help="database, data root, logs"
    )
    parser.add_argument("--demo", action="store_true", help="walk the demo workflow over HTTP")
    parser.add_argument(
        "--demo-steps",
        type=int,
        help="training steps of the walk (default: its recipe's, mask AP about 0.7)",
    )
    broker = parser.add_mutually_exclusive_group()
    broker.add_argument("--redis", dest="use_redis", action="store_true", default=None)
    broker.add_argument("--no-redis", dest="use_redis", action="store_false")
    parser.add_argument("--no-triton", dest="triton", action="store_false")
    parser.add_argument(
        "--new-token",
        action="store_true",
        help="with auth required: replace the stored admin token (the old one is revoked)",
    )
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise CLIError(f"--port must be 1..65535, got {args.port}")
    if args.demo_steps is not None and args.demo_steps < 1:
        raise CLIError(f"--demo-steps must be at least 1, got {args.demo_steps}")
    # The web stack is imported only when this command runs.
    from maskops_serve.demo import DEMO_STEPS
    from maskops_serve.embedded import EmbeddedConfig, serve
    from maskops_serve.state_lock import StateDirBusy

    config = EmbeddedConfig(
        host=args.host,
        port=args.port,
        state_dir=args.state_dir,
        demo=args.demo,
        demo_steps=DEMO_STEPS if args.demo_steps is None else args.demo_steps,
        use_redis=args.use_redis,
        triton=args.triton,
        new_token=args.new_token,
    )
    try:
        return serve(config)
    except StateDirBusy as exc:
        raise CLIError(str(exc)) from None
