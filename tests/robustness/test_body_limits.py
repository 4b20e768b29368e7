"""Oversized bodies are refused with 413 without being buffered: declared (Content-Length) and streamed (chunked)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx

from ropeserve_client.testing import LocalServer
from support import (
    BODY_CAP_BYTES,
    ROPE_APPLY,
    assert_healthy,
    open_socket,
    read_status,
    request_head,
    rss_mb,
    send_until_refused,
)

CLAIMED_BYTES = 1 << 30
MAX_RSS_GROWTH_MB = 50
CHUNK_BYTES = 1 << 20
STREAMED_BYTES = 256 << 20
"""32× the cap: buffering it would show in RSS; the server stops reading right after the cap."""


def zero_chunks(total: int, size: int, chunked: bool) -> Iterator[bytes]:
    piece = bytes(size)
    framed = b"%x\r\n%s\r\n" % (size, piece) if chunked else piece
    for _ in range(total // size):
        yield framed


def upload(server: LocalServer, headers: dict[str, str], total: int, chunked: bool) -> tuple[int, int]:
    """Send ``total`` bytes of body (as fast as the server takes them); (status, bytes the server took)."""
    with open_socket(server.url) as sock:
        sock.sendall(request_head(ROPE_APPLY, {"content-type": "application/x-safetensors", **headers}))
        taken = send_until_refused(sock, zero_chunks(total, CHUNK_BYTES, chunked))
        return read_status(sock), taken


def test_claimed_gigabyte_is_refused_before_reading(guarded_server: LocalServer, guarded: httpx.Client) -> None:
    pid = guarded_server.pids[0]
    before = rss_mb(pid)
    status, taken = upload(guarded_server, {"content-length": str(CLAIMED_BYTES)}, CLAIMED_BYTES, chunked=False)
    assert status == 413
    assert taken < CLAIMED_BYTES // 16, f"the server took {taken} bytes of a body it refused"
    assert rss_mb(pid) - before < MAX_RSS_GROWTH_MB
    assert_healthy(guarded)


def test_chunked_upload_past_the_cap_is_cut_off(guarded_server: LocalServer, guarded: httpx.Client) -> None:
    pid = guarded_server.pids[0]
    before = rss_mb(pid)
    status, taken = upload(guarded_server, {"transfer-encoding": "chunked"}, STREAMED_BYTES, chunked=True)
    assert status == 413
    assert taken < STREAMED_BYTES // 4, f"the server kept reading ({taken} bytes) past the {BODY_CAP_BYTES} cap"
    assert rss_mb(pid) - before < MAX_RSS_GROWTH_MB
    assert_healthy(guarded)
