"""The agent's Prometheus metrics: every call by service, method and status, streamed bytes, metadata write
latency and failures, build info and component readiness, plus the rsm's own per-operation counters and
latency histograms and the rlmm's state (see rlmm_metrics.py), served as text on a configurable address
(loopback unless told otherwise).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from rsm.metrics import ABSENT_INDEX_COUNTER, LATENCY_BUCKETS_S

DEFAULT_METRICS_ADDRESS = "127.0.0.1"
# A call's outcome label: alerts watch outcome="error" only (see docker/prometheus/alerts.yml).
OK, EXPECTED, ERROR = "ok", "expected", "error"
OUTCOMES = (OK, EXPECTED, ERROR)
# From a write acknowledged and applied in milliseconds to one that hits write.timeout.ms (30 s by default).
WRITE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_CACHE_COUNTERS = {"hits": "index_cache.hits", "misses": "index_cache.misses",
                   "evictions": "index_cache.evictions", "expirations": "index_cache.expirations"}


def _version() -> str:
    try:
        return metadata.version("tierlog")
    except metadata.PackageNotFoundError:
        return "unknown"


class _RsmCollector(Collector):
    """Reads the rsm's counters at scrape time, so they are never copied or double-counted."""

    def __init__(self, snapshot: Callable[[], dict[str, Any] | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        snap = self._snapshot()
        if snap is None:
            return
        requests = CounterMetricFamily(
            "tierlog_rsm_operation_requests", "rsm and storage-backend requests", labels=["operation"]
        )
        errors = CounterMetricFamily(
            "tierlog_rsm_operation_errors",
            "failed requests by error code: S3's (AccessDenied, NoSuchBucket, NoSuchKey, SlowDown, ...), connection, "
            "timeout, or other",
            labels=["operation", "code"],
        )
        moved = CounterMetricFamily(
            "tierlog_rsm_operation_bytes",
            "bytes moved (a fetched stream's bytes are counted as the broker reads them)",
            labels=["operation"],
        )
        latency = HistogramMetricFamily(
            "tierlog_rsm_operation_seconds",
            "request latency (a fetch: until its stream is returned, not read)",
            labels=["operation"],
        )
        bounds = [floatToGoString(b) for b in LATENCY_BUCKETS_S] + ["+Inf"]  # as prometheus_client writes them
        for name, counters in snap.get("operations", {}).items():
            requests.add_metric([name], counters["requests"])
            for code, count in counters["error_codes"].items():
                errors.add_metric([name, code], count)
            moved.add_metric([name], counters["bytes"])
            latency.add_metric(
                [name],
                list(zip(bounds, counters["latency_buckets"], strict=True)),
                counters["latency_ms_total"] / 1000.0,
            )
        yield from (requests, errors, moved, latency)
        events = CounterMetricFamily("tierlog_rsm_events", "rsm event counters", labels=["counter"])
        absent = CounterMetricFamily(
            "tierlog_rsm_index_absent",
            "fetch_index calls for an index the segment does not have (normal for TRANSACTION; not an error)",
            labels=["index_type"],
        )
        cache = CounterMetricFamily(
            "tierlog_rsm_index_cache_requests",
            "packed-index cache lookups by result (hits, misses) and entries dropped (evictions, expirations)",
            labels=["result"],
        )
        counters = snap.get("counters", {})
        for name, value in counters.items():
            if name.startswith(ABSENT_INDEX_COUNTER):
                absent.add_metric([name[len(ABSENT_INDEX_COUNTER) :]], value)
            elif name not in _CACHE_COUNTERS.values():
                events.add_metric([name], value)
        for result, name in _CACHE_COUNTERS.items():
            cache.add_metric([result], counters.get(name, 0))
        yield from (events, absent, cache)
        size = GaugeMetricFamily("tierlog_rsm_index_cache_bytes", "bytes held by the packed-index cache")
        size.add_metric([], snap.get("index_cache", {}).get("bytes", 0))
        yield size
        if "chunk_cache" in snap:  # its counters are tierlog_rsm_events{counter="chunk_cache.*"}
            chunks = GaugeMetricFamily("tierlog_rsm_chunk_cache_bytes", "bytes held by the segment chunk cache")
            chunks.add_metric([], snap["chunk_cache"]["bytes"])
            yield chunks


class _ReadinessCollector(Collector):
    def __init__(self, readiness: Callable[[], dict[str, bool]]) -> None:
        self._readiness = readiness

    def collect(self) -> Iterator[Any]:
        ready = GaugeMetricFamily(
            "tierlog_agent_component_ready",
            "1 if the configured component (rlmm, rsm) is created, 0 while it starts or after its creation failed",
            labels=["component"],
        )
        for name, created in sorted(self._readiness().items()):
            ready.add_metric([name], 1 if created else 0)
        yield ready


class AgentMetrics:
    """One registry per agent (not the process-global one), so tests can run several agents."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "tierlog_agent_calls",
            "calls served, by service, method, gRPC status and outcome: ok, expected (an answer the broker "
            "expects in normal operation: an absent transaction index, not ready yet, a stream closed early) or error",
            ["service", "method", "code", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "tierlog_agent_call_seconds",
            "time to answer a call (streams: until the last chunk)",
            ["service", "method"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2.0, 10.0, 60.0),
        )
        self.streamed = Counter(
            "tierlog_agent_streamed_bytes",
            "bytes streamed back to the broker",
            ["method"],
            registry=self.registry,
        )
        self.write_latency = Histogram(
            "tierlog_rlmm_write_seconds",
            "metadata writes: time until Kafka acknowledged the event and this node's view applied it",
            ["operation"],
            registry=self.registry,
            buckets=WRITE_BUCKETS_S,
        )
        self.write_failures = Counter(
            "tierlog_rlmm_write_failures",
            "metadata writes that failed or timed out, by operation and error type",
            ["operation", "error"],
            registry=self.registry,
        )
        Info("tierlog_build", "the agent's version", registry=self.registry).info(
            {"version": _version(), "python": platform.python_version()}
        )
        Gauge("tierlog_agent_start_time_seconds", "when the agent started (Unix time)",
              registry=self.registry).set(time.time())
        self.up = Gauge("tierlog_agent_up", "1 while the agent serves calls", registry=self.registry)
        self._server: Any = None

    def observe(self, service: str, method: str, code: str, seconds: float, outcome: str = OK) -> None:
        """One answered call; `outcome` is one of OUTCOMES."""
        self.calls.labels(service, method, code, outcome).inc()
        self.latency.labels(service, method).observe(seconds)

    @contextmanager
    def metadata_write(self, operation: str) -> Iterator[None]:
        """Time one metadata write until it is applied; count it as failed if it raises."""
        started = time.perf_counter()
        try:
            yield
        except Exception as exc:
            self.write_failures.labels(operation, type(exc).__name__).inc()
            raise
        finally:
            self.write_latency.labels(operation).observe(time.perf_counter() - started)

    def watch_rsm(self, snapshot: Callable[[], dict[str, Any] | None]) -> None:
        self.registry.register(_RsmCollector(snapshot))

    def watch_components(self, readiness: Callable[[], dict[str, bool]]) -> None:
        """Export the readiness of each configured component (`readiness()`: short name -> created); a component
        this agent does not host (e.g. the broker uses Kafka's own RLMM) is absent, not 0."""
        self.registry.register(_ReadinessCollector(readiness))

    def watch(self, collector: Collector) -> None:
        self.registry.register(collector)

    def serve(self, port: int, address: str = DEFAULT_METRICS_ADDRESS) -> int:
        """Serve the text format on `address`:`port` (0 picks a free port); return the bound port."""
        server, _thread = start_http_server(port, addr=address, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
