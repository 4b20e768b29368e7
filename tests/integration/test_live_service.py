"""A real ``ropeserve serve`` (uvicorn) on loopback: /metrics conventions, access logs, request ids, health check."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime

import httpx
import pytest
from integration_support import COS_SIN, COS_SIN_BODY, REPO, Server, deployment_queries, free_port, wait_until

METRIC_NAME = re.compile(r"\bropeserve_[a-zA-Z0-9_]+")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}


def exposed_names(page: str) -> set[str]:
    """Sample names a scrape of ``page`` yields, including families that have no sample yet."""
    names: set[str] = set()
    for line in page.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.update(name + suffix for suffix in SUFFIXES.get(kind, ("",)))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


@pytest.fixture(scope="module")
def metrics_page(live_server: Server) -> str:
    with httpx.Client(base_url=live_server.url, timeout=10) as client:
        assert client.post(COS_SIN, json=COS_SIN_BODY).status_code == 200
        assert client.get("/no-such-route").status_code == 404
        assert client.post(COS_SIN, content=b"{not json", headers={"content-type": "application/json"}).status_code
        return client.get("/metrics").text


@pytest.mark.deploy
def test_promtool_accepts_the_live_metrics_page(metrics_page: str, tool) -> None:
    result = subprocess.run(
        [tool("promtool"), "check", "metrics"], input=metrics_page, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_metric_names_follow_conventions(metrics_page: str) -> None:
    types = dict(line.split()[2:4] for line in metrics_page.splitlines() if line.startswith("# TYPE "))
    assert types, metrics_page
    assert {"process_resident_memory_bytes", "process_open_fds", "python_info"} <= types.keys()
    for name, kind in types.items():
        if name.startswith(("process_", "python_")):
            continue  # prometheus_client's runtime collectors, named by its conventions
        assert name.startswith("ropeserve_"), name
        assert name.endswith("_total") == (kind == "counter"), f"{name} ({kind}): only counters end in _total"
        assert not re.search(r"_(milliseconds|microseconds|ms|us|bytes_total_bytes)$", name), f"{name}: base units"
    assert "ropeserve_http_request_duration_seconds" in types
    assert 'ropeserve_http_errors_total{error_type="not-found",status="404"}' in metrics_page


def test_every_shipped_query_names_an_exposed_metric(metrics_page: str) -> None:
    exposed = exposed_names(metrics_page)
    for where, query in deployment_queries().items():
        names = set(METRIC_NAME.findall(query))
        assert names or query.startswith("up{"), f"{where}: no ropeserve metric in {query!r}"
        assert names <= exposed, f"{where}: {sorted(names - exposed)} not on /metrics"


def test_access_log_is_one_json_object_per_request(live_server: Server) -> None:
    request_id = "integration-log-check-1"
    response = httpx.post(live_server.url + COS_SIN, json=COS_SIN_BODY, headers={"X-Request-ID": request_id})
    assert response.headers["x-request-id"] == request_id

    def logged() -> list[dict]:
        lines = [line for line in live_server.log_text().splitlines() if request_id in line]
        return [json.loads(line) for line in lines]

    wait_until(lambda: bool(logged()), 5, "the access log line")
    (entry,) = logged()
    assert entry["method"] == "POST" and entry["path"] == COS_SIN and entry["route"] == COS_SIN
    assert entry["status"] == 200 and entry["duration_s"] >= 0 and entry["client"] == "127.0.0.1"
    assert entry["level"] == "info" and entry["logger"] == "ropeserve.access"
    assert datetime.fromisoformat(entry["time"]).tzinfo is not None


def test_every_log_line_is_json_and_probes_are_not_logged(live_server: Server) -> None:
    with httpx.Client(base_url=live_server.url, timeout=10) as client:
        for path in ("/health/ready", "/health/live", "/metrics"):
            client.get(path, headers={"X-Request-ID": "probe-not-logged"}).raise_for_status()
        client.get("/v1/info", headers={"X-Request-ID": "info-is-logged"}).raise_for_status()
    wait_until(lambda: "info-is-logged" in live_server.log_text(), 5, "the /v1/info access line")
    entries = [json.loads(line) for line in live_server.log_text().splitlines() if line.strip()]
    for entry in entries:
        assert entry["level"] in {"debug", "info", "warning", "error", "critical"}, entry
        assert datetime.fromisoformat(entry["time"]).tzinfo is not None, entry
    assert any(entry["logger"].startswith("uvicorn") for entry in entries), "uvicorn's own lines are JSON too"
    assert "probe-not-logged" not in live_server.log_text()


def test_request_id_is_generated_when_absent(live_server: Server) -> None:
    first, second = (httpx.get(live_server.url + "/health/live").headers["x-request-id"] for _ in range(2))
    assert re.fullmatch(r"[0-9a-f]{32}", first) and first != second


def dockerfile_healthcheck() -> list[str]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("HEALTHCHECK"))
    command = json.loads(line.split(" CMD ", 1)[1])
    return [sys.executable if part == "python3" else part for part in command]


def test_the_image_health_check_command_probes_readiness(live_server: Server) -> None:
    def run(port: int) -> int:
        env = {"ROPESERVE_PORT": str(port), "PATH": ""}
        return subprocess.run(dockerfile_healthcheck(), env=env, capture_output=True, timeout=30).returncode

    assert run(live_server.port) == 0
    assert run(free_port()) != 0
