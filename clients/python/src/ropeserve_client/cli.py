"""``ropeserve-client``: use a remote ropeserve from the shell or a pipeline (no server install needed).

Commands: ``lint PATH...`` (as the server's ``ropeserve lint``), ``info``, ``health``, ``cos-sin``. Exit status:
0 success (lint: no finding at or above ``--fail-on``, default error), 1 lint findings / not ready / output pipe
closed early (``| head``), 2 usage, input, connection or server error (one line on stderr, no traceback).
``--url`` defaults to ``$ROPESERVE_URL``, ``--token`` to ``$ROPESERVE_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ropeserve_client._cli_common import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_OK,
    PROG,
    UsageError,
    client_from,
    print_json,
    read_json,
)
from ropeserve_client._cli_lint import add_lint_arguments, run_lint
from ropeserve_client._exceptions import NotReady, RopeserveError
from ropeserve_client._operations import position_spec
from ropeserve_client._results import TensorResult
from ropeserve_client._version import __version__

__all__ = ["build_parser", "main"]


def run_info(args: argparse.Namespace) -> int:
    with client_from(args) as client:
        info = client.info()
    if args.format == "json":
        print_json(info)
        return EXIT_OK
    for key in ("version", "device", "kernel"):
        print(f"{key}: {info.get(key)}")
    print(f"rope types: {', '.join(info.get('rope_types', []))}")
    print(f"presets: {', '.join(sorted(info.get('presets', {})))}")
    for name, value in sorted(info.get("limits", {}).items()):
        print(f"limit {name}: {value}")
    return EXIT_OK


def run_health(args: argparse.Namespace) -> int:
    with client_from(args) as client:
        try:
            client.ready()
        except NotReady as exc:
            print(f"not ready: {exc.detail}")
            return EXIT_FINDINGS
    print("ready")
    return EXIT_OK


def _rope_source(args: argparse.Namespace) -> dict[str, Any]:
    given = [name for name in ("preset", "config", "rope") if getattr(args, name) is not None]
    if len(given) != 1:
        raise UsageError("give exactly one of --preset, --config or --rope")
    if args.config is not None:
        return {"config": read_json(args.config)}
    if args.rope is not None:
        try:
            return {"rope": json.loads(args.rope)}
        except ValueError as exc:
            raise UsageError(f"--rope is not valid JSON: {exc}") from exc
    return {"preset": args.preset}


def _positions(text: str) -> Any:
    try:
        if ":" in text:
            return position_spec(text)
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise UsageError(f"--positions {text!r}: expected start:stop[:step] or a comma-separated list") from exc


def _print_tensors(result: TensorResult, as_json: bool) -> None:
    if as_json:
        print_json({**result.meta, **{name: np.asarray(t).tolist() for name, t in result.tensors.items()}})
        return
    for key in sorted(result.meta):
        if key != "params":
            print(f"{key}: {result.meta[key]}")
    with np.printoptions(precision=7, suppress=True, linewidth=120, threshold=64, edgeitems=3):
        for name, tensor in result.tensors.items():
            array = np.asarray(tensor)
            print(f"{name} {list(array.shape)} {array.dtype}:\n{array}")


def run_cos_sin(args: argparse.Namespace) -> int:
    source = _rope_source(args)
    options = {"dtype": args.dtype, "pairing": args.pairing, "layer_type": args.layer_type}
    positions = _positions(args.positions)
    with client_from(args) as client:
        result = client.cos_sin(positions, **source, **options)
    if args.out:
        from ropeserve_client._arrays import encode_safetensors

        Path(args.out).write_bytes(encode_safetensors(result.tensors, result.meta))
        print(f"wrote {args.out}")
        return EXIT_OK
    _print_tensors(result, args.format == "json")
    return EXIT_OK


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    group.add_argument("--url", help="server root (default $ROPESERVE_URL or http://127.0.0.1:8000)")
    group.add_argument("--token", help="bearer token (default $ROPESERVE_TOKEN)")
    group.add_argument("--timeout", type=float, help="seconds per request (default: connect 5, read 60)")
    group.add_argument("--retries", type=int, help="retries on 429/503/connection failure (default 3)")
    return common


def _add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Callable[[argparse.Namespace], int],
    common: argparse.ArgumentParser,
    help: str,
) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, parents=[common], help=help, description=help)
    parser.set_defaults(handler=handler)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Client for a remote ropeserve service.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = _common_options()
    commands = parser.add_subparsers(dest="command", required=True)

    lint = _add_command(commands, "lint", run_lint, common, "lint config.json files against a deployment intent")
    add_lint_arguments(lint)

    info = _add_command(commands, "info", run_info, common, "show server version, rope types, presets and limits")
    info.add_argument("--format", choices=["text", "json"], default="text")

    _add_command(commands, "health", run_health, common, "exit 0 when the server is ready, 1 when not")

    cos_sin = _add_command(commands, "cos-sin", run_cos_sin, common, "compute RoPE cos/sin tables")
    source = cos_sin.add_argument_group("rope parameters (exactly one)")
    source.add_argument("--preset", help="built-in preset name (see `info`)")
    source.add_argument("--config", help="path of a config.json")
    source.add_argument("--rope", help='explicit parameters as JSON, e.g. \'{"rope_theta": 1e4, "head_dim": 8}\'')
    cos_sin.add_argument("--positions", required=True, help="start:stop[:step] or a comma-separated list")
    cos_sin.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    cos_sin.add_argument("--pairing", choices=["neox", "gptj"])
    cos_sin.add_argument("--layer-type", help="layer type of per-layer configs")
    cos_sin.add_argument("--format", choices=["text", "json"], default="text")
    cos_sin.add_argument("--out", help="write the tensors to this safetensors file instead of printing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
    except RopeserveError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
    except BrokenPipeError:  # piped into `head`: stop quietly, and keep Python's exit-time flush from failing too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FINDINGS
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
