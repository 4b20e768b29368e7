"""Prometheus metrics: one registry per app, ``ropeserve_`` prefix, base units, ``_total`` counters.

Bucket families live here (one place, as vLLM's ``buckets.py``): RoPE work takes microseconds to seconds,
so durations use geometric buckets from 10 µs growing ×1.5 (35 buckets, up to ~15 s).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()

DURATION_BUCKETS = tuple(1e-5 * 1.5**k for k in range(35))
COUNT_BUCKETS = tuple(float(2**k) for k in range(13))
TOKEN_BUCKETS = tuple(float(2**k) for k in range(21))


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
        self.in_flight = Gauge("ropeserve_http_requests_in_flight", "Requests being handled now.", registry=r)
        self.errors = Counter(
            "ropeserve_http_errors", "Error responses by problem type.", ["error_type", "status"], registry=r
        )
        self.ready = Gauge(
            "ropeserve_ready", "1 when the service accepts work, 0 while warming or draining.", registry=r
        )
        self.build_info = Gauge(
            "ropeserve_build_info", "Version, device and rotation kernel.", ["version", "device", "kernel"], registry=r
        )
        self.table_cache_entries = Gauge(
            "ropeserve_rope_table_cache_entries", "Cached rope tables (bounded LRU).", registry=r
        )
        self.table_cache_bytes = Gauge(
            "ropeserve_rope_table_cache_bytes", "Bytes of cos/sin rows in the rope table cache.", registry=r
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
        self.queue_depth = Gauge("ropeserve_batch_queue_depth", "Rotation requests waiting to be batched.", registry=r)
        self.dropped = Counter(
            "ropeserve_dropped_requests", "Requests dropped before compute (client gone).", registry=r
        )
        self.lint_findings = Counter(
            "ropeserve_lint_findings", "Config lint findings reported.", ["rule", "severity"], registry=r
        )

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
