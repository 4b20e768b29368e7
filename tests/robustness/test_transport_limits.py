"""Memory, time and connection limits at the transport (issue 13, items 2, 6, 7, 8), over real sockets.

Servers run ``ropeserve serve``'s uvicorn setup in this process (``served.serving``) with short limits set through
settings; every wait is bounded by a socket timeout far above the limits, never asserted as a duration.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
import torch
from safetensors.torch import load
from served import Served, serving

from ropeserve.api import json_route
from ropeserve.settings import JSON_MEMORY_FACTOR
from ropeserve_client.testing import LocalServer
from support import (
    ROPE,
    ROPE_APPLY,
    SAFETENSORS,
    open_socket,
    request_head,
    rope_body,
    rss_mb,
    send_until_refused,
    wait_for,
)

MIB = 1 << 20
SHORT_S = 0.5
"""Header and body idle timeouts of the servers here."""
SOCKET_TIMEOUT_S = 20.0
COS_SIN = "/v1/rope/cos-sin"
JSON = {"content-type": "application/json"}


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of the next response on ``sock`` (Content-Length framed)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response; got {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, value in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return int(lines[0].split(" ")[2 - 1]), headers, body


def assert_closed(sock: socket.socket) -> None:
    """The server closed ``sock`` (EOF or reset) and sent nothing more."""
    with contextlib.suppress(ConnectionResetError):
        assert sock.recv(65536) == b""


def problem_of(status: int, headers: dict[str, str], body: bytes, expected: int, slug: str) -> dict[str, object]:
    assert status == expected, body
    assert headers["content-type"].startswith("application/problem+json")
    document = json.loads(body)
    assert document["status"] == expected and document["type"].endswith("/" + slug), document
    return document  # type: ignore[no-any-return]


def connect(served: Served) -> socket.socket:
    return open_socket(served.url, timeout=SOCKET_TIMEOUT_S)


# --- item 8: header timeout, body idle timeout, connection cap ---------------------------------------------------


@pytest.fixture(scope="module")
def short_timeouts() -> Iterator[Served]:
    with serving(header_timeout_s=SHORT_S, body_idle_timeout_s=SHORT_S) as served:
        yield served


def test_a_request_head_that_never_completes_gets_408_and_a_close(short_timeouts: Served) -> None:
    sockets = [connect(short_timeouts) for _ in range(24)]
    for sock in sockets:
        sock.sendall(b"POST /v1/rope/cos-sin HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    for sock in sockets:
        with sock:
            problem_of(*read_response(sock), 408, "request-timeout")
            assert_closed(sock)


def test_a_connection_that_sends_nothing_is_closed(short_timeouts: Served) -> None:
    sockets = [connect(short_timeouts) for _ in range(24)]
    for sock in sockets:
        with sock:
            assert_closed(sock)


def test_a_body_that_stalls_gets_408_and_a_close(short_timeouts: Served) -> None:
    sockets = [connect(short_timeouts) for _ in range(12)]
    for sock in sockets:
        sock.sendall(request_head(COS_SIN, {**JSON, "content-length": "1000"}) + b'{"rope": ')
    for sock in sockets:
        with sock:
            status, headers, body = read_response(sock)
            problem_of(status, headers, body, 408, "request-timeout")
            assert headers["connection"] == "close"
            assert_closed(sock)


def test_connections_past_the_cap_get_503_with_retry_after_at_once() -> None:
    cap, extra = 8, 5
    with serving(max_connections=cap, header_timeout_s=60, retry_after_s=4) as served:
        held = [connect(served) for _ in range(cap)]
        refused = [connect(served) for _ in range(extra)]
        for sock in refused:
            with sock:
                status, headers, body = read_response(sock)
                problem_of(status, headers, body, 503, "busy")
                assert headers["retry-after"] == "4" and headers["connection"] == "close"
        for sock in held:
            sock.close()
        wait_for(lambda: httpx.get(served.url + "/health/live").status_code == 200, 10, "a free connection slot")


# --- item 6: a 500 says Connection: close ------------------------------------------------------------------------


def test_a_500_says_connection_close_and_the_next_request_succeeds() -> None:
    with serving() as served:

        async def fails() -> None:
            raise RuntimeError("a bug")

        served.app.add_api_route("/test/fails", fails)
        with connect(served) as sock:
            sock.sendall(b"GET /test/fails HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, headers, body = read_response(sock)
            problem_of(status, headers, body, 500, "internal")
            assert headers["connection"] == "close", "the server closes after a 500: it must say so"
            assert_closed(sock)
        with httpx.Client(base_url=served.url) as client:  # keep-alive: the 500 must not poison the pool
            assert client.get("/test/fails").status_code == 500
            assert client.get("/health/live").status_code == 200


# --- item 2: bodies grow as they arrive, one budget for all bodies in flight --------------------------------------


def test_uploads_past_the_in_flight_budget_get_503_and_the_others_finish() -> None:
    q = torch.randn(1, 8, 7000, ROPE["head_dim"])
    body = rope_body(q=q)  # 3.6 MB
    part = 3 * MIB
    limits = {"max_body_bytes": 4 * MIB, "max_json_body_bytes": MIB, "max_inflight_body_bytes": 8 * MIB}
    with serving(**limits, retry_after_s=2) as served:
        budget = served.runtime.body_budget
        head = request_head(ROPE_APPLY, {**SAFETENSORS, "content-length": str(len(body))})
        first, second, third = (connect(served) for _ in range(3))
        for count, sock in enumerate((first, second), start=1):
            sock.sendall(head + body[:part])
            wait_for(lambda count=count: budget.used == count * part, 10, f"{count} uploads held")
        third.sendall(head)
        send_until_refused(third, [body[start : start + 65536] for start in range(0, part, 65536)])
        status, headers, answer = read_response(third)
        problem_of(status, headers, answer, 503, "busy")
        assert headers["retry-after"] == "2" and headers["connection"] == "close"
        third.close()
        for sock in (first, second):
            with sock:
                sock.sendall(body[part:])
                status, _, answer = read_response(sock)
                assert status == 200 and load(answer)["q"].shape == q.shape
        wait_for(lambda: budget.used == 0, 10, "the budget to be released")


def test_a_big_content_length_commits_no_memory_before_its_bytes() -> None:
    """Old code: each 110-byte head with Content-Length 256 MiB allocated 256 MiB at once."""
    heads = 4
    with LocalServer(env={"OMP_NUM_THREADS": "1"}) as server, httpx.Client(base_url=server.url) as client:
        pid = server.pids[0]
        rss_before = rss_mb(pid)
        sockets = [open_socket(server.url) for _ in range(heads)]
        for sock in sockets:
            sock.sendall(request_head(ROPE_APPLY, {**SAFETENSORS, "content-length": str(256 * MIB)}) + bytes(1024))

        def all_reading() -> bool:
            lines = client.get("/metrics").text.splitlines()
            return any(line == f"ropeserve_http_requests_in_flight {heads + 1.0}" for line in lines)

        wait_for(all_reading, 10, "every upload to be in its endpoint")
        grown = rss_mb(pid) - rss_before
        for sock in sockets:
            sock.close()
        assert grown < 64, f"RSS grew {grown:.0f} MiB for {heads} heads carrying 1 KiB each"


# --- item 7: JSON bodies are capped apart from safetensors and parsed off the event loop --------------------------


def test_json_bodies_have_their_own_cap() -> None:
    with serving(max_json_body_bytes=64 * 1024) as served, httpx.Client(base_url=served.url, timeout=30) as client:
        big = json.dumps({"rope": ROPE, "positions": list(range(20_000))}).encode()
        declared = client.post(COS_SIN, content=big, headers=JSON)
        streamed = client.post(COS_SIN, content=iter([big[:40_000], big[40_000:]]), headers=JSON)
        for response in (declared, streamed):
            assert response.status_code == 413 and response.json()["limit"] == 64 * 1024, response.text
            assert response.headers["content-type"].startswith("application/problem+json")
        tensors = client.post(ROPE_APPLY, content=rope_body(q=torch.randn(1, 8, 1024, 16)), headers=SAFETENSORS)
        assert tensors.status_code == 200, "safetensors bodies keep max_body_bytes"
        small = client.post(COS_SIN, json={"rope": ROPE, "positions": [1, 2, 3]})
        assert small.status_code == 200, small.text


def test_probes_answer_while_a_big_json_body_is_being_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parse of a large body is held open (a slow parser); the probe must not wait for it."""
    parsing, release = threading.Event(), threading.Event()
    real_decode = json_route.decode_json

    def slow_decode(body: bytes) -> object:
        if len(body) >= json_route.JSON_THREAD_MIN_BYTES:
            parsing.set()
            release.wait(30)
        return real_decode(body)

    monkeypatch.setattr(json_route, "decode_json", slow_decode)
    outcome: list[int] = []
    big = json.dumps({"rope": ROPE, "positions": list(range(100_000))}).encode()
    headers = {**JSON, "accept": "application/x-safetensors"}
    with serving() as served:

        def post() -> None:
            outcome.append(httpx.post(served.url + COS_SIN, content=big, headers=headers, timeout=60).status_code)

        poster = threading.Thread(target=post)
        poster.start()
        try:
            assert parsing.wait(30), "the big body never reached the parser"
            probe = httpx.get(served.url + "/health/live", timeout=SOCKET_TIMEOUT_S)
            assert probe.status_code == 200
            assert poster.is_alive() and not outcome, "the probe was answered while the parse was still running"
        finally:
            release.set()
            poster.join(60)
    assert outcome == [200]


