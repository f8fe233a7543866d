"""The audit loop's Prometheus metrics (tierlog_archiver_*), read from its progress at scrape time; the agent and
`tierlog archive` serve the same ones."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tierlog.audit.loop import STAGES, AuditProgress


class AuditCollector(Collector):
    """Exports the progress `progress()` returns; None (no loop runs here) exports nothing."""

    def __init__(self, progress: Callable[[], AuditProgress | None]) -> None:
        self._progress = progress

    def collect(self) -> Iterator[Any]:
        progress = self._progress()
        if progress is None:
            return
        yield GaugeMetricFamily("tierlog_archiver_running", "1 while the audit loop (archiver and snapshot writer) "
                                "runs in this process", value=1 if progress.running else 0)
        assignment = progress.assignment
        owned = assignment.owned if assignment is not None else frozenset()
        archiving = GaugeMetricFamily(
            "tierlog_archiver_partition_archiving", "1 for each metadata partition this process archives (its "
            "broker leads it), 0 for the topic's others", labels=["partition"])
        for partition in assignment.partitions if assignment is not None else ():
            archiving.add_metric([str(partition)], 1 if partition in owned else 0)
        yield archiving
        archived = GaugeMetricFamily("tierlog_archiver_archived_offset",
                                     "the last offset of the metadata partition in the audit archive",
                                     labels=["partition"])
        lag = GaugeMetricFamily("tierlog_archiver_lag_records",
                                "records of the metadata partition not in the audit archive yet", labels=["partition"])
        last = GaugeMetricFamily(
            "tierlog_archiver_last_archive_timestamp_seconds", "when (Unix time) the archive of the metadata "
            "partition last moved on or was found caught up with the topic", labels=["partition"])
        for partition in sorted(owned):
            label = [str(partition)]
            if progress.archived_end.get(partition, 0) > 0:  # absent until a record is archived
                archived.add_metric(label, progress.archived_end[partition] - 1)
            if partition in progress.lag:
                lag.add_metric(label, progress.lag[partition])
            if partition in progress.last_archived_s:
                last.add_metric(label, progress.last_archived_s[partition])
        yield from (archived, lag, last)
        if progress.last_snapshot_s is not None:
            yield GaugeMetricFamily("tierlog_archiver_last_snapshot_timestamp_seconds", "when (Unix time) the last "
                                    "bootstrap snapshot was written, or found current", value=progress.last_snapshot_s)
        yield CounterMetricFamily("tierlog_archiver_snapshots_written", "bootstrap snapshots written",
                                  value=progress.snapshots_written)
        failures = CounterMetricFamily(
            "tierlog_archiver_failures", "failures of the audit loop by stage (leadership: describing the metadata "
            "topic; archive; snapshot), each retried with backoff (the log has the error)", labels=["stage"])
        for stage in STAGES:
            failures.add_metric([stage], progress.failures[stage])
        yield failures
        yield CounterMetricFamily(
            "tierlog_archiver_gaps", "ranges compaction removed before the archiver copied them: the audit trail has "
            "a hole (the log names the offsets)", value=progress.gaps)
