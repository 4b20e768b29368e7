"""SIGTERM under load: readiness flips to 503, in-flight requests finish, no request fails, the process exits 0.

The clients play a load balancer: they keep sending on keep-alive connections until a readiness poll sees 503,
then stop routing to this replica. A slow upload that spans the moment the listener closes shows that in-flight
requests are finished, not cut. While draining every answer says ``Connection: close``, so no request is sent on
a connection the server is closing; with no drain delay the listener closes at once, and a connection attempt
refused there never carried a request (a balancer sends it to another replica): the only outcome allowed
besides 200.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from integration_support import COS_SIN, COS_SIN_BODY, Server, running_server

CLIENTS = 4
REFUSED = "refused"
SLOW_UPLOAD_S = 5.0
LOAD_LIMIT_S = 20.0


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Balancer:
    """Polls readiness like a load balancer; the first 503 stops all clients (the replica is deregistered)."""

    def __init__(self, server: Server) -> None:
        self.server, self.deregistered = server, threading.Event()
        self.not_ready: httpx.Response | None = None
        self.ready_gauge: str | None = None
        self.still_accepting = False

    def poll(self) -> None:
        deadline = time.monotonic() + LOAD_LIMIT_S
        with httpx.Client(base_url=self.server.url, timeout=5) as client:
            try:
                while time.monotonic() < deadline and not self.saw_not_ready(client):
                    time.sleep(0.05)
            except httpx.HTTPError:
                pass  # the replica vanished without turning unready first; the assertions say so
            finally:
                self.deregistered.set()

    def saw_not_ready(self, client: httpx.Client) -> bool:
        response = client.get("/health/ready")
        if response.status_code != 503:
            return False
        self.not_ready = response
        self.still_accepting = accepts_connections(self.server.port)
        gauge = [line for line in client.get("/metrics").text.splitlines() if line.startswith("ropeserve_ready ")]
        self.ready_gauge = gauge[0] if gauge else None
        return True


def send_until_deregistered(server: Server, balancer: Balancer, outcomes: list[str]) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        while not balancer.deregistered.is_set():
            try:
                outcomes.append(str(client.post(COS_SIN, json=COS_SIN_BODY).status_code))
            except httpx.ConnectError:
                outcomes.append(REFUSED)
            except httpx.HTTPError as exc:
                outcomes.append(repr(exc))


def slow_body() -> Iterator[bytes]:
    """The request body, trickled out over SLOW_UPLOAD_S seconds."""
    data = json.dumps(COS_SIN_BODY).encode()
    pieces = 16
    step = -(-len(data) // pieces)
    for start in range(0, len(data), step):
        yield data[start : start + step]
        time.sleep(SLOW_UPLOAD_S / pieces)


def slow_upload(server: Server, outcomes: list[str]) -> None:
    headers = {"content-type": "application/json"}
    try:
        response = httpx.post(server.url + COS_SIN, content=slow_body(), headers=headers, timeout=30)
        outcomes.append(str(response.status_code))
    except httpx.HTTPError as exc:
        outcomes.append(repr(exc))


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


@dataclass
class DrainRun:
    outcomes: list[str] = field(default_factory=list)
    slow_outcome: list[str] = field(default_factory=list)
    closed_while_in_flight: bool = False
    exit_code: int | None = None


def sigterm_under_load(server: Server, balancer: Balancer, drain_delay_s: float) -> DrainRun:
    run = DrainRun()
    threads = [threading.Thread(target=balancer.poll)]
    threads += [
        threading.Thread(target=send_until_deregistered, args=(server, balancer, run.outcomes)) for _ in range(CLIENTS)
    ]
    slow = threading.Thread(target=slow_upload, args=(server, run.slow_outcome))
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    slow.start()
    time.sleep(0.5)
    sigterm_at = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(20)
    sleep_until(sigterm_at + drain_delay_s + 0.6)
    run.closed_while_in_flight = slow.is_alive() and not accepts_connections(server.port)
    slow.join(30)
    run.exit_code = server.proc.wait(30)
    return run


@pytest.mark.timeout(90)
@pytest.mark.parametrize("drain_delay_s", [0.0, 2.0])
def test_sigterm_drains_in_flight_requests_without_failures(tmp_path: Path, drain_delay_s: float) -> None:
    settings = {"ROPESERVE_DRAIN_DELAY_S": str(drain_delay_s), "ROPESERVE_DRAIN_TIMEOUT_S": "20"}
    with running_server(tmp_path, **settings) as server:
        balancer = Balancer(server)
        run = sigterm_under_load(server, balancer, drain_delay_s)
        log = server.log_text()

    answered = [outcome for outcome in run.outcomes if outcome != REFUSED]
    assert len(answered) >= 20 and set(answered) == {"200"}, sorted(set(run.outcomes))
    if drain_delay_s:
        assert REFUSED not in run.outcomes, "the listener should stay open for ROPESERVE_DRAIN_DELAY_S"
        assert balancer.not_ready is not None, "readiness never turned 503"
        assert "draining" in balancer.not_ready.json()["detail"]
        assert balancer.not_ready.headers["connection"] == "close"
        assert balancer.ready_gauge == "ropeserve_ready 0.0"
        assert balancer.still_accepting, "the listener should stay open for ROPESERVE_DRAIN_DELAY_S after SIGTERM"
    assert run.closed_while_in_flight, "the slow upload should still be in flight after the listener closed"
    assert run.slow_outcome == ["200"]
    assert run.exit_code == 0, log
    assert log.index("Draining") < log.index("Shutting down") < log.index("Application shutdown complete")
