#!/usr/bin/env python3
"""Bounded soak: mixed valid and hostile load on a server this command starts, judged on failures, wrong answers,
server RSS growth and liveness-probe latency.

    .venv/bin/python loadtest/soak.py --minutes 10                 # the full soak (docs/robustness.md)
    .venv/bin/python loadtest/soak.py --seconds 25 --users 4       # the short version the test suite runs

Runs ``run.py --start-server --scenario soak`` while sampling the server's RSS once a second. The soak mix adds
to the normal one hostile requests that must get a 4xx problem (``hostile.py``) and same-size rotations and tables
whose answers must equal a quiet server's, byte for byte; ``run.py`` probes ``/health/live`` every 100 ms. RSS
growth is the median of the last fifth of the run minus the median of the fifth after warm-up (a fifth of the run,
at most 60 s). Writes ``soak.json`` and ``soak.md`` next to the load report in ``--out``. Exit status: 0 no
failures (5xx, transport errors, 429, wrong answers, failed probes), growth within ``--max-rss-growth-mb`` and probe
p99 within ``--max-probe-p99-ms``; 1 otherwise; 2 usage error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import run

WARM_UP_FRACTION, WARM_UP_MAX_S, WINDOW_FRACTION = 0.2, 60.0, 0.2


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="soak length in minutes (default 10)")
    length.add_argument("--seconds", type=float, help="soak length in seconds")
    parser.add_argument("--users", type=int, default=8, help="concurrent users (default 8: moderate)")
    parser.add_argument("--max-rss-growth-mb", type=float, default=50.0)
    parser.add_argument("--max-probe-p99-ms", type=float, default=100.0, help="liveness probe p99 bound (default 100)")
    parser.add_argument("--out", type=Path, help="report directory (default .loadtest/soak-<time>)")
    args = parser.parse_args(argv)
    args.duration = args.seconds if args.seconds is not None else 60 * (args.minutes or 10)
    return args


def rss_growth(samples: Sequence[float], duration_s: float) -> dict[str, Any]:
    """Server RSS figures (MB, one sample a second). Growth compares medians, so per-request buffers that come
    and go do not count: the last fifth of the run against the fifth right after warm-up."""
    if not samples:
        return {"samples": 0, "growth_mb": None}
    start_up = max(0, len(samples) - int(duration_s))  # samples before the load began (server start-up)
    window = max(3, int(duration_s * WINDOW_FRACTION))
    warm = min(len(samples) - window, start_up + int(min(duration_s * WARM_UP_FRACTION, WARM_UP_MAX_S)))
    after_warm_up = statistics.median(samples[max(0, warm) : max(0, warm) + window])
    final = statistics.median(samples[-window:])
    return {
        "samples": len(samples),
        "start_mb": samples[0],
        "after_warm_up_median_mb": after_warm_up,
        "final_median_mb": final,
        "peak_mb": max(samples),
        "growth_mb": round(final - after_warm_up, 1),
        "series_mb": list(samples),
    }


def verdict(load: dict[str, Any], rss: dict[str, Any], max_growth_mb: float, max_probe_p99_ms: float) -> dict[str, Any]:
    failures = load["server_errors_5xx"] + load["transport_errors"] + load["rejected_429"] + load["wrong_answers"]
    growth, probes = rss["growth_mb"], load["run"]["probe_latency_ms"]
    probes_ok = probes["failures"] == 0 and probes["p99_ms"] is not None and probes["p99_ms"] <= max_probe_p99_ms
    return {
        "requests": load["totals"]["requests"],
        "failures": failures,
        "wrong_answers": load["wrong_answers"],
        "hostile_refused": load["expected_refusals"],
        "rss": rss,
        "max_rss_growth_mb": max_growth_mb,
        "probes": probes,
        "max_probe_p99_ms": max_probe_p99_ms,
        "passed": failures == 0
        and growth is not None
        and growth <= max_growth_mb
        and probes_ok
        and load["checks"]["passed"],
    }


def write_reports(summary: dict[str, Any], out: Path) -> None:
    (out / "soak.json").write_text(json.dumps(summary, indent=2) + "\n")
    rss, probes = summary["rss"], summary["probes"]
    (out / "soak.md").write_text(
        f"# ropeserve soak ({summary['duration_s']:.0f} s, {summary['users']} users)\n\n"
        f"**{'PASSED' if summary['passed'] else 'FAILED'}**: {summary['requests']} requests, "
        f"{summary['failures']} failures (5xx, transport errors, 429, wrong answers: {summary['wrong_answers']}), "
        f"{summary['hostile_refused']} hostile requests refused with a 4xx problem; liveness probes "
        f"{probes['probes']} ({probes['failures']} failed), p99 {probes['p99_ms']} ms (limit "
        f"{summary['max_probe_p99_ms']} ms); server RSS {rss.get('start_mb')} MB at start, "
        f"median {rss.get('after_warm_up_median_mb')} MB after warm-up and {rss.get('final_median_mb')} MB at the end "
        f"(peak {rss.get('peak_mb')} MB): "
        f"growth {rss['growth_mb']} MB (limit {summary['max_rss_growth_mb']} MB). Load report: report.md.\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or run.ROOT / ".loadtest" / f"soak-{started}"
    load_argv = ["--start-server", "--scenario", "soak", "--users", str(args.users)]
    load_argv += ["--duration", str(args.duration), "--out", str(out)]
    sampler = run.RssSampler()
    sampler.start()
    try:
        status = run.main(load_argv)
    finally:
        sampler.done.set()
    if status == run.EXIT_USAGE or not (out / "report.json").exists():
        print(f"soak: the load run did not complete (exit {status}); see {out}", file=sys.stderr)
        return status or run.EXIT_FAILED
    load = json.loads((out / "report.json").read_text())
    summary = {"duration_s": args.duration, "users": args.users}
    summary |= verdict(load, rss_growth(sampler.values, args.duration), args.max_rss_growth_mb, args.max_probe_p99_ms)
    write_reports(summary, out)
    figures = {key: value for key, value in summary["rss"].items() if key != "series_mb"}
    figures |= {"wrong_answers": summary["wrong_answers"], "probe_p99_ms": summary["probes"]["p99_ms"]}
    print(f"soak: {'passed' if summary['passed'] else 'FAILED'}; {json.dumps(figures)}; report in {out}")
    return run.EXIT_OK if summary["passed"] else run.EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
