"""Prometheus metrics: one registry per app, ``ropeserve_`` prefix, base units, ``_total`` counters.

Bucket families live here (one place, as vLLM's ``buckets.py``): RoPE work takes microseconds to seconds,
so durations use geometric buckets from 10 µs growing ×1.5 (35 buckets, up to ~15 s).
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

disable_created_metrics()

DURATION_BUCKETS = tuple(1e-5 * 1.5**k for k in range(35))
COUNT_BUCKETS = tuple(float(2**k) for k in range(13))
TOKEN_BUCKETS = tuple(float(2**k) for k in range(21))
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Set (by ``ropeserve serve --workers N``) before prometheus-client is imported: values live in files there,
and a scrape of any worker sums them (gauges: each one's ``multiprocess_mode``)."""


class Metrics:
    """All metric objects of one app instance (a fresh registry, so test apps do not collide)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "ropeserve_http_requests", "HTTP requests answered.", ["route", "method", "status"], registry=r
        )
        self.request_duration = Histogram(
            "ropeserve_http_request_duration_seconds",
            "Time from request start to response end.",
            ["route", "method", "status"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "ropeserve_http_requests_in_flight", "Requests being handled now.", registry=r, multiprocess_mode="livesum"
        )
        self.errors = Counter(
            "ropeserve_http_errors", "Error responses by problem type.", ["error_type", "status"], registry=r
        )
        self.ready = Gauge(
            "ropeserve_ready",
            "1 when the service accepts work, 0 while warming or draining (with workers: all of them).",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.build_info = Gauge(
            "ropeserve_build_info",
            "Version, device and rotation kernel.",
            ["version", "device", "kernel"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.table_cache_entries = Gauge(
            "ropeserve_rope_table_cache_entries",
            "Cached rope tables (bounded LRU; with workers: the sum of theirs).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.batch_queue_seconds = Histogram(
            "ropeserve_batch_queue_seconds",
            "Time a rotation request waited in the batch queue.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.batch_compute_seconds = Histogram(
            "ropeserve_batch_compute_seconds",
            "Kernel time of one batched rotation call.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "ropeserve_batch_size_requests", "Requests fused into one kernel call.", buckets=COUNT_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "ropeserve_batch_tokens", "Tokens in one kernel call.", buckets=TOKEN_BUCKETS, registry=r
        )
        self.queue_depth = Gauge(
            "ropeserve_batch_queue_depth",
            "Rotation requests waiting to be batched.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.dropped = Counter(
            "ropeserve_dropped_requests", "Requests dropped before compute (client gone).", registry=r
        )
        self.lint_findings = Counter(
            "ropeserve_lint_findings", "Config lint findings reported.", ["rule", "severity"], registry=r
        )

    def exposition(self) -> bytes:
        """The registry in Prometheus text format; with workers, every worker's values combined."""
        directory = os.environ.get(MULTIPROC_DIR_ENV)
        if not directory:
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        MultiProcessCollector(combined, path=directory)
        return generate_latest(combined)
