"""Prometheus metrics of the agent's metadata manager (rlmm), read from its public state at scrape time.

Applied offsets and halted partitions are cheap reads of the manager. Lag needs the metadata partitions' end
offsets (one ListOffsets round trip to Kafka), cached for END_OFFSETS_TTL_S. The view's segment count and bytes
need a scan of the view's segments: it is rescanned only when the view changed (its applied offsets moved), and
no sooner than SCAN_SPACING times the last scan's duration after it, so scanning takes at most ~1/SCAN_SPACING of
one core however big the view and however often Prometheus scrapes (a small view is fresh at every scrape; a
view that takes 5 s to scan, ~100k segments, is rescanned at most every 500 s). The scan runs beside the scrape,
which waits for it at most SCAN_WAIT_S.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from rlmm.event_log import OffsetReader
from rlmm.manager import CLIENT_PREFIX
from rlmm.types import RemoteLogSegmentState
from tierlog.migration.metrics import migration_families
from tierlog.migration.node import MigratingManager

log = logging.getLogger(__name__)

T = TypeVar("T")

END_OFFSETS_TTL_S = 10.0
END_OFFSETS_TIMEOUT_S = 2.0
SCAN_SPACING = 100.0
SCAN_WAIT_S = 1.0


@dataclass(frozen=True)
class ViewTotals:
    """Segments in the view and their bytes, by segment state name; and the user partitions it knows."""

    segments: Mapping[str, int]
    segment_bytes: Mapping[str, int]
    user_partitions: int


def view_totals(view: Any) -> ViewTotals:
    """One scan of the view's segments (costly on a big view: callers cache it). Every state is present."""
    segments = {state.name: 0 for state in RemoteLogSegmentState}
    segment_bytes = dict(segments)
    for segment in view.segments():
        state = segment.state.name
        segments[state] = segments.get(state, 0) + 1
        segment_bytes[state] = segment_bytes.get(state, 0) + segment.segment_size_in_bytes
    return ViewTotals(segments, segment_bytes, len(view.user_partitions()))


class _Cached(Generic[T]):
    """A value recomputed at most every `ttl_s` seconds; a failed computation is cached too (as None), so a
    Kafka outage costs one timeout per TTL instead of one per scrape."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self._ttl = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._value: T | None = None
        self._at: float | None = None
        self._key: object = None

    def get(self, key: object, compute: Callable[[], T]) -> T | None:
        """The cached value for `key` (a new key, e.g. a new manager instance, recomputes at once)."""
        with self._lock:
            now = self._clock()
            if self._at is None or key is not self._key or now - self._at >= self._ttl:
                try:
                    self._value = compute()
                except Exception as exc:  # one failed read must not fail the whole scrape
                    log.info("metrics: %s", exc)
                    self._value = None
                self._at, self._key = now, key
            return self._value


class ViewScan:
    """The view's totals, rescanned when the view changed and the last scan is SCAN_SPACING durations old.

    The scan runs on its own thread: a scrape waits at most SCAN_WAIT_S for a scan it started (a small view is
    fresh at once), then answers with the previous totals, so a big view never makes a scrape time out.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._done = threading.Condition()
        self._totals: ViewTotals | None = None
        self._seen: tuple[object, dict[int, int]] | None = None  # (manager, its applied offsets) last scanned
        self._next_at = 0.0
        self._running = False

    def get(self, manager: Any, applied: dict[int, int]) -> ViewTotals | None:
        with self._done:
            changed = self._seen is None or self._seen[0] is not manager or self._seen[1] != applied
            if changed and not self._running and self._clock() >= self._next_at:
                self._running = True
                threading.Thread(
                    target=self._scan, args=(manager, applied), name="tierlog-metrics-view-scan", daemon=True
                ).start()
            if self._running:
                self._done.wait_for(lambda: not self._running, timeout=SCAN_WAIT_S)
            return self._totals

    def _scan(self, manager: Any, applied: dict[int, int]) -> None:
        started = self._clock()
        totals: ViewTotals | None
        try:
            totals = view_totals(manager.view)
        except Exception as exc:  # a closing manager's view: no totals until the next scan
            log.info("metrics: scanning the view failed: %s", exc)
            totals = None
        finished = self._clock()
        with self._done:
            self._totals, self._seen = totals, (manager, applied)
            self._next_at = finished + SCAN_SPACING * (finished - started)
            self._running = False
            self._done.notify_all()


def kafka_end_offsets(config: Mapping[str, Any]) -> Callable[[str, list[int]], dict[int, int]]:
    """End offsets of the metadata partitions, read as the rlmm reads them (its OffsetReader) with the rlmm's
    bootstrap servers and Kafka client settings (`kafka.*` keys), on a client of the metrics' own."""
    client = {"bootstrap.servers": config["bootstrap.servers"]}
    client |= {k[len(CLIENT_PREFIX) :]: v for k, v in config.items() if k.startswith(CLIENT_PREFIX)}
    readers: dict[str, OffsetReader] = {}

    def end_offsets(topic: str, partitions: list[int]) -> dict[int, int]:
        reader = readers.setdefault(topic, OffsetReader(topic, client))
        return reader.end_offsets(partitions, END_OFFSETS_TIMEOUT_S)

    return end_offsets


