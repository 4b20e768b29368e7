"""``ropeserve`` command line: ``serve`` (the HTTP service) and the torch-free ``lint``/``explain``.

Exit codes of lint/explain: 0 clean, 1 findings at or above ``--fail-on``, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ropeserve import __version__
from ropeserve.cli_lint import EXIT_FINDINGS, add_lint_commands

SERVER_MODULES = ("torch", "numpy", "fastapi", "uvicorn", "pydantic", "pydantic_settings", "prometheus_client")
"""What ``serve`` needs beyond the lint-only base install (the ``server`` extra)."""


def _missing_server_modules() -> list[str]:
    return [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]


def _setting_name(loc: tuple[int | str, ...]) -> str:
    """The environment variable of a settings error location (a check across settings has none)."""
    return "ROPESERVE_" + "_".join(map(str, loc)).upper() if loc else "settings"


if TYPE_CHECKING:
    from ropeserve.settings import Settings


OPENMP_WAIT_POLICY = "PASSIVE"
"""For ``serve``, unless set: OpenMP threads sleep after a parallel region instead of spinning, which on shared
cores stalls the event loop's small torch ops for milliseconds (bench_small: packed positions 1,238 vs 78 req/s)."""


def _serve(args: argparse.Namespace) -> int:
    missing = _missing_server_modules()
    if missing:
        print(
            f"ropeserve serve: the service needs the 'server' extra (missing: {', '.join(missing)}); "
            "install it with: pip install 'ropeserve[server]'",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("OMP_WAIT_POLICY", OPENMP_WAIT_POLICY)  # read when torch loads, below
    from pydantic import ValidationError

    from ropeserve.settings import Settings

    given = {"host": args.host, "port": args.port, "device": args.device, "workers": args.workers}
    overrides = {key: value for key, value in given.items() if value is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        problems = "; ".join(f"{_setting_name(e['loc'])}: {e['msg']}" for e in error.errors())
        print(f"ropeserve serve: invalid settings: {problems}", file=sys.stderr)
        return 2
    if settings.workers > 1:
        from ropeserve.api.workers import run_workers

        return run_workers(settings, serve_worker)
    return serve_one(settings)


def serve_worker(settings: Settings, sockets: list[socket.socket]) -> None:
    """One worker process of ``--workers N``: a server on the shared socket; the exit status says how it ended."""
    sys.exit(serve_one(settings, sockets))


def serve_one(settings: Settings, sockets: list[socket.socket] | None = None) -> int:
    """Run one server (on ``sockets`` when given, else binding host:port); 0 after a clean stop, 3 if it never
    started."""
    from ropeserve.api import create_app
    from ropeserve.api.app import DrainingServer
    from ropeserve.api.transport import server_config
    from ropeserve.api.workers import NOT_STARTED

    app = create_app(settings)
    server = DrainingServer(server_config(app, settings), app.state.runtime, settings.drain_delay_s)
    with contextlib.suppress(KeyboardInterrupt):  # SIGINT: uvicorn re-raises it after a graceful shutdown
        server.run(sockets)
    return 0 if server.started else NOT_STARTED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ropeserve", description="Position-encoding reference service.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP service (settings: ROPESERVE_* environment variables)")
    serve.add_argument("--host", help="interface (default 127.0.0.1, env ROPESERVE_HOST)")
    serve.add_argument("--port", type=int, help="port (default 8000, env ROPESERVE_PORT)")
    serve.add_argument("--device", choices=["auto", "cpu", "cuda"], help="compute device (default auto)")
    serve.add_argument("--workers", type=int, help="server processes on one port (default 1, env ROPESERVE_WORKERS)")
    serve.set_defaults(func=_serve)
    add_lint_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand; ``lint``/``explain`` stay torch-free (``serve`` imports the web stack lazily)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly, as other CLI tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FINDINGS


if __name__ == "__main__":
    sys.exit(main())
