"""Helpers for tests with real processes on loopback: ``ropeserve serve`` under uvicorn, Prometheus, nginx.

Tools from Debian packages (prometheus, promtool, nginx) come from ``scripts/system-deps``; a test that
needs a missing one skips with the reason, or fails under CI=true, where they must be installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COS_SIN = "/v1/rope/cos-sin"
COS_SIN_BODY = {"rope": {"rope_type": "default", "rope_theta": 10000.0, "head_dim": 8}, "positions": [1, 2, 3]}
STARTUP_TIMEOUT_S = 60.0


def find_tool(name: str) -> str:
    """Path of a Debian-packaged tool; skip (fail under CI) when it is not installed."""
    candidates = (shutil.which(name), f"/usr/bin/{name}", f"/usr/sbin/{name}")
    found = next((path for path in candidates if path and os.access(path, os.X_OK)), None)
    if found:
        return found
    reason = f"{name} is not installed: run scripts/system-deps as root (Debian packages prometheus, nginx)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def server_env(**overrides: str) -> dict[str, str]:
    """This environment without inherited ROPESERVE_* settings: loopback, CPU, one torch thread."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ROPESERVE_")}
    env.update(ROPESERVE_HOST="127.0.0.1", ROPESERVE_DEVICE="cpu", OMP_NUM_THREADS="1")
    env.update(overrides)
    return env


@contextmanager
def running_server(workdir: Path, **overrides: str) -> Iterator[Server]:
    """``ropeserve serve`` as a child process, yielded once /health/ready answers 200."""
    port = free_port()
    log = workdir / f"ropeserve-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ropeserve.cli", "serve"],
            env=server_env(ROPESERVE_PORT=str(port), **overrides),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(proc, port, log)
    try:
        wait_until(lambda: proc.poll() is not None or answers(server.url + "/health/ready"), STARTUP_TIMEOUT_S, "ready")
        assert proc.poll() is None, f"ropeserve exited with {proc.returncode}:\n{server.log_text()}"
        yield server
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def deployment_queries() -> dict[str, str]:
    """Every PromQL expression the repository ships: dashboard, alerts, autoscaling rules."""
    dashboard = json.loads((REPO / "deploy/grafana/dashboards/ropeserve.json").read_text())
    queries = {f"dashboard: {p['title']}": t["expr"] for p in dashboard["panels"] for t in p["targets"]}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries[f"dashboard variable {variable['name']}"] = variable["definition"]
    alerts = yaml.safe_load((REPO / "deploy/prometheus/alerts.yml").read_text())
    queries.update({f"alert {r['alert']}": r["expr"] for g in alerts["groups"] for r in g["rules"]})
    component = REPO / "deploy/k8s/components/prometheus"
    adapter = yaml.safe_load((component / "prometheus-adapter-values.yaml").read_text())
    queries.update({f"adapter rule {i}": r["seriesQuery"] for i, r in enumerate(adapter["rules"]["custom"])})
    hpa_patch = yaml.safe_load((component / "hpa-load-gauges.yaml").read_text())
    queries.update({f"hpa metric {i}": op["value"]["pods"]["metric"]["name"] for i, op in enumerate(hpa_patch)})
    return queries
