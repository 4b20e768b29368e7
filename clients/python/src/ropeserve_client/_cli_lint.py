"""``ropeserve-client lint``: the server's ``ropeserve lint`` over HTTP (same flags, output and exit codes).

Each PATH is a config.json or a model directory holding one (its tokenizer_config.json is sent too). Exit status:
0 no finding at or above ``--fail-on`` (default error), 1 such findings, 2 usage, input or connection error.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ropeserve_client._cli_common import EXIT_FINDINGS, EXIT_OK, UsageError, client_from, print_json, read_json
from ropeserve_client._results import SEVERITIES, LintReport

__all__ = ["add_lint_arguments", "run_lint"]

CONFIG_NAME, TOKENIZER_CONFIG_NAME = "config.json", "tokenizer_config.json"


def add_lint_arguments(lint: argparse.ArgumentParser) -> None:
    lint.add_argument("paths", nargs="+", metavar="PATH", help="config.json or a model directory")
    lint.add_argument(
        "--engine",
        action="append",
        dest="engines",
        metavar="ENGINE[SPEC]",
        help="target engine, repeatable: transformers, vllm, sglang, tgi, llama.cpp; e.g. vllm==0.9.1",
    )
    lint.add_argument(
        "--max-model-len",
        "--context-length",
        "--n-ctx",
        type=int,
        dest="max_model_len",
        help="requested context length",
    )
    lint.add_argument("--dtype", help="model dtype the rope tables are cast to (default: the config's)")
    lint.add_argument("--phase-dtype", help="dtype of p*inv_freq (default float32)")
    lint.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="engine env var, repeatable")
    lint.add_argument("--pairing", choices=("neox", "gptj"), help="pairing the deployment's kernels/weights use")
    lint.add_argument("--mrope-layout", choices=("chunked", "interleaved"), help="M-RoPE layout the deployment uses")
    lint.add_argument("--intent", metavar="FILE", help="JSON deployment intent; flags override its keys")
    lint.add_argument("--tokenizer-config", metavar="PATH", help="tokenizer_config.json (model_max_length)")
    lint.add_argument("--draft", metavar="PATH", help="speculative draft model: config.json or directory")
    lint.add_argument("--format", choices=("text", "json"), default="text")
    lint.add_argument("--fail-on", choices=SEVERITIES, default="error", help="exit 1 from this severity on")


def _env_pairs(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env: expected NAME=VALUE, got {item!r}")
        pairs[name] = value
    return pairs


def intent_from(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--intent`` file's keys, overridden by the flags given."""
    intent = read_json(args.intent, "an intent") if args.intent else {}
    flags = {
        "engines": args.engines,
        "max_model_len": args.max_model_len,
        "dtype": args.dtype,
        "phase_dtype": args.phase_dtype,
        "pairing": args.pairing,
        "mrope_layout": args.mrope_layout,
    }
    intent.update({key: value for key, value in flags.items() if value is not None})
    if args.env:
        intent["env"] = {**intent.get("env", {}), **_env_pairs(args.env)}
    return intent


def _model_files(path: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(config, tokenizer_config or None) of a config.json or a model directory."""
    folder = Path(path)
    if not folder.is_dir():
        return read_json(folder), None
    if not (folder / CONFIG_NAME).is_file():
        raise UsageError(f"{path}: directory has no {CONFIG_NAME}")
    tokenizer = folder / TOKENIZER_CONFIG_NAME
    return read_json(folder / CONFIG_NAME), read_json(tokenizer, "a tokenizer config") if tokenizer.is_file() else None


def _render_text(path: str, report: LintReport) -> str:
    model = report.raw.get("model") or {}
    lines = [f"{path}: {model.get('model_type') or 'unknown model_type'}"]
    for finding in report.findings:
        lines += ["  " + line for line in finding.lines()]
    for engine in report.engines:
        rows = engine.get("rope_cache_rows")
        lengths = f"derived {engine.get('derived_max_len')}, default {engine.get('default_max_len')}"
        cache = f"cache rows {rows if rows is not None else 'on demand'}"
        lines.append(f"  {engine.get('engine')}: {lengths}, {cache}, {engine.get('length_check')}")
    lines.append("  " + ", ".join(f"{report.count(severity)} {severity}" for severity in SEVERITIES))
    return "\n".join(lines)


def run_lint(args: argparse.Namespace) -> int:
    intent = intent_from(args)
    tokenizer_override = read_json(args.tokenizer_config, "a tokenizer config") if args.tokenizer_config else None
    draft = _model_files(args.draft)[0] if args.draft else None
    inputs = [(path, *_model_files(path)) for path in args.paths]
    with client_from(args) as client:
        reports = [
            (path, client.validate_config(config, intent=intent, tokenizer_config=tokenizer_override or tokenizer,
                                          draft_config=draft))
            for path, config, tokenizer in inputs
        ]  # fmt: skip
    if args.format == "json":
        print_json({"reports": [report.raw for _, report in reports]})
    else:
        print("\n\n".join(_render_text(path, report) for path, report in reports))
    return EXIT_FINDINGS if any(report.fails(args.fail_on) for _, report in reports) else EXIT_OK
