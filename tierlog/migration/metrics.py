"""Prometheus metrics of a node in migration mode (tierlog.migration.node), exported with the rlmm's metrics by the
agent's collector (tierlog.agent.rlmm_metrics): what the import took in, how far behind `__remote_log_metadata` it is,
the writes to that topic that failed, and whether the migration is finalized."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tierlog.migration.node import MigratingManager


def migration_families(manager: MigratingManager, lag: Mapping[int, int] | None) -> Iterator[Any]:
    """The migration's metric families; `lag` is `manager.import_lag()`'s answer, or None when it could not be read."""
    records = CounterMetricFamily(
        "tierlog_migration_records", "records of the source topic this node's import decided, by outcome: "
        "imported (written into tierlog), present (tierlog held it already), dropped (Kafka's rules drop it)",
        labels=["outcome"])
    for outcome, count in (("imported", manager.imported), ("present", manager.skipped),
                           ("dropped", manager.dropped)):
        records.add_metric([outcome], count)
    yield records
    yield CounterMetricFamily(
        "tierlog_migration_source_write_failures",
        "this node's writes to the source topic that failed (the broker's call failed; it retries)",
        value=manager.source_write_failures)
    yield GaugeMetricFamily(
        "tierlog_migration_finalized", "1 once `tierlog migrate finalize` ran: writes go to tierlog's topic directly",
        value=1 if manager.finalized else 0)
    if lag is not None:
        family = GaugeMetricFamily(
            "tierlog_migration_import_lag_records",
            "records of each source partition the migrating nodes' import group has not committed yet",
            labels=["partition"])
        for partition, behind in sorted(lag.items()):
            family.add_metric([str(partition)], behind)
        yield family
    yield GaugeMetricFamily(
        "tierlog_migration_import_lag_available", "1 if the import's lag could be read from Kafka",
        value=0 if lag is None else 1)
