#!/usr/bin/env python3
"""Run one bounded, headless load scenario against ropeserve on loopback and write its report.

    python loadtest/run.py --start-server --scenario steady --users 8 --duration 20 --out .loadtest/steady
    python loadtest/run.py --url http://127.0.0.1:8000 --scenario spike --users 32 --duration 60
    python loadtest/run.py --replicas 2 --scenario steady --users 16 --duration 30   # nginx + 2 replicas

The target is an already running server (``--url``, loopback only), one this command starts (``--start-server``),
or N replicas behind nginx from ``deploy/replicas.py`` (``--replicas N``; compare 1 vs N with two runs).
``--server-env KEY=VALUE`` configures started servers (e.g. ``ROPESERVE_BATCH_QUEUE_SIZE=8`` for overload).

Writes ``report.json``, ``report.md``, ``timeline.png``, the raw ``samples.csv`` and ``locust.log`` to ``--out``.
Exit status: 0 checks passed; 1 the run saw a 5xx or transport error (or a 429 outside the overload scenario),
or locust failed; 2 usage error or no server.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from report import build_report, latency_summary, read_samples, users_per_second, write_all  # noqa: E402
from scenarios import MAX_USERS, SCENARIOS  # noqa: E402

__all__ = ["main"]

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
REPLICAS_DEMO = ROOT / "deploy" / "replicas.py"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
LOCUST_OVERHEAD_S = 90
"""Start-up (imports, payloads) and stop allowance on top of the scenario's duration before locust is killed."""
PROBE_INTERVAL_S, PROBE_TIMEOUT_S = 0.1, 1.0
"""Liveness probes during the run: one every 100 ms, each on a new connection, failed after 1 s."""


class UsageError(Exception):
    pass


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server on loopback, e.g. http://127.0.0.1:8000")
    target.add_argument("--start-server", action="store_true", help="start one local server for the run")
    target.add_argument("--replicas", type=int, help="start N replicas behind nginx (deploy/replicas.py)")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="steady")
    parser.add_argument("--users", type=int, default=8, help=f"peak concurrent users (1..{MAX_USERS})")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds (bounded per scenario)")
    parser.add_argument("--out", type=Path, help="report directory (default .loadtest/<scenario>-<time>)")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE", help="for started servers")
    args = parser.parse_args(argv)
    scenario = SCENARIOS[args.scenario]
    if not 1 <= args.users <= MAX_USERS:
        parser.error(f"--users must be within 1..{MAX_USERS}")
    if not 1 <= args.duration <= scenario.max_duration_s:
        parser.error(f"--duration for {scenario.name} must be within 1..{scenario.max_duration_s} s")
    if args.replicas is not None and args.replicas < 1:
        parser.error("--replicas must be at least 1")
    if args.server_env and args.url:
        parser.error("--server-env configures servers this command starts; it cannot change --url's")
    return args


def check_loopback(url: str) -> str:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host not in LOOPBACK_HOSTS:
        raise UsageError(f"{url}: the load kit only targets loopback ({', '.join(sorted(LOOPBACK_HOSTS))})")
    return url.rstrip("/")


def server_env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith("ROPESERVE_") and key != "OMP_NUM_THREADS":
            raise UsageError(f"--server-env {pair!r}: expected ROPESERVE_NAME=VALUE")
        env[key] = value
    return env


