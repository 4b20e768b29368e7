"""Benchmark: wall time of linting one config through the CLI in a fresh process (target <= 0.5 s).

Each command runs in a new interpreter, as a pre-commit hook or CI step would; the table reports the median and
the best of N runs, next to ``python -c pass`` (interpreter start) and ``python -c 'import torch'`` (what the lint
path must not pay).

    .venv/bin/python benchmarks/bench_lint.py [--repeats N] [--config PATH]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "tests" / "fixtures" / "configs" / "Qwen__Qwen3-VL-8B-Instruct.json"
TARGET_SECONDS = 0.5


def wall_times(command: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    args = parser.parse_args()
    lint = [sys.executable, "-m", "ropeserve.cli", "lint", str(args.config), "--max-model-len", "262144"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "ropeserve lint (1 config, text)": lint,
        "ropeserve lint (1 config, sarif)": [*lint, "--format", "sarif"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    }
    print(f"config: {args.config.name}; {args.repeats} fresh processes each; target for lint <= {TARGET_SECONDS} s")
    print(f"{'command':<36} {'median s':>9} {'best s':>8}")
    for name, command in commands.items():
        times = wall_times(command, args.repeats)
        print(f"{name:<36} {statistics.median(times):>9.3f} {min(times):>8.3f}")


if __name__ == "__main__":
    main()
