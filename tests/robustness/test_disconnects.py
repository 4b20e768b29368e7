"""Clients that leave mid-upload or while their rotation is queued: nothing leaks, the server records it
(499 / the dropped counter), never a 5xx, and the next requests succeed."""

from __future__ import annotations

import time

import httpx

from ropeserve_client.testing import LocalServer
from support import (
    BATCH_WINDOW_S,
    DROPPED_METRIC,
    ROPE_APPLY,
    assert_healthy,
    open_socket,
    request_head,
    rope_body,
    rss_mb,
    scrape,
    server_5xx,
    wait_for,
)

HEADERS = {"content-type": "application/x-safetensors"}
ABANDONED_UPLOADS = 20
QUEUED_VICTIMS = 3
MAX_RSS_GROWTH_MB = 50
IN_FLIGHT_METRIC = "ropeserve_http_requests_in_flight"


def client_closed_requests(client: httpx.Client) -> float:
    lines = client.get("/metrics").text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if "_requests_total{" in line and 'status="499"' in line)


def abandon_upload(server: LocalServer, declared: int, sent: int) -> None:
    with open_socket(server.url) as sock:
        sock.sendall(request_head(ROPE_APPLY, {**HEADERS, "content-length": str(declared)}))
        sock.sendall(bytes(sent))


def test_mid_upload_disconnects_leak_nothing(guarded_server: LocalServer, guarded: httpx.Client) -> None:
    pid, closed_before = guarded_server.pids[0], client_closed_requests(guarded)
    rss_before = rss_mb(pid)
    for _ in range(ABANDONED_UPLOADS):
        abandon_upload(guarded_server, declared=4 << 20, sent=1 << 20)
    wait_for(lambda: client_closed_requests(guarded) - closed_before == ABANDONED_UPLOADS, 10, "499s recorded")
    assert server_5xx(guarded) == 0
    assert scrape(guarded, IN_FLIGHT_METRIC) == 1  # the scrape itself
    assert rss_mb(pid) - rss_before < MAX_RSS_GROWTH_MB
    assert_healthy(guarded)


def test_clients_gone_before_compute_are_dropped(queue_server: LocalServer, queued: httpx.Client) -> None:
    """Small requests wait in the batch window; their clients close within it, so the batcher drops them all."""
    dropped_before = scrape(queued, DROPPED_METRIC)
    sockets = [open_socket(queue_server.url) for _ in range(QUEUED_VICTIMS)]
    for sock in sockets:
        body = rope_body(tokens=4)
        sock.sendall(request_head(ROPE_APPLY, {**HEADERS, "content-length": str(len(body))}) + body)
    time.sleep(BATCH_WINDOW_S / 3)  # the server has read them; the window is still open
    for sock in sockets:
        sock.close()
    wait_for(lambda: scrape(queued, DROPPED_METRIC) - dropped_before == QUEUED_VICTIMS, 10, "the drops")
    assert server_5xx(queued) == 0
    assert scrape(queued, IN_FLIGHT_METRIC) == 1
    assert scrape(queued, "ropeserve_batch_queue_depth") == 0
    assert_healthy(queued)