class RlmmCollector(Collector):
    """Exports the manager that `manager()` returns (None: not created yet, or closed: nothing exported)."""

    def __init__(
        self,
        manager: Callable[[], Any | None],
        end_offsets: Callable[[str, list[int]], dict[int, int]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._manager = manager
        self._end_offsets = end_offsets
        self._ends: _Cached[dict[int, int]] = _Cached(END_OFFSETS_TTL_S, clock)
        self._totals = ViewScan(clock)
        self._migration_lag: _Cached[dict[int, int]] = _Cached(END_OFFSETS_TTL_S, clock)

    def collect(self) -> Iterator[Any]:
        manager = self._manager()
        if manager is None:
            return
        partitions = list(range(manager.num_partitions))
        applied = manager.applied_offsets()
        halted = manager.metadata_errors()
        ends = self._ends.get(manager, lambda: self._end_offsets(manager.metadata_topic, partitions))

        applied_family = GaugeMetricFamily(
            "tierlog_rlmm_applied_offset",
            "next offset of each metadata partition this node's view will apply (its rate is records applied/s)",
            labels=["partition"],
        )
        halted_family = GaugeMetricFamily(
            "tierlog_rlmm_partition_halted",
            "1 if this node stopped applying the metadata partition (an unreadable record; see the log)",
            labels=["partition"],
        )
        for p in partitions:
            applied_family.add_metric([str(p)], applied.get(p, 0))
            halted_family.add_metric([str(p)], 1 if p in halted else 0)
        yield applied_family
        yield halted_family
        yield GaugeMetricFamily(
            "tierlog_rlmm_halted_partitions", "metadata partitions this node stopped applying", value=len(halted)
        )
        yield GaugeMetricFamily(
            "tierlog_rlmm_partitions_loading",
            "hosted partitions not read into memory yet (after a restart or a leadership change); their lookups are "
            "answered from the view on disk meanwhile",
            value=manager.partitions_loading(),
        )
        applied_records, dropped_records = manager.record_counts()
        yield CounterMetricFamily(
            "tierlog_rlmm_records_applied", "metadata records this node applied to its view", value=applied_records
        )
        yield CounterMetricFamily(
            "tierlog_rlmm_records_dropped",
            "metadata records the state machine dropped as invalid (an invalid transition; the log names each)",
            value=dropped_records,
        )
        if ends is not None:
            end_family = GaugeMetricFamily(
                "tierlog_rlmm_end_offset", "end offset of each metadata partition in Kafka", labels=["partition"]
            )
            lag_family = GaugeMetricFamily(
                "tierlog_rlmm_lag_records",
                "records of each metadata partition in Kafka that this node's view has not applied yet",
                labels=["partition"],
            )
            for p in partitions:
                if p in ends:
                    end_family.add_metric([str(p)], ends[p])
                    lag_family.add_metric([str(p)], max(ends[p] - applied.get(p, 0), 0))
            yield end_family
            yield lag_family
        yield GaugeMetricFamily(
            "tierlog_rlmm_end_offsets_available",
            f"1 if the metadata partitions' end offsets (cached {END_OFFSETS_TTL_S:g} s) could be read from Kafka",
            value=0 if ends is None else 1,
        )
        if isinstance(manager, MigratingManager):  # migration mode (issue 26): tierlog.migration.metrics
            lag = self._migration_lag.get(manager, lambda: manager.import_lag(END_OFFSETS_TIMEOUT_S))
            yield from migration_families(manager, lag)
        totals = self._totals.get(manager, applied)
        if totals is not None:
            segments = GaugeMetricFamily(
                "tierlog_rlmm_view_segments",
                "remote log segments in this node's view by state",
                labels=["state"],
            )
            segment_bytes = GaugeMetricFamily(
                "tierlog_rlmm_view_segment_bytes",
                "bytes of the remote log segments in this node's view by state",
                labels=["state"],
            )
            for state in sorted(totals.segments):
                segments.add_metric([state], totals.segments[state])
                segment_bytes.add_metric([state], totals.segment_bytes[state])
            yield segments
            yield segment_bytes
            yield GaugeMetricFamily(
                "tierlog_rlmm_view_user_partitions",
                "user topic partitions with remote log metadata in this node's view",
                value=totals.user_partitions,
            )


__all__ = [
    "END_OFFSETS_TTL_S", "SCAN_SPACING", "RlmmCollector", "ViewScan", "ViewTotals", "kafka_end_offsets", "view_totals",
]