def test_json_bodies_are_charged_at_their_parsed_size() -> None:
    """A JSON body takes JSON_MEMORY_FACTOR times its bytes from the budget: with room for 2 such uploads held
    open, the third is refused while a safetensors body of the same size still fits."""
    part = 200 * 1024
    limits = {"max_body_bytes": MIB, "max_json_body_bytes": 256 * 1024, "max_inflight_body_bytes": 4 * MIB}
    with serving(**limits) as served:
        budget = served.runtime.body_budget
        head = request_head(COS_SIN, {**JSON, "content-length": str(256 * 1024)})
        held = [connect(served) for _ in range(2)]
        for count, sock in enumerate(held, start=1):
            sock.sendall(head + b" " * part)
            wait_for(lambda count=count: budget.used == count * part * JSON_MEMORY_FACTOR, 10, "uploads held")
        with connect(served) as third:
            third.sendall(head + b" " * part)
            problem_of(*read_response(third), 503, "busy")
        small_tensors = rope_body(q=torch.randn(1, 2, 1024, 16))
        assert httpx.post(served.url + ROPE_APPLY, content=small_tensors, headers=SAFETENSORS).status_code == 200
        for sock in held:
            sock.close()


def test_answers_carry_a_date_but_do_not_advertise_the_server_software() -> None:
    with serving() as served, httpx.Client(base_url=served.url, timeout=30) as client:
        answer = client.get("/health/live")
    assert answer.status_code == 200 and "date" in answer.headers
    assert "server" not in answer.headers
