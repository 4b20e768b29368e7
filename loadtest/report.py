"""Turn the per-request samples of a load run into a report: JSON, Markdown and a PNG timeline.

Outcome classes: ``ok`` (2xx), ``rejected`` (429: back-pressure), ``client_error`` (other 4xx), ``server_error``
(5xx), ``transport`` (no HTTP answer), ``wrong`` (an answer its request's check refused: a verified answer that
differs from the quiet server's, a hostile request that was not refused) and ``refused`` (a hostile request's
expected 4xx problem). A run fails when it saw any 5xx, transport error or wrong answer; 429 counts as a failure
except in the overload scenario, where it is the expected answer (the report says whether any came).
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hostile import HOSTILE_PREFIX, WRONG

__all__ = [
    "Sample",
    "build_report",
    "latency_summary",
    "read_samples",
    "users_per_second",
    "write_markdown",
    "write_plot",
]

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class Sample:
    start: float
    name: str
    status: int
    ms: float
    size: int
    error: str
    server_ms: float | None = None
    """The server's time until its answer starts (``x-total-time``); the rest of ``ms`` is transfer and client."""
    queue_ms: float | None = None
    """Time in the server's batch queue (``x-queue-time``, rotations only)."""

    @property
    def outcome(self) -> str:
        if self.status == 0:
            return "transport"
        if self.status >= 500:
            return "server_error"
        if self.error.startswith(WRONG):
            return "wrong"
        if 200 <= self.status < 300:
            return "ok"
        if self.status == 429:
            return "rejected"
        return "refused" if self.name.startswith(HOSTILE_PREFIX) else "client_error"


def read_samples(path: Path) -> list[Sample]:
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [
        Sample(
            float(r["start"]),
            r["name"],
            int(r["status"]),
            float(r["ms"]),
            int(r["bytes"]),
            r["error"],
            _optional_float(r.get("server_ms")),
            _optional_float(r.get("queue_ms")),
        )
        for r in rows
    ]


def _optional_float(text: str | None) -> float | None:
    return float(text) if text else None


def users_per_second(samples: Iterable[Sequence[float]], seconds: int) -> list[int | None]:
    """Most users running in each of the first ``seconds`` seconds, from (seconds since load started, users)
    samples; None for a second without a sample."""
    peaks: dict[int, int] = {}
    for at, count in samples:
        second = math.floor(at)
        if 0 <= second < seconds:
            peaks[second] = max(peaks.get(second, 0), int(count))
    return [peaks.get(second) for second in range(seconds)]


def _median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return round(float(np.percentile(present, 50)), 3) if present else None


