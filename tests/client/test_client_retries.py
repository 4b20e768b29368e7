"""Retries: 429/503 and connection failures are retried with backoff, honouring a capped Retry-After."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from client_mocks import Recorder, problem

import ropeserve_client as rc
from ropeserve_client._retry import parse_retry_after

OK = httpx.Response(200, json={"version": "x"})
NO_JITTER = rc.RetryPolicy(max_retries=3, initial_delay=0.25, max_delay=8.0, max_retry_after=30.0, jitter=0.0)


class SleepLog(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def recording_client(recorder: Recorder, retry: rc.RetryPolicy = NO_JITTER) -> tuple[rc.Client, SleepLog]:
    client = rc.Client("http://rs.test", transport=httpx.MockTransport(recorder), retry=retry)
    sleeps = SleepLog()
    client._sleep = sleeps  # type: ignore[method-assign]
    return client, sleeps


def test_retry_after_is_honoured_then_the_answer_returned() -> None:
    recorder = Recorder(problem(429, "overloaded", retry_after=2), problem(503, "not-ready", retry_after=1), OK)
    client, sleeps = recording_client(recorder)
    assert client.info() == {"version": "x"}
    assert sleeps == [2.0, 1.0]
    assert len(recorder.requests) == 3


def test_without_retry_after_backoff_doubles_up_to_the_cap() -> None:
    retry = rc.RetryPolicy(max_retries=6, initial_delay=1.0, max_delay=4.0, jitter=0.0)
    client, sleeps = recording_client(Recorder(*[problem(503, "not-ready")] * 6, OK), retry)
    client.info()
    assert sleeps == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]


def test_retry_after_is_capped() -> None:
    client, sleeps = recording_client(Recorder(problem(429, "overloaded", retry_after=3600), OK))
    client.info()
    assert sleeps == [30.0]


def test_exhausted_retries_raise_the_typed_error_with_retry_after() -> None:
    recorder = Recorder(problem(429, "overloaded", "queue full", retry_after=1))
    client, sleeps = recording_client(recorder)
    with pytest.raises(rc.Overloaded) as info:
        client.cos_sin([0], preset="llama-3.1-8b")
    assert len(recorder.requests) == 4 and len(sleeps) == 3
    assert info.value.retry_after == 1.0


def test_other_errors_and_readiness_probes_are_not_retried() -> None:
    recorder = Recorder(problem(422, "invalid-input"))
    client, sleeps = recording_client(recorder)
    with pytest.raises(rc.InvalidInput):
        client.info()
    probe = Recorder(problem(503, "not-ready", retry_after=1))
    probe_client, probe_sleeps = recording_client(probe)
    with pytest.raises(rc.NotReady):
        probe_client.ready()
    assert len(recorder.requests) == len(probe.requests) == 1 and sleeps == probe_sleeps == []


def test_connection_failures_are_retried_timeouts_are_not() -> None:
    client, sleeps = recording_client(Recorder(httpx.ConnectError("refused"), OK))
    assert client.info() == {"version": "x"}
    assert sleeps == [0.25]
    timeouts = Recorder(httpx.ReadTimeout("slow"), OK)
    timeout_client, _ = recording_client(timeouts)
    with pytest.raises(rc.RequestTimeout):
        timeout_client.info()
    assert len(timeouts.requests) == 1


def test_jitter_adds_at_most_its_fraction() -> None:
    policy = rc.RetryPolicy(initial_delay=1.0, jitter=0.5)
    rng = random.Random(7)
    delays = [policy.delay(0, rng=rng) for _ in range(200)]
    assert all(1.0 <= delay <= 1.5 for delay in delays)
    assert max(delays) - min(delays) > 0.3
    assert 2.0 <= policy.delay(0, retry_after=2.0, rng=rng) <= 3.0


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=5), usegmt=True), now=now) == 5.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=5), usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_real_sleeps_are_short_with_a_small_policy() -> None:
    retry = rc.RetryPolicy(max_retries=2, max_retry_after=0.05, jitter=0.0)
    recorder = Recorder(problem(503, "not-ready", retry_after=1), problem(503, "not-ready", retry_after=1), OK)
    client = rc.Client("http://rs.test", transport=httpx.MockTransport(recorder), retry=retry)
    started = time.perf_counter()
    client.info()
    assert 0.1 <= time.perf_counter() - started < 1.0
