"""The agent's Prometheus metrics: every call by service, method and status, streamed bytes, and the
rsm's own per-operation counters (S3 requests, bytes, errors), served as text on a loopback port.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


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
        errors = CounterMetricFamily("tierlog_rsm_operation_errors", "failed requests", labels=["operation"])
        moved = CounterMetricFamily("tierlog_rsm_operation_bytes", "bytes moved", labels=["operation"])
        for name, counters in snap.get("operations", {}).items():
            requests.add_metric([name], counters.get("requests", 0))
            errors.add_metric([name], counters.get("errors", 0))
            moved.add_metric([name], counters.get("bytes", 0))
        yield from (requests, errors, moved)
        events = CounterMetricFamily("tierlog_rsm_events", "rsm event counters", labels=["counter"])
        for name, value in snap.get("counters", {}).items():
            events.add_metric([name], value)
        yield events
        cache = GaugeMetricFamily("tierlog_rsm_index_cache_bytes", "bytes held by the packed-index cache")
        cache.add_metric([], snap.get("index_cache", {}).get("bytes", 0))
        yield cache


class AgentMetrics:
    """One registry per agent (not the process-global one), so tests can run several agents."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "tierlog_agent_calls",
            "calls served, by service, method and gRPC status",
            ["service", "method", "code"],
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
        self._server: Any = None

    def observe(self, service: str, method: str, code: str, seconds: float) -> None:
        self.calls.labels(service, method, code).inc()
        self.latency.labels(service, method).observe(seconds)

    def watch_rsm(self, snapshot: Callable[[], dict[str, Any] | None]) -> None:
        self.registry.register(_RsmCollector(snapshot))

    def serve(self, port: int) -> int:
        """Serve the text format on 127.0.0.1:`port` (0 picks a free port); return the bound port."""
        server, _thread = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        self._server = server
        return int(server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
