"""Per-call ``timeout=`` and ``extra_headers=`` go to the request, not its body; 502/504 are retried; CLI habits."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest
from client_mocks import Recorder, problem

import ropeserve_client as rc
from ropeserve_client import cli


def ok() -> httpx.Response:
    return httpx.Response(200, json={"version": "x"})


NO_JITTER = rc.RetryPolicy(max_retries=3, initial_delay=0.25, jitter=0.0)


def mock_client(recorder: Recorder, **options: object) -> rc.Client:
    client = rc.Client("http://rs.test", transport=httpx.MockTransport(recorder), **options)  # type: ignore[arg-type]
    client._sleep = lambda seconds: None  # type: ignore[method-assign]
    return client


def test_per_call_timeout_and_headers_apply_to_the_request_not_the_body() -> None:
    recorder = Recorder(lambda request: httpx.Response(200, json={"cos": [[1.0]], "sin": [[0.0]]}))
    with mock_client(recorder) as client:
        client.cos_sin([0], preset="llama-3.1-8b", timeout=1.5, extra_headers={"X-Request-ID": "abc", "X-Tenant": "t"})
        client.cos_sin([0], preset="llama-3.1-8b")
    first, second = recorder.requests
    body = json.loads(first.content)
    assert "timeout" not in body and "extra_headers" not in body
    assert first.extensions["timeout"] == {"connect": 1.5, "read": 1.5, "write": 1.5, "pool": 1.5}
    assert first.headers["x-request-id"] == "abc" and first.headers["x-tenant"] == "t"
    assert second.extensions["timeout"]["read"] == 60.0 and "x-tenant" not in second.headers


def test_async_client_takes_the_same_per_call_options() -> None:
    recorder = Recorder(ok())

    async def call() -> None:
        transport = httpx.MockTransport(recorder.handle_async)
        async with rc.AsyncClient("http://rs.test", transport=transport) as client:
            await client.info(timeout=httpx.Timeout(2.0, connect=0.5), extra_headers={"X-Tenant": "t"})

    asyncio.run(call())
    (request,) = recorder.requests
    assert request.extensions["timeout"] == {"connect": 0.5, "read": 2.0, "write": 2.0, "pool": 2.0}
    assert request.headers["x-tenant"] == "t"


@pytest.mark.parametrize("status", [502, 504])
def test_gateway_errors_are_retried(status: int) -> None:
    recorder = Recorder(problem(status, "bad-gateway"), problem(status, "bad-gateway"), ok())
    with mock_client(recorder, retry=NO_JITTER) as client:
        assert client.info() == {"version": "x"}
    assert len(recorder.requests) == 3


def test_cli_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"ropeserve-client {rc.__version__}"


def test_output_piped_into_head_stops_without_a_traceback(ropeserve_url: str) -> None:
    command = [sys.executable, "-m", "ropeserve_client.cli", "cos-sin", "--url", ropeserve_url]
    command += ["--preset", "llama-3.1-8b", "--positions", "0:2048", "--format", "json"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    head = [proc.stdout.readline() for _ in range(5)]  # what `| head -5` reads, then it exits
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1, stderr
    assert all(head) and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
