"""Pieces shared by the ``ropeserve-client`` commands: exit codes, the client from flags, input files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ropeserve_client._clients import DEFAULT_TIMEOUT, Client
from ropeserve_client._retry import DEFAULT_RETRY, RetryPolicy

__all__ = ["EXIT_ERROR", "EXIT_FINDINGS", "EXIT_OK", "PROG", "UsageError", "client_from", "print_json", "read_json"]

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
PROG = "ropeserve-client"


class UsageError(Exception):
    """Bad command-line input found after parsing (unreadable file, invalid JSON)."""


def client_from(args: argparse.Namespace) -> Client:
    """A numpy-backed client (no torch import) configured by the connection flags."""
    retry = RetryPolicy(max_retries=args.retries) if args.retries is not None else DEFAULT_RETRY
    timeout = DEFAULT_TIMEOUT if args.timeout is None else args.timeout
    return Client(args.url, token=args.token, timeout=timeout, retry=retry, array_backend="numpy")


def read_json(path: str | Path, what: str = "a config") -> dict[str, Any]:
    """The JSON object in the file at ``path``; UsageError (one line) when unreadable or not an object."""
    try:
        loaded = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise UsageError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise UsageError(f"{path}: {what} must be a JSON object")
    return loaded


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))