def latency_summary(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {f"p{p}_ms": None for p in PERCENTILES} | {"mean_ms": None, "max_ms": None}
    array = np.asarray(values, dtype=np.float64)
    stats: dict[str, float | None] = {f"p{p}_ms": round(float(np.percentile(array, p)), 3) for p in PERCENTILES}
    return stats | {"mean_ms": round(float(array.mean()), 3), "max_ms": round(float(array.max()), 3)}


def _probe_text(probes: dict[str, Any] | None) -> str:
    if not probes or not probes.get("probes"):
        return ""
    return (
        f"; liveness probes during the run: {probes['probes']}, {probes['failures']} failed, "
        f"p50 {probes['p50_ms']} ms, p99 {probes['p99_ms']} ms, max {probes['max_ms']} ms"
    )


def _group_summary(name: str, samples: Sequence[Sample], seconds: float) -> dict[str, Any]:
    outcomes = Counter(s.outcome for s in samples)
    ok_latencies = [s.ms for s in samples if s.outcome == "ok"]
    return {
        "name": name,
        "requests": len(samples),
        "rps": round(len(samples) / seconds, 2),
        "ok_rps": round(outcomes["ok"] / seconds, 2),
        "failures": len(samples) - outcomes["ok"] - outcomes["refused"],
        "outcomes": dict(outcomes),
        "mean_bytes": round(sum(s.size for s in samples) / len(samples)) if samples else 0,
        **latency_summary(ok_latencies),
        "server_p50_ms": _median([s.server_ms for s in samples if s.outcome == "ok"]),
        "queue_p50_ms": _median([s.queue_ms for s in samples if s.outcome == "ok"]),
    }


def _failure_types(samples: Iterable[Sample]) -> dict[str, int]:
    """Failures by type: ``429 overloaded``, ``HTTP 502``, ``transport: ConnectionRefusedError`` ..."""
    counts = Counter(s.error or f"HTTP {s.status}" for s in samples if s.outcome not in ("ok", "refused"))
    return dict(counts.most_common())


def _timeline(
    samples: Sequence[Sample], origin: float, users: Sequence[int | None], seconds: int
) -> list[dict[str, Any]]:
    """Per-second rows for the first ``seconds`` seconds (a last, partial second would read as a collapse)."""
    by_second: dict[int, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_second[int(sample.start - origin)].append(sample)
    rows = []
    for second in range(min(max(by_second, default=-1) + 1, seconds)):
        bucket = by_second.get(second, [])
        ok = [s.ms for s in bucket if s.outcome == "ok"]
        rows.append(
            {
                "t": second,
                "users": users[second] if second < len(users) else None,
                "rps": len(bucket),
                "ok_rps": len(ok),
                "rejected_rps": sum(1 for s in bucket if s.outcome == "rejected"),
                "error_rps": sum(1 for s in bucket if s.outcome in ("server_error", "transport", "client_error")),
                "p50_ms": round(float(np.percentile(ok, 50)), 3) if ok else None,
                "p95_ms": round(float(np.percentile(ok, 95)), 3) if ok else None,
            }
        )
    return rows


def _drift(timeline: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """p95 and throughput of the first and last fifth of the run (soak: does it degrade?)."""
    fifth = max(1, len(timeline) // 5)
    first, last = timeline[:fifth], timeline[-fifth:]

    def mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
        values = [row[key] for row in rows if row[key] is not None]
        return round(sum(values) / len(values), 3) if values else None

    return {
        "first_fifth": {"p95_ms": mean(first, "p95_ms"), "ok_rps": mean(first, "ok_rps")},
        "last_fifth": {"p95_ms": mean(last, "p95_ms"), "ok_rps": mean(last, "ok_rps")},
    }


def build_report(
    samples: Sequence[Sample],
    *,
    run: dict[str, Any],
    users: Sequence[int | None],
    expects_rejections: bool,
    skipped: Sequence[str] = (),
    load_started: float | None = None,
) -> dict[str, Any]:
    """The report dict (``run`` holds the scenario settings and environment; ``users`` the users that ran, per
    second). Times count from ``load_started`` (default: the first request's start)."""
    origin = min((s.start for s in samples), default=0.0) if load_started is None else load_started
    end = max((s.start + s.ms / 1000 for s in samples), default=origin)
    seconds = max(end - origin, 1e-9)
    names = sorted({s.name for s in samples})
    outcomes = Counter(s.outcome for s in samples)
    timeline = _timeline(samples, origin, users, max(1, math.ceil(float(run["duration_s"]))))
    failed_by = [key for key in ("server_error", "transport", "wrong") if outcomes[key]]
    if not expects_rejections and outcomes["rejected"]:
        failed_by.append("rejected")
    return {
        "run": run,
        "measured_s": round(seconds, 2),
        "totals": _group_summary("all", samples, seconds),
        "status_counts": {str(k): v for k, v in sorted(Counter(s.status for s in samples).items())},
        "server_errors_5xx": outcomes["server_error"],
        "transport_errors": outcomes["transport"],
        "rejected_429": outcomes["rejected"],
        "wrong_answers": outcomes["wrong"],
        "expected_refusals": outcomes["refused"],
        "failures_by_type": _failure_types(samples),
        "endpoints": [_group_summary(n, [s for s in samples if s.name == n], seconds) for n in names],
        "skipped_requests": list(skipped),
        "checks": {
            "passed": not failed_by,
            "failed_by": failed_by,
            "expects_429": expects_rejections,
            "saw_429": outcomes["rejected"] > 0,
        },
        "drift": _drift(timeline),
        "timeline": timeline,
    }


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return str(value)


def write_markdown(report: dict[str, Any], path: Path) -> None:
    run, totals, checks = report["run"], report["totals"], report["checks"]
    machine, server = run["machine"], run["server"]
    lines = [
        f"# ropeserve load run: {run['scenario']}",
        "",
        f"{run['users']} users, {run['duration_s']} s against {run['target']} ({run['replicas']} replica(s)); "
        f"{machine['cpus']} CPUs (1-min load average {machine.get('load_avg_1m_before', '?')} before the run), "
        f"server {server.get('version', '?')} on {server.get('device', '?')}, started {run['started']}.",
        "",
        f"**{totals['requests']} requests, {totals['rps']:.1f} req/s ({totals['ok_rps']:.1f} ok/s)**; "
        f"latency of successful requests p50 {_cell(totals['p50_ms'])} ms, p95 {_cell(totals['p95_ms'])} ms, "
        f"p99 {_cell(totals['p99_ms'])} ms. 5xx: {report['server_errors_5xx']}, transport errors: "
        f"{report['transport_errors']}, 429: {report['rejected_429']}"
        + (" (expected in this scenario)" if checks["expects_429"] else "")
        + f", wrong answers: {report['wrong_answers']}, hostile requests refused: {report['expected_refusals']}"
        + _probe_text(run.get("probe_latency_ms"))
        + f". **Checks {'passed' if checks['passed'] else 'FAILED: ' + ', '.join(checks['failed_by'])}.**",
        "",
        "| request | requests | req/s | p50 ms | p95 ms | p99 ms | max ms | server p50 ms | failures | mean bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["endpoints"]:
        cells = [row["name"], row["requests"], row["rps"], row["p50_ms"], row["p95_ms"], row["p99_ms"]]
        cells += [row["max_ms"], row["server_p50_ms"], row["failures"], row["mean_bytes"]]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if checks["expects_429"] and not checks["saw_429"]:
        lines += ["", "No 429 came: the server queued every request instead of shedding load (latency shows it)."]
    lines += ["", "server p50: the server's time until its answer starts (`x-total-time`); the rest is spent in",
              "sockets, the body transfer, the client and waiting to be accepted."]  # fmt: skip
    lines += ["", "Failures by type:", ""]
    lines += [f"- `{kind}`: {count}" for kind, count in report["failures_by_type"].items()] or ["- none"]
    if report["skipped_requests"]:
        lines += ["", "Left out of the mix (endpoint not on this server): " + ", ".join(report["skipped_requests"])]
    drift = report["drift"]
    lines += [
        "",
        f"Drift: p95 {_cell(drift['first_fifth']['p95_ms'])} → {_cell(drift['last_fifth']['p95_ms'])} ms, "
        f"ok/s {_cell(drift['first_fifth']['ok_rps'])} → {_cell(drift['last_fifth']['ok_rps'])} "
        "(first vs last fifth of the run).",
    ]
    if run.get("server_rss_mb"):
        rss = run["server_rss_mb"]
        lines.append(f"Server RSS: {rss['start']} → {rss['end']} MB (max {rss['max']} MB).")
    lines += ["", "![latency and throughput over time](timeline.png)", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def write_plot(report: dict[str, Any], path: Path) -> None:
    """Two panels over time: latency p50/p95 (log scale) and throughput (ok, 429, errors) with active users."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    timeline = report["timeline"]
    t = [row["t"] for row in timeline]
    figure, (latency, throughput) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, constrained_layout=True)
    run = report["run"]
    figure.suptitle(f"ropeserve {run['scenario']}: {run['users']} users, {run['replicas']} replica(s)")
    for key, style in (("p50_ms", "-"), ("p95_ms", "--")):
        values = [row[key] if row[key] is not None else math.nan for row in timeline]
        latency.plot(t, values, style, label=key.replace("_ms", ""))
    latency.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    latency.yaxis.set_major_formatter(plain)
    latency.yaxis.set_minor_formatter(plain)
    latency.set_ylabel("latency of ok requests (ms)")
    latency.grid(True, which="both", alpha=0.3)
    latency.legend(loc="upper left")
    throughput.stackplot(
        t,
        [row["ok_rps"] for row in timeline],
        [row["rejected_rps"] for row in timeline],
        [row["error_rps"] for row in timeline],
        labels=["ok", "429", "errors"],
        colors=["tab:green", "tab:orange", "tab:red"],
        alpha=0.8,
    )
    throughput.set_ylabel("requests / s")
    throughput.set_xlabel("seconds")
    throughput.grid(True, alpha=0.3)
    users_axis = throughput.twinx()
    users_axis.step(t, [row["users"] or 0 for row in timeline], where="post", color="black", label="users running")
    users_axis.set_ylabel("users running (sampled)")
    users_axis.set_ylim(bottom=0)
    users_axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = throughput.get_legend_handles_labels()
    user_handles, user_labels = users_axis.get_legend_handles_labels()
    throughput.legend(handles + user_handles, labels + user_labels, loc="upper left")
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_all(report: dict[str, Any], out: Path) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    write_markdown(report, out / "report.md")
    write_plot(report, out / "timeline.png")
