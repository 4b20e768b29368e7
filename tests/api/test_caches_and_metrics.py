"""State that lives across requests stays bounded whatever clients send (issue 13, items 3 and 9).

* The cos/sin table cache holds at most ``table_cache_bytes`` of rows: 32 tiny requests for 32 distinct tables once
  kept 32 full tables (2 GiB at the default sizes).
* Metric label values come from the service, not the request: unknown methods count as ``other`` and unmatched
  paths as ``unmatched`` (805 anonymous requests with the 35 methods httptools accepts once grew /metrics 180×).

Checked through the ASGI app and over a real socket (httptools parses the methods there).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from ropeserve.api import create_app
from ropeserve.api.middleware import METRIC_METHODS
from ropeserve.settings import Settings
from ropeserve_client.testing import LocalServer

ROW_BYTES = 8 * 128 // 2
"""cos + sin float32 bytes of one half-width row at head_dim 128."""
TABLE_BYTES = 2048 * ROW_BYTES
"""One table grown to cover position 2000 (2048 rows: 1 MiB)."""
BUDGET = 4 * TABLE_BYTES
HTTPTOOLS_METHODS = (
    "DELETE", "GET", "HEAD", "POST", "PUT", "CONNECT", "OPTIONS", "TRACE", "COPY", "LOCK", "MKCOL", "MOVE",
    "PROPFIND", "PROPPATCH", "SEARCH", "UNLOCK", "BIND", "REBIND", "UNBIND", "ACL", "REPORT", "MKACTIVITY",
    "CHECKOUT", "MERGE", "M-SEARCH", "NOTIFY", "SUBSCRIBE", "UNSUBSCRIBE", "PATCH", "PURGE", "MKCALENDAR", "LINK",
    "UNLINK", "SOURCE", "QUERY",
)  # fmt: skip
"""The methods llhttp (httptools) accepts on requests."""
KNOWN_ROUTE = "/v1/rope/cos-sin"


def tiny_table_request(index: int) -> dict[str, object]:
    """2.3 kB of attack in all: one position, a new rope_theta each time (so a new table)."""
    return {"rope": {"head_dim": 128, "rope_theta": 10_000.0 + index}, "positions": [2000]}


def metric_value(page: str, name: str) -> float:
    return next(s.value for family in text_string_to_metric_families(page) for s in family.samples if s.name == name)


def request_series(page: str) -> set[tuple[str, str, str]]:
    """(route, method, status) of every ``ropeserve_http_requests_total`` series."""
    return {
        (s.labels["route"], s.labels["method"], s.labels["status"])
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name == "ropeserve_http_requests_total"
    }


def flood(client: httpx.Client | TestClient, paths: list[str]) -> None:
    for method in HTTPTOOLS_METHODS:
        for path in paths:
            client.request(method, path)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(access_log=False, table_cache_bytes=BUDGET))) as test_client:
        yield test_client


def test_thirty_two_tiny_cos_sin_requests_keep_the_table_cache_within_its_bytes(client: TestClient) -> None:
    tables = client.app.state.runtime.tables  # type: ignore[attr-defined]
    for index in range(32):
        assert client.post("/v1/rope/cos-sin", json=tiny_table_request(index)).status_code == 200
        assert tables.nbytes <= BUDGET
    page = client.get("/metrics").text
    assert metric_value(page, "ropeserve_rope_table_cache_bytes") == tables.nbytes == BUDGET


def test_a_table_beyond_the_budget_is_served_exactly_and_not_cached(client: TestClient) -> None:
    rope = {"head_dim": 128, "rope_theta": 123_456.0}
    far = client.post("/v1/rope/cos-sin", json={"rope": rope, "positions": [5, 50_000]}).json()
    near = client.post("/v1/rope/cos-sin", json={"rope": rope, "positions": [5]}).json()
    assert far["cos"][0] == near["cos"][0] and far["sin"][0] == near["sin"][0]
    assert client.app.state.runtime.tables.nbytes <= BUDGET  # type: ignore[attr-defined]


def test_methods_and_paths_from_clients_add_no_label_values(client: TestClient) -> None:
    client.get("/health/live")
    before = request_series(client.get("/metrics").text)
    flood(client, [f"/no/such/path/{index}" for index in range(20)] + [KNOWN_ROUTE])
    added = request_series(client.get("/metrics").text) - before
    assert added <= {
        ("unmatched", "other", "404"),
        ("unmatched", "GET", "404"), ("unmatched", "HEAD", "404"), ("unmatched", "POST", "404"),
        ("unmatched", "PUT", "404"), ("unmatched", "DELETE", "404"), ("unmatched", "CONNECT", "404"),
        ("unmatched", "OPTIONS", "404"), ("unmatched", "TRACE", "404"), ("unmatched", "PATCH", "404"),
        (KNOWN_ROUTE, "other", "405"), (KNOWN_ROUTE, "POST", "422"),
        (KNOWN_ROUTE, "GET", "405"), (KNOWN_ROUTE, "HEAD", "405"), (KNOWN_ROUTE, "PUT", "405"),
        (KNOWN_ROUTE, "DELETE", "405"), (KNOWN_ROUTE, "CONNECT", "405"), (KNOWN_ROUTE, "OPTIONS", "405"),
        (KNOWN_ROUTE, "TRACE", "405"), (KNOWN_ROUTE, "PATCH", "405"),
    }  # fmt: skip
    assert ("unmatched", "other", "404") in added and (KNOWN_ROUTE, "other", "405") in added


def test_a_real_server_keeps_metrics_and_the_table_cache_bounded() -> None:
    env = {"ROPESERVE_TABLE_CACHE_BYTES": str(BUDGET), "OMP_NUM_THREADS": "1"}
    with LocalServer(env=env) as server, httpx.Client(base_url=server.url, timeout=30.0) as http:
        for index in range(32):
            assert http.post("/v1/rope/cos-sin", json=tiny_table_request(index)).status_code == 200
        first = http.get("/metrics").text
        flood(http, [f"/anonymous/{index}" for index in range(20)])
        second = http.get("/metrics").text
        flood(http, [f"/other/{index}" for index in range(20)])
        third = http.get("/metrics").text
    assert metric_value(first, "ropeserve_rope_table_cache_bytes") == BUDGET
    methods = {method for _, method, _ in request_series(third)}
    assert "other" in methods and methods <= METRIC_METHODS | {"other"}
    assert request_series(third) == request_series(second)  # a second flood adds no series at all
    assert len(third) - len(second) < 2_000  # counter digits only (the first flood added a few series)
