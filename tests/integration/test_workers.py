"""``ropeserve serve`` with ROPESERVE_WORKERS=2: two processes on one port, /metrics counting both.

Requests go on fresh connections from several threads, so both workers accept some; every scrape (whichever
worker answers it) must show the total sent, and the per-worker files must add up to it.
"""

from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from integration_support import COS_SIN, COS_SIN_BODY, Server, running_server, wait_until
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

BATCH = 60
MAX_REQUESTS = 1200
REQUESTS = "ropeserve_http_requests"


def one_request(url: str) -> int:
    with httpx.Client(base_url=url, timeout=30) as client:  # a new connection each time
        return client.post(COS_SIN, json=COS_SIN_BODY).status_code


def per_worker_counts(directory: Path) -> dict[str, float]:
    """cos/sin 200 answers recorded by each worker process, from its own counter file."""
    counts: dict[str, float] = {}
    for path in directory.glob("counter_*.db"):
        for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(str(path)):
            _metric, name, labels, _help = json.loads(key)
            if name == f"{REQUESTS}_total" and labels.get("route") == COS_SIN and labels.get("status") == "200":
                pid = path.stem.removeprefix("counter_")
                counts[pid] = counts.get(pid, 0) + value
    return counts


def scraped(server: Server) -> dict[str, float]:
    """cos/sin 200 request count and duration-histogram count, from one scrape on a new connection."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("route") == COS_SIN and sample.labels.get("status") == "200":
                found[sample.name] = found.get(sample.name, 0) + sample.value
    return found


def test_two_workers_share_the_port_and_metrics_add_up(tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    (directory / "counter_1.db").write_bytes(b"stale")  # a previous run's file: the service clears it
    with running_server(tmp_path, ROPESERVE_WORKERS="2", PROMETHEUS_MULTIPROC_DIR=str(directory)) as server:
        wait_until(lambda: len(list(directory.glob("gauge_livemin_*.db"))) == 2, 60, "two workers' metrics")
        wait_until(lambda: httpx.get(server.url + "/health/ready", timeout=5).status_code == 200, 60, "readiness")
        sent = 0
        with ThreadPoolExecutor(6) as pool:
            while sent < MAX_REQUESTS and len(per_worker_counts(directory)) < 2:
                statuses = list(pool.map(one_request, [server.url] * BATCH))
                assert statuses == [200] * BATCH
                sent += BATCH
        per_worker = per_worker_counts(directory)
        assert len(per_worker) == 2, f"one worker answered all {sent} requests: {per_worker}"
        assert all(count > 0 for count in per_worker.values())
        assert sum(per_worker.values()) == sent
        for _ in range(6):  # scrapes land on either worker; each shows the sum
            totals = scraped(server)
            assert totals[f"{REQUESTS}_total"] == sent
            assert totals["ropeserve_http_request_duration_seconds_count"] == sent
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        assert "ropeserve_ready 1.0" in metrics
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0
    assert not (directory / "counter_1.db").exists()
