"""Prometheus metrics: one registry per app, ``ropeserve_`` prefix, base units, ``_total`` counters.

Bucket families live here (one place, as vLLM's ``buckets.py``), written as decimal literals so that every
``le`` label reads as typed (``0.0025``, never ``0.0025000000000000005``):

* HTTP requests: 1 ms to 30 s in a 1-2.5-5 series (probes answer in about 1 ms, cos/sin and position requests in
  1-50 ms, 64 MiB rotations in about 0.1-1 s, overload and drains in seconds).
* Batch queue waits: 50 µs to 1 s (the batcher waits ``batch_max_wait_us``, 500 µs by default, then the kernel).
* Kernel calls: 100 µs to 10 s.
* Requests per batch: half-integer bounds (the first, 0.5, stays empty), so each size from 1 to 4 sits in the
  middle of its own bucket and ``histogram_quantile`` answers 1.0, not 0.5, when every batch holds one request.
"""

from __future__ import annotations

import os

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

# prometheus-client leaves this function unannotated
disable_created_metrics()  # type: ignore[no-untyped-call]

HTTP_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
QUEUE_DURATION_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
COMPUTE_DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 10.0)
BATCH_SIZE_BUCKETS = (0.5, 1.5, 2.5, 3.5, 4.5, 8.5, 16.5, 32.5, 64.5, 128.5, 256.5)
TOKEN_BUCKETS = tuple(float(4**k) for k in range(11))
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Set (by ``ropeserve serve --workers N``) before prometheus-client is imported: values live in files there,
and a scrape of any worker sums them (gauges: each one's ``multiprocess_mode``)."""
RUNTIME_COLLECTORS = (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR)
"""prometheus_client's ``process_*`` (RSS, CPU, open fds, start time) and ``python_*`` collectors."""


def register_runtime_collectors(registry: CollectorRegistry) -> None:
    """Add the process and Python runtime metrics that the default registry has, to a custom ``registry``."""
    for collector in RUNTIME_COLLECTORS:
        registry.register(collector)


class Metrics:
    """All metric objects of one app instance (a fresh registry, so test apps do not collide)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        register_runtime_collectors(r)
        self.requests = Counter(
            "ropeserve_http_requests", "HTTP requests answered.", ["route", "method", "status"], registry=r
        )
        self.request_duration = Histogram(
            "ropeserve_http_request_duration_seconds",
            "Time from request start to response end.",
            ["route", "method", "status"],
            buckets=HTTP_DURATION_BUCKETS,
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
        self.table_cache_bytes = Gauge(
            "ropeserve_rope_table_cache_bytes", "Bytes of cos/sin rows in the rope table cache.", registry=r
        )
        self.batch_queue_seconds = Histogram(
            "ropeserve_batch_queue_seconds",
            "Time a rotation request waited in the batch queue.",
            buckets=QUEUE_DURATION_BUCKETS,
            registry=r,
        )
        self.batch_compute_seconds = Histogram(
            "ropeserve_batch_compute_seconds",
            "Kernel time of one batched rotation call.",
            buckets=COMPUTE_DURATION_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "ropeserve_batch_size_requests",
            "Requests fused into one kernel call.",
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
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
        lint_answers = Counter(
            "ropeserve_lint_answer_cache_lookups",
            "Lint requests by whether their body repeated one answered before (hit: the stored answer was served).",
            ["result"],
            registry=r,
        )
        self.lint_answer_hits = lint_answers.labels(result="hit")
        self.lint_answer_misses = lint_answers.labels(result="miss")
        self.lint_answer_cache_bytes = Gauge(
            "ropeserve_lint_answer_cache_bytes",
            "Bytes charged to the stored lint answers (at most ROPESERVE_LINT_ANSWER_CACHE_BYTES per process).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self._lint_finding_series: dict[tuple[str, str], Counter] = {}
        """``lint_findings`` children per (rule, severity): ``labels()`` costs more than the update. Bounded by the
        registered rules and the three severities."""

    def count_lint_finding(self, rule: str, severity: str) -> None:
        """One more ``lint_findings`` of ``rule`` at ``severity``."""
        key = (rule, severity)
        if (series := self._lint_finding_series.get(key)) is None:
            series = self._lint_finding_series[key] = self.lint_findings.labels(rule=rule, severity=severity)
        series.inc()

    def exposition(self) -> bytes:
        """The registry in Prometheus text format; with workers, every worker's values combined."""
        directory = os.environ.get(MULTIPROC_DIR_ENV)
        if not directory:
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        MultiProcessCollector(combined, path=directory)  # type: ignore[no-untyped-call]
        return generate_latest(combined)
