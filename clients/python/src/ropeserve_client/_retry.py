"""Retry policy: which failures are retried, and how long to wait before the next attempt.

ropeserve's endpoints are pure computations, so every request (POST included) is safe to repeat. Retried:
429 and 503 answers (the server's back-pressure and warm-up/drain signals), 502 and 504 (a load balancer or
ingress in front could not reach a replica or gave up on it) and connection failures. Not retried: timeouts of
this client (the server may still be working) and every other answer.

The wait is the server's ``Retry-After`` when it sends one (seconds or an HTTP date, capped at
``max_retry_after``), else exponential backoff ``initial_delay * 2**attempt`` capped at ``max_delay``; either way
up to ``jitter`` of it is added at random so that clients refused together do not come back together.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

__all__ = ["DEFAULT_RETRY", "NO_RETRY", "RetryPolicy", "parse_retry_after"]

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Back-pressure (429), warm-up or drain (503), and a proxy in front that lost or timed out on a replica (502, 504)."""


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date); None when absent or invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, seconds) if seconds == seconds else None  # NaN check


@dataclass(frozen=True)
class RetryPolicy:
    """How many times to retry and how long to wait (see the module docstring)."""

    max_retries: int = 3
    """Retries after the first attempt (0 disables retrying)."""
    initial_delay: float = 0.25
    """Backoff before the first retry when the server sends no Retry-After, in seconds."""
    max_delay: float = 8.0
    """Cap of the exponential backoff, in seconds."""
    max_retry_after: float = 30.0
    """Cap of a server-sent Retry-After, in seconds."""
    jitter: float = 0.25
    """Up to this fraction of the wait is added at random."""
    statuses: frozenset[int] = field(default=RETRY_STATUSES)
    """Answer statuses that are retried."""

    def retries_status(self, status: int, attempt: int) -> bool:
        return attempt < self.max_retries and status in self.statuses

    def retries_error(self, error: httpx.TransportError, attempt: int) -> bool:
        """Connection failures are retried; timeouts are not (the server may still be working)."""
        connect_failure = isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.RemoteProtocolError)
        return attempt < self.max_retries and connect_failure

    def delay(self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``attempt + 1`` (``attempt`` counts from 0)."""
        if retry_after is not None:
            base = min(retry_after, self.max_retry_after)
        else:
            base = min(self.initial_delay * 2**attempt, self.max_delay)
        return base * (1.0 + self.jitter * (rng or random).random())


DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(max_retries=0)
