"""A real Prometheus (Debian package) on loopback scrapes a live server with the repository's config."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from integration_support import (
    COS_SIN,
    COS_SIN_BODY,
    REPO,
    Server,
    deployment_queries,
    free_port,
    stop_process,
    wait_until,
)
from safetensors.torch import save

pytestmark = pytest.mark.deploy
SAFETENSORS = {"content-type": "application/x-safetensors"}
PROMETHEUS_DIR = REPO / "deploy/prometheus"
REQUESTS = 12


def scrape_config_for(server: Server, workdir: Path) -> Path:
    """The repository's prometheus.yml, pointed at ``server`` and scraping every second."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "ropeserve"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{server.port}"]}]
    for rule_file in config.get("rule_files", []):
        shutil.copy(PROMETHEUS_DIR / rule_file, workdir / rule_file)
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def prometheus(live_server: Server, tool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """Prometheus on a free loopback port, yielded after its first successful scrape of ``live_server``."""
    tmp_path = tmp_path_factory.mktemp("prometheus")
    config = scrape_config_for(live_server, tmp_path)
    check = subprocess.run([tool("promtool"), "check", "config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    command = [
        tool("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5)
    try:
        wait_until(lambda: proc.poll() is not None or ready(client), 20, "Prometheus to be ready")
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
        wait_until(lambda: scalar(client, 'up{job="ropeserve"}') == 1, 30, "the first successful scrape")
        yield client
    finally:
        client.close()
        stop_process(proc)


def ready(client: httpx.Client) -> bool:
    try:
        return client.get("/-/ready").status_code == 200
    except httpx.HTTPError:
        return False


def query(client: httpx.Client, promql: str) -> list[dict]:
    body = client.get("/api/v1/query", params={"query": promql}).json()
    assert body["status"] == "success", (promql, body)
    return body["data"]["result"]


def scalar(client: httpx.Client, promql: str) -> float:
    result = query(client, promql)
    return float(result[0]["value"][1]) if result else 0.0


def test_request_counter_rises_in_prometheus_after_traffic(prometheus: httpx.Client, live_server: Server) -> None:
    counter = f'sum(ropeserve_http_requests_total{{job="ropeserve", route="{COS_SIN}", status="200"}})'
    before = scalar(prometheus, counter)
    with httpx.Client(base_url=live_server.url) as client:
        for _ in range(REQUESTS):
            assert client.post(COS_SIN, json=COS_SIN_BODY).status_code == 200
    wait_until(lambda: scalar(prometheus, counter) >= before + REQUESTS, 20, f"{counter} to rise by {REQUESTS}")


def test_shipped_queries_and_rules_evaluate(prometheus: httpx.Client) -> None:
    for where, promql in deployment_queries().items():
        if where.startswith("hpa metric"):
            continue  # a bare name, served by prometheus-adapter; the adapter's seriesQuery is checked instead
        if where.startswith("dashboard variable"):
            promql = promql.removeprefix("label_values(").split(",")[0]
        query(prometheus, promql.replace("$instance", ".*").replace("$__rate_interval", "1m"))

    def rules_healthy() -> bool:
        groups = prometheus.get("/api/v1/rules").json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return bool(rules) and all(rule["health"] == "ok" for rule in rules)

    wait_until(rules_healthy, 20, "alert rules to load and evaluate")


def rotation_body() -> bytes:
    tensors = {"q": torch.randn(4, 2 * 16), "positions": torch.arange(4)}
    params = {"rope": {"rope_theta": 10_000.0, "head_dim": 16}, "layout": "flat"}
    return save(tensors, metadata={"ropeserve": json.dumps(params)})


def test_median_batch_size_of_single_request_batches_is_one(prometheus: httpx.Client, live_server: Server) -> None:
    """Prometheus' own histogram_quantile over the live histogram: sequential requests make one-request batches."""
    count = 'sum(ropeserve_batch_size_requests_count{job="ropeserve"})'
    before = scalar(prometheus, count)
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        for _ in range(3):
            response = client.post("/v1/rope/apply", content=rotation_body(), headers=SAFETENSORS)
            assert response.status_code == 200, response.text
    wait_until(lambda: scalar(prometheus, count) >= before + 3, 20, "the batches to be scraped")
    median = 'histogram_quantile(0.5, sum by (le) (ropeserve_batch_size_requests_bucket{job="ropeserve"}))'
    assert scalar(prometheus, median) == 1.0
