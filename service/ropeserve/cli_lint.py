"""``ropeserve lint`` and ``ropeserve explain`` (torch-free; also runnable as ``python -m ropeserve.cli_lint``).

Exit codes of ``lint``: 0 no finding at or above ``--fail-on``, 1 such findings, 2 usage or input error
(unreadable file, invalid JSON, bad flag value: one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ropeserve.errors import InvalidInput
from ropeserve.lint.catalogue import rule_table_markdown
from ropeserve.lint.explain import explain
from ropeserve.lint.findings import Severity
from ropeserve.lint.intent import MROPE_LAYOUTS, PAIRINGS, DeploymentIntent
from ropeserve.lint.linter import lint_config
from ropeserve.lint.loader import JsonFile, read_json, read_model
from ropeserve.lint.report import Artifact, LintReport, sarif_log

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def add_lint_commands(subparsers: Any) -> None:
    """Register ``lint`` and ``explain`` on an argparse subparsers object (each sets ``func(args) -> int``)."""
    lint = subparsers.add_parser("lint", help="lint config.json files against a deployment intent")
    lint.add_argument("paths", nargs="*", metavar="PATH", help="config.json or a model directory")
    _add_intent_arguments(lint)
    lint.add_argument("--tokenizer-config", metavar="PATH", help="tokenizer_config.json (model_max_length)")
    lint.add_argument("--draft", metavar="PATH", help="speculative draft model: config.json or directory")
    lint.add_argument("--format", choices=("text", "json", "sarif"), default="text")
    lint.add_argument("--fail-on", choices=("error", "warning", "info"), default="error")
    lint.add_argument("--list-rules", action="store_true", help="print the rule catalogue (Markdown) and exit")
    lint.set_defaults(func=run_lint)

    explain_parser = subparsers.add_parser("explain", help="per-band RoPE wavelengths vs the trained context")
    explain_parser.add_argument("path", metavar="CONFIG", help="config.json or a model directory")
    explain_parser.add_argument(
        "--max-model-len", "--context-length", "--n-ctx", type=int, dest="max_model_len", metavar="N"
    )
    explain_parser.add_argument("--layer-type", help="RoPE layer type (default: full_attention)")
    explain_parser.add_argument("--format", choices=("text", "json"), default="text")
    explain_parser.add_argument("--plot", metavar="OUT.png", help="also write a wavelength plot (needs matplotlib)")
    explain_parser.set_defaults(func=run_explain)


def _add_intent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        action="append",
        dest="engines",
        metavar="ENGINE[SPEC]",
        help="target engine, repeatable: transformers, vllm, sglang, tgi, llama.cpp; e.g. vllm==0.9.1, 'vllm>=0.10'",
    )
    parser.add_argument(
        "--max-model-len",
        "--context-length",
        "--n-ctx",
        type=int,
        dest="max_model_len",
        metavar="N",
        help="requested context length",
    )
    parser.add_argument("--dtype", help="model dtype the rope tables are cast to (default: the config's)")
    parser.add_argument("--phase-dtype", help="dtype of p*inv_freq (default float32)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="engine env var, repeatable")
    parser.add_argument(
        "--disable-sliding-window",
        action="store_true",
        default=None,
        help="the deployment passes vLLM --disable-sliding-window (vLLM caps the length at the window)",
    )
    parser.add_argument("--pairing", choices=PAIRINGS, help="pairing the deployment's kernels/weights use")
    parser.add_argument("--mrope-layout", choices=MROPE_LAYOUTS, help="M-RoPE layout the deployment applies")
    parser.add_argument("--intent", metavar="FILE", help="JSON deployment intent; flags override its keys")


def intent_from_args(args: argparse.Namespace, intent_file: JsonFile | None = None) -> DeploymentIntent:
    """The deployment intent: the ``--intent`` file's keys, overridden by the flags given on the command line."""
    data: dict[str, Any] = dict(intent_file.data) if intent_file else {}
    flags = {
        "engines": args.engines,
        "max_model_len": args.max_model_len,
        "dtype": args.dtype,
        "phase_dtype": args.phase_dtype,
        "pairing": args.pairing,
        "mrope_layout": args.mrope_layout,
        "disable_sliding_window": args.disable_sliding_window,
    }
    data.update({key: value for key, value in flags.items() if value is not None})
    if args.env:
        given = data.get("env") or {}
        if not isinstance(given, dict):
            raise InvalidInput("env must be an object of NAME: value", field="intent/env")
        data["env"] = {**given, **dict(_env_pair(item) for item in args.env)}
    return DeploymentIntent.from_mapping(data, "intent")


def _env_pair(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise InvalidInput(f"expected NAME=VALUE, got {item!r}", field="--env")
    return name, value


def run_lint(args: argparse.Namespace) -> int:
    if args.list_rules:
        print(rule_table_markdown())
        return EXIT_CLEAN
    if not args.paths:
        return _fail("lint needs at least one PATH (or --list-rules)")
    try:
        intent_file = read_json(args.intent) if args.intent else None
        intent = intent_from_args(args, intent_file)
        reports = [_lint_path(path, intent, intent_file, args) for path in args.paths]
    except InvalidInput as error:
        return _fail(_one_line(error))
    print(_render(reports, args.format))
    threshold = Severity.parse(args.fail_on)
    return EXIT_FINDINGS if any(report.fails(threshold) for report in reports) else EXIT_CLEAN


def _lint_path(
    path: str, intent: DeploymentIntent, intent_file: JsonFile | None, args: argparse.Namespace
) -> LintReport:
    model = read_model(path)
    tokenizer = read_json(args.tokenizer_config) if args.tokenizer_config else model.tokenizer_config
    draft = read_model(args.draft).config if args.draft else None
    report = lint_config(
        model.config.data,
        intent,
        tokenizer_config=tokenizer.data if tokenizer else None,
        draft_config=draft.data if draft else None,
    )
    artifacts = {"config": Artifact(model.config.path, model.config.text)}
    if tokenizer is not None:
        artifacts["tokenizer_config"] = Artifact(tokenizer.path, tokenizer.text)
    if draft is not None:
        artifacts["draft_config"] = Artifact(draft.path, draft.text)
    if intent_file is not None:
        artifacts["intent"] = Artifact(intent_file.path, intent_file.text)
    return report.located(artifacts)


def _render(reports: Sequence[LintReport], output: str) -> str:
    if output == "sarif":
        return json.dumps(sarif_log(reports), indent=2)
    if output == "json":
        return json.dumps({"reports": [report.as_dict() for report in reports]}, indent=2)
    return "\n\n".join(report.to_text() for report in reports)


def run_explain(args: argparse.Namespace) -> int:
    try:
        config = read_model(args.path).config.data
        report = explain(config, DeploymentIntent(max_model_len=args.max_model_len), layer_type=args.layer_type)
    except InvalidInput as error:
        return _fail(_one_line(error))
    if args.plot:
        from ropeserve.lint.plot import PlotUnavailable

        try:
            report.plot(args.plot)
        except (PlotUnavailable, OSError) as error:
            return _fail(str(error))
    print(report.to_json() if args.format == "json" else report.to_text())
    return EXIT_CLEAN


def _one_line(error: InvalidInput) -> str:
    where = f"{error.field}: " if error.field else ""
    return f"{where}{error.detail}".replace("\n", " ")


def _fail(message: str) -> int:
    print(f"ropeserve: error: {message}", file=sys.stderr)
    return EXIT_USAGE
