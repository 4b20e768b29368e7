"""metrics.py: runtime collectors on the per-app registry, histogram buckets that read well and answer right."""

from __future__ import annotations

import math
from decimal import Decimal

from prometheus_client.parser import text_string_to_metric_families

from ropeserve.metrics import Metrics
from ropeserve.settings import Settings


def families(metrics: Metrics) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(metrics.exposition().decode())}


def bucket_counts(metrics: Metrics, name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a histogram with one series, in bound order."""
    family = families(metrics)[name]
    buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
    return sorted(buckets)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' classic ``histogram_quantile`` (promql/quantile.go, bucketQuantile) for one series."""
    total = buckets[-1][1]
    rank = q * total
    index = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    if index == len(buckets) - 1:
        return buckets[-2][0]
    start, below = (buckets[index - 1][0], buckets[index - 1][1]) if index > 0 else (0.0, 0.0)
    end, count = buckets[index]
    return start + (end - start) * (rank - below) / (count - below)


def test_process_and_python_runtime_metrics_are_exposed() -> None:
    names = families(Metrics()).keys()
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds",
        "process_open_fds",
        "process_start_time_seconds",
        "python_info",
        "python_gc_objects_collected",
    ):
        assert name in names, sorted(names)


def test_two_apps_in_one_process_each_get_the_runtime_metrics() -> None:
    first, second = Metrics(), Metrics()
    assert "process_resident_memory_bytes" in families(first) and "process_resident_memory_bytes" in families(second)


def test_every_le_label_is_a_short_decimal() -> None:
    for family in text_string_to_metric_families(Metrics().exposition().decode()):
        for sample in family.samples:
            le = sample.labels.get("le")
            if le is None or le == "+Inf":
                continue
            bound = Decimal(le)
            short = len(bound.normalize().as_tuple().digits) <= 4
            assert short or bound == bound.to_integral_value(), f"{family.name}: le={le}"


def test_http_buckets_span_a_probe_to_the_drain_timeout_without_a_long_tail() -> None:
    metrics = Metrics()
    metrics.request_duration.labels(route="/health/live", method="GET", status="200").observe(0.001)
    bounds = [b for b, _ in bucket_counts(metrics, "ropeserve_http_request_duration_seconds") if math.isfinite(b)]
    assert bounds[0] >= 0.0005, "buckets below half a millisecond stay empty: no route answers that fast"
    assert bounds[-1] >= Settings().drain_timeout_s, "a request draining at SIGTERM must land in a finite bucket"
    assert len(bounds) <= 15


def test_median_batch_size_is_one_when_every_batch_holds_one_request() -> None:
    metrics = Metrics()
    for _ in range(50):
        metrics.batch_size.observe(1)
    buckets = bucket_counts(metrics, "ropeserve_batch_size_requests")
    assert histogram_quantile(0.5, buckets) == 1.0
    for _ in range(50):
        metrics.batch_size.observe(2)
    assert histogram_quantile(0.75, buckets := bucket_counts(metrics, "ropeserve_batch_size_requests")) == 2.0
    assert histogram_quantile(0.25, buckets) == 1.0