def _load_replicas_demo() -> Any:
    if not REPLICAS_DEMO.is_file():
        raise UsageError(f"--replicas needs the multi-replica demo at {REPLICAS_DEMO.relative_to(ROOT)}")
    spec = importlib.util.spec_from_file_location("ropeserve_replicas_demo", REPLICAS_DEMO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def target(args: argparse.Namespace) -> Iterator[str]:
    """The URL to load: given, or of servers started (and stopped) here."""
    if args.url:
        yield check_loopback(args.url)
        return
    env = server_env(args.server_env)
    if args.start_server:
        from ropeserve_client.testing import LocalServer

        with LocalServer(env=env, startup_timeout=120.0) as server:
            yield server.url
        return
    demo = _load_replicas_demo()
    saved = dict(os.environ)
    os.environ.update(env)  # the demo passes ROPESERVE_* through to its replicas
    try:
        with demo.replicas(args.replicas, 0) as cluster:
            yield cluster.url
    finally:
        os.environ.clear()
        os.environ.update(saved)


def server_info(url: str) -> dict[str, Any]:
    try:
        answer = httpx.get(f"{url}/health/ready", timeout=10)
        if answer.status_code != 200:
            raise UsageError(f"{url} is not ready ({answer.status_code})")
        info = httpx.get(f"{url}/v1/info", timeout=10).json()
    except httpx.HTTPError as error:
        raise UsageError(f"no ropeserve at {url}: {error}") from error
    return {key: info.get(key) for key in ("version", "device", "kernel", "batching", "limits")}


class RssSampler(threading.Thread):
    """Total resident memory (MB) of this process's ropeserve children, once a second."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.values: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            total = sum(_rss_kb(pid) for pid in _server_children())
            if total:
                self.values.append(round(total / 1024, 1))

    def summary(self) -> dict[str, float] | None:
        if not self.values:
            return None
        return {"start": self.values[0], "end": self.values[-1], "max": max(self.values)}


class ProbeSampler(threading.Thread):
    """Latency of ``GET /health/live`` on a fresh connection every ``PROBE_INTERVAL_S``, as an orchestrator's
    liveness probe sees it while the load runs (one that fails or takes over ``PROBE_TIMEOUT_S`` counts as failed)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.latencies_ms: list[float] = []
        self.failures = 0
        self.done = threading.Event()

    def probe(self) -> float | None:
        """One probe's latency in ms (None when it failed)."""
        started = time.perf_counter()
        connection = http.client.HTTPConnection(self.host, self.port, timeout=PROBE_TIMEOUT_S)
        try:
            connection.request("GET", "/health/live")
            answer = connection.getresponse()
            answer.read()
            return (time.perf_counter() - started) * 1000 if answer.status == 200 else None
        except OSError:
            return None
        finally:
            connection.close()

    def run(self) -> None:
        while not self.done.wait(PROBE_INTERVAL_S):
            latency = self.probe()
            if latency is None:
                self.failures += 1
            else:
                self.latencies_ms.append(latency)

    def summary(self) -> dict[str, Any]:
        return {"probes": len(self.latencies_ms) + self.failures, "failures": self.failures} | latency_summary(
            self.latencies_ms
        )


def _server_children() -> list[int]:
    me, pids = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
            if int(fields[1]) == me and (b"ropeserve.api" in cmdline or b"ropeserve.cli" in cmdline):
                pids.append(int(stat.parent.name))
    return pids


def _rss_kb(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def run_locust(url: str, args: argparse.Namespace, out: Path) -> int:
    """Run locust headless; its shape class bounds users and time, a timeout bounds the process."""
    env = {
        **os.environ,
        "ROPESERVE_LOADTEST_SCENARIO": args.scenario,
        "ROPESERVE_LOADTEST_USERS": str(args.users),
        "ROPESERVE_LOADTEST_DURATION": str(args.duration),
        "ROPESERVE_LOADTEST_SAMPLES": str(out / "samples.csv"),
    }
    command = [
        sys.executable, "-m", "locust", "-f", str(HERE / "locustfile.py"), "--headless", "--host", url,
        "--stop-timeout", "5", "--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "0",
    ]  # fmt: skip
    hard_limit = args.duration + LOCUST_OVERHEAD_S
    with (out / "locust.log").open("wb") as log:
        try:
            completed = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=hard_limit)
        except subprocess.TimeoutExpired:
            return 124
    return completed.returncode


def run_description(args: argparse.Namespace, url: str, info: dict[str, Any], started: str) -> dict[str, Any]:
    return {
        "scenario": args.scenario,
        "description": SCENARIOS[args.scenario].description,
        "users": args.users,
        "duration_s": args.duration,
        "target": url,
        "replicas": args.replicas or 1,
        "server_env": args.server_env,
        "started": started,
        "server": info,
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m_before": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }


def execute(args: argparse.Namespace) -> int:
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = args.out or ROOT / ".loadtest" / f"{args.scenario}-{started.replace(':', '')}"
    out.mkdir(parents=True, exist_ok=True)
    with target(args) as url:
        info = server_info(url)
        sampler, probes = RssSampler(), ProbeSampler(url)
        sampler.start()
        probes.start()
        began = time.monotonic()
        status = run_locust(url, args, out)
        sampler.done.set()
        probes.done.set()
        wall = time.monotonic() - began
    samples_path = out / "samples.csv"
    if status != 0 or not samples_path.exists():
        print(f"locust failed (exit {status}); see {out / 'locust.log'}", file=sys.stderr)
        return EXIT_FAILED
    run = run_description(args, url, info, started) | {
        "wall_s": round(wall, 1),
        "server_rss_mb": sampler.summary(),
        "probe_latency_ms": probes.summary(),
    }
    meta = json.loads(Path(str(samples_path) + ".meta.json").read_text())
    report = build_report(
        read_samples(samples_path),
        run=run,
        users=users_per_second(meta["users"], math.ceil(args.duration)),
        expects_rejections=SCENARIOS[args.scenario].expects_rejections,
        skipped=meta["skipped"],
        load_started=meta["load_started"],
    )
    write_all(report, out)
    totals, checks = report["totals"], report["checks"]
    print(
        f"{args.scenario}: {totals['requests']} requests, {totals['rps']:.1f} req/s, p50 {totals['p50_ms']} ms, "
        f"p95 {totals['p95_ms']} ms, p99 {totals['p99_ms']} ms; 5xx {report['server_errors_5xx']}, "
        f"429 {report['rejected_429']}; checks {'passed' if checks['passed'] else 'FAILED'}; report in {out}"
    )
    return EXIT_OK if checks["passed"] else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return execute(args)
    except (UsageError, RuntimeError, TimeoutError) as error:
        print(f"loadtest: error: {error}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
