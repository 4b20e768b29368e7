"""Benchmark: CPU time of one ``POST /v1/config/validate`` body in process (the linter alone, no HTTP; issue #15).

    .venv/bin/python benchmarks/bench_lint_request.py [--repeats N] [--number N] [CONFIG.json ...]

For each config (default: the bench_small body and four corpus configs of other rope kinds) the best of
``--repeats`` runs of ``--number`` calls of ``validate_config_request({"config": ...})``, in microseconds of
process time: ``warm`` as a service sees a model it linted before (the cos/sin error table of
``lint.numerics`` is cached), ``cold`` with those caches emptied before every call (``forget_results``: a model seen
for the first time). The reference, measured in the same run, is what a JSON echo of the body does with it: serialise it
and parse it back (``json.dumps`` + ``json.loads``); the ratios compare the lint to it.
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ropeserve.lint import validate_config_request
from ropeserve.lint.numerics import forget_results

CONFIGS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "configs"
DEFAULT = (
    "Qwen__Qwen2.5-7B-Instruct.json",
    "meta-llama__Llama-3.1-8B-Instruct.json",
    "Qwen__Qwen3-VL-8B-Instruct.json",
    "microsoft__Phi-3-mini-128k-instruct.json",
    "deepseek-ai__DeepSeek-V3.json",
)


def cpu_us(call: Callable[[], Any], repeats: int, number: int) -> float:
    """Best per-call process time of ``call`` in microseconds."""
    call()
    return min(timeit.repeat(call, number=number, repeat=repeats, timer=time.process_time)) / number * 1e6


def cold(body: dict[str, Any]) -> Callable[[], Any]:
    def run() -> Any:
        forget_results()
        return validate_config_request(body)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", default=DEFAULT, help="file names under tests/fixtures/configs")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=300)
    args = parser.parse_args()
    print(f"{'config':<45} {'echo us':>8} {'warm us':>8} {'x echo':>7} {'cold us':>8} {'x echo':>7}")
    for name in args.configs:
        body = {"config": json.loads((CONFIGS / name).read_text(encoding="utf-8"))}
        echo = cpu_us(lambda body=body: json.loads(json.dumps(body)), args.repeats, args.number)
        warm = cpu_us(lambda body=body: validate_config_request(body), args.repeats, args.number)
        first = cpu_us(cold(body), args.repeats, max(1, args.number // 10))
        print(f"{name:<45} {echo:>8.1f} {warm:>8.1f} {warm / echo:>7.1f} {first:>8.1f} {first / echo:>7.1f}")


if __name__ == "__main__":
    main()
