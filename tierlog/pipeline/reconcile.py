"""Reconcile job: join a listing of the bucket with the metadata as it stands now to find what disagrees.

Orphans are objects no segment in the metadata references, objects of a partition whose deletion the metadata
records (Kafka's partition-delete path), and objects of topics the operator confirmed deleted by id: a delete
plan, each with its reason, deleted only on request, when the metadata had caught up with the topic when the
bucket was listed and the plan is a small share of the live bytes. A topic the cluster merely does not list is
never a reason: a listing is no proof of deletion. Objects younger than the grace period are never orphans (their
upload may still be under way). Segments in DELETE_SEGMENT_STARTED are neither live nor orphans: their deletion is
pending (a failed copy's, or one cut short), and reconcile can finish it. Missing objects are COPY_SEGMENT_FINISHED
segments whose objects are gone; size mismatches are `.log` objects whose size is not the segment's size. The rules
live in `classify_segment`; small inputs run them in-process, large ones (or on request) on Spark, through the same
function. Nothing here imports pyspark at module level.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlmm.archive import ARCHIVE_ROOT
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)
from rsm.backend import ObjectInfo, StorageBackend
from rsm.keys import INDEXES_SUFFIX, LOG_SUFFIX, parse_object_key, segment_keys
from tierlog.errors import TierlogError

if TYPE_CHECKING:
    from concurrent.futures import Future

    from pyspark.sql import DataFrame, SparkSession

DELETE_BATCH = 1000
# Longer than any upload can take (a multipart upload's object carries the time the upload started) plus
# the broker's metadata write after it.
DEFAULT_GRACE_MS = 6 * 3_600_000
# Above this many objects the rules run on Spark; below it a Spark session costs more than the work.
SPARK_THRESHOLD_OBJECTS = 200_000

# A delete plan larger than this share of the bytes the metadata holds live is refused unless explicitly allowed.
DEFAULT_MAX_DELETE_SHARE = 0.05

ORPHAN_UNREFERENCED = "no segment in the metadata references it"
ORPHAN_TOPIC_DELETED = "its topic was deleted from the cluster (confirmed with --deleted-topic-id)"
ORPHAN_PARTITION_DELETED = "the metadata records its partition's deletion (Kafka's partition-delete path)"

DELETION_PENDING = RemoteLogSegmentState.DELETE_SEGMENT_STARTED.name
# A partition in these delete states is being (or was) removed by Kafka's own path: its objects all go.
PARTITION_DELETING_STATES = frozenset({"DELETE_PARTITION_STARTED", "DELETE_PARTITION_FINISHED"})


class MetadataBehindError(TierlogError):
    """The metadata source had not caught up with the topic when the bucket was listed: deleting is unsafe."""


class LargeDeleteError(TierlogError):
    """The delete plan would remove more than the allowed share of the live bytes."""


@dataclass(frozen=True, slots=True)
class LiveSegment:
    """A segment the metadata still holds (any state but DELETE_SEGMENT_FINISHED), in reconcile's terms."""

    topic_id: str
    partition: int
    topic: str
    segment_id: str
    state: str
    start_offset: int
    segment_size_in_bytes: int
    # When the segment reached its state; None when the source does not say (the archive fold).
    event_timestamp_ms: int | None = None

    @classmethod
    def of(cls, md: RemoteLogSegmentMetadata) -> LiveSegment:
        tp = md.topic_id_partition
        return cls(str(tp.topic_id), tp.partition, tp.topic, str(md.remote_log_segment_id.id), md.state.name,
                   md.start_offset, md.segment_size_in_bytes, md.event_timestamp_ms)


@dataclass(frozen=True, slots=True)
class BucketObject:
    """One listed object, with the segment it names when its key follows rsm.keys' layout."""

    key: str
    size: int
    last_modified_ms: int | None
    segment_id: str | None = None
    topic: str | None = None
    topic_id: str | None = None
    kind: str | None = None

    @classmethod
    def of(cls, info: ObjectInfo) -> BucketObject:
        parsed = parse_object_key(info.key)
        if parsed is None:
            return cls(info.key, info.size, info.last_modified_ms)
        return cls(info.key, info.size, info.last_modified_ms, str(parsed.segment_id), parsed.topic,
                   str(parsed.topic_id), parsed.suffix)


@dataclass(frozen=True, slots=True)
class ReconcileRules:
    """What decides a verdict besides the two listings: when the bucket was listed, the grace period, the
    topics (by id) the operator confirmed deleted, the partitions (topic id, partition) whose deletion the metadata
    records, and the key layout."""

    listed_at_ms: int
    grace_ms: int = DEFAULT_GRACE_MS
    deleted_topic_ids: frozenset[str] = frozenset()
    deleting_partitions: frozenset[tuple[str, int]] = frozenset()
    hashed_keys: bool = False


@dataclass(frozen=True, slots=True)
class TopicHoldings:
    """What the metadata holds live (COPY_SEGMENT_STARTED or FINISHED) of one topic."""

    topic_id: str
    topic: str
    segments: int
    bytes: int


@dataclass(frozen=True, slots=True)
class DeleteLimit:
    """How much of the live bytes a delete plan may remove before it needs an explicit second flag."""

    max_share: float = DEFAULT_MAX_DELETE_SHARE
    allow_large: bool = False


@dataclass(frozen=True, slots=True)
class MetadataFreshness:
    """How far a metadata source had read the metadata topic, against the topic's end offsets sampled
    after the bucket was listed: every listed object's COPY_SEGMENT_STARTED event lies below those ends."""

    source: str
    applied: Mapping[int, int]
    topic_ends: Mapping[int, int]

    @property
    def behind(self) -> dict[int, int]:
        """Records not yet read, per metadata partition (only partitions that are behind)."""
        lag = {p: end - self.applied.get(p, 0) for p, end in self.topic_ends.items()}
        return {p: n for p, n in sorted(lag.items()) if n > 0}

    def describe_lag(self) -> str:
        behind = self.behind
        per_partition = ", ".join(f"partition {p}: {n}" for p, n in behind.items())
        return f"{sum(behind.values())} records ({per_partition})"

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "behind_records": sum(self.behind.values()),
                "behind": {str(p): n for p, n in self.behind.items()},
                "topic_end_offsets": {str(p): n for p, n in sorted(self.topic_ends.items())}}


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    objects: int
    live_topics: tuple[TopicHoldings, ...]
    orphans: tuple[dict[str, Any], ...]
    missing: tuple[dict[str, Any], ...]
    size_mismatches: tuple[dict[str, Any], ...]
    unrecognized: tuple[str, ...]
    too_young: tuple[dict[str, Any], ...] = ()
    # One row per DELETE_SEGMENT_STARTED segment; `finishable` once its state is older than the grace period.
    deletion_pending: tuple[dict[str, Any], ...] = ()
    grace_ms: int = DEFAULT_GRACE_MS
    deleted: tuple[str, ...] = field(default=())
    finished: tuple[str, ...] = field(default=())  # segment ids given DELETE_SEGMENT_FINISHED

    @property
    def live_segments(self) -> int:
        return sum(t.segments for t in self.live_topics)

    @property
    def live_bytes(self) -> int:
        return sum(t.bytes for t in self.live_topics)

    @property
    def pending_to_finish(self) -> tuple[dict[str, Any], ...]:
        return tuple(p for p in self.deletion_pending if p["finishable"])

    @property
    def clean(self) -> bool:
        return not (self.orphans or self.missing or self.size_mismatches or self.pending_to_finish)

    def delete_plan(self) -> list[str]:
        """Every object `--delete` removes: the orphans, and the listed objects of pending deletions it finishes."""
        return sorted([o["key"] for o in self.orphans] + [k for p in self.pending_to_finish for k in p["keys"]])

    @property
    def plan_bytes(self) -> int:
        return sum(o["size"] for o in self.orphans) + sum(p["object_bytes"] for p in self.pending_to_finish)

    def as_json(self) -> dict[str, Any]:
        return {
            "objects": self.objects,
            "live_segments": self.live_segments,
            "live_bytes": self.live_bytes,
            "live_topics": [dataclasses.asdict(t) for t in self.live_topics],
            "grace_ms": self.grace_ms,
            "orphan_count": len(self.orphans),
            "missing_count": len(self.missing),
            "size_mismatch_count": len(self.size_mismatches),
            "too_young_count": len(self.too_young),
            "deletion_pending_count": len(self.deletion_pending),
            "deletion_pending_bytes": sum(p["size"] for p in self.deletion_pending),
            "plan_bytes": self.plan_bytes,
            "orphans": list(self.orphans),
            "missing": list(self.missing),
            "size_mismatches": list(self.size_mismatches),
            "too_young": list(self.too_young),
            "deletion_pending": list(self.deletion_pending),
            "unrecognized": list(self.unrecognized),
            "deleted": list(self.deleted),
            "finished": list(self.finished),
        }


# --- the rules -------------------------------------------------------------------------------------------

def orphan_reason(topic_id: str | None, live: LiveSegment | None, rules: ReconcileRules) -> str | None:
    """Why a segment's objects may go, or None while the metadata holds the segment live."""
    if topic_id in rules.deleted_topic_ids:
        return ORPHAN_TOPIC_DELETED
    if live is None:
        return ORPHAN_UNREFERENCED
    if (live.topic_id, live.partition) in rules.deleting_partitions:
        return ORPHAN_PARTITION_DELETED
    return None


def classify_segment(
    objects: Iterable[BucketObject], live: LiveSegment | None, rules: ReconcileRules
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every finding for one segment id: its listed objects against its metadata (None: nothing holds it).

    Yields (category, row), category one of orphan, too_young, missing, size_mismatch, deletion_pending.
    """
    listed = list(objects)
    if live is not None and live.state == DELETION_PENDING:
        yield "deletion_pending", _pending_row(live, listed, rules)
        return
    topic_id = live.topic_id if live is not None else (listed[0].topic_id if listed else None)
    reason = orphan_reason(topic_id, live, rules)
    for obj in listed:
        if live is not None and obj.kind == LOG_SUFFIX and obj.size != live.segment_size_in_bytes:
            yield "size_mismatch", {"key": obj.key, "size": obj.size, "expected_size": live.segment_size_in_bytes,
                                    "segment_id": live.segment_id}
        if reason is None:
            continue
        age_ms = None if obj.last_modified_ms is None else rules.listed_at_ms - obj.last_modified_ms
        row = {"key": obj.key, "size": obj.size, "segment_id": obj.segment_id, "topic": obj.topic,
               "age_s": None if age_ms is None else age_ms // 1000}
        if age_ms is None or age_ms < rules.grace_ms:
            # Its upload may still be under way, its metadata event not yet readable: never a candidate.
            yield "too_young", {**row, "reason": f"{reason}, but it is younger than the grace period"}
        else:
            yield "orphan", {**row, "reason": reason}
    if live is None or reason is not None or live.state != "COPY_SEGMENT_FINISHED":
        return
    if live.event_timestamp_ms is not None and live.event_timestamp_ms > rules.listed_at_ms:
        return  # finished after the listing started: the listing may predate its objects
    present = {obj.kind for obj in listed}
    for kind in (LOG_SUFFIX, INDEXES_SUFFIX):
        if kind not in present:
            yield "missing", {"key": expected_key(live, kind, rules.hashed_keys), "segment_id": live.segment_id,
                              "topic": live.topic, "partition": live.partition, "kind": kind}


def _pending_row(live: LiveSegment, listed: list[BucketObject], rules: ReconcileRules) -> dict[str, Any]:
    """A segment whose deletion started and never finished. Finishable once its state is older than the grace
    period: a broker deleting it right now is done by then (or failed, as a failed copy's cleanup does)."""
    age_ms = None if live.event_timestamp_ms is None else rules.listed_at_ms - live.event_timestamp_ms
    expected = [expected_key(live, kind, rules.hashed_keys) for kind in (LOG_SUFFIX, INDEXES_SUFFIX)]
    return {"segment_id": live.segment_id, "topic": live.topic, "topic_id": live.topic_id,
            "partition": live.partition, "size": live.segment_size_in_bytes,
            "keys": sorted({obj.key for obj in listed} | set(expected)),
            "object_bytes": sum(obj.size for obj in listed),
            "age_s": None if age_ms is None else age_ms // 1000,
            "finishable": age_ms is not None and age_ms >= rules.grace_ms}


def expected_key(live: LiveSegment, kind: str, hashed: bool) -> str:
    tp = TopicIdPartition(uuid.UUID(live.topic_id), live.topic, live.partition)
    keys = segment_keys(RemoteLogSegmentId(tp, uuid.UUID(live.segment_id)), live.start_offset, hashed)
    return keys.log if kind == LOG_SUFFIX else keys.indexes


def topic_holdings(live_segments: Iterable[LiveSegment]) -> tuple[TopicHoldings, ...]:
    """Per topic, the live segments (any state but DELETE_SEGMENT_STARTED) and their bytes."""
    held: dict[tuple[str, str], list[int]] = {}
    for s in live_segments:
        if s.state != DELETION_PENDING:
            counts = held.setdefault((s.topic_id, s.topic), [0, 0])
            counts[0] += 1
            counts[1] += s.segment_size_in_bytes
    return _holdings((topic_id, topic, n, size) for (topic_id, topic), (n, size) in held.items())


def _holdings(rows: Iterable[tuple[str, str, int, int]]) -> tuple[TopicHoldings, ...]:
    return tuple(sorted((TopicHoldings(*row) for row in rows), key=lambda t: (t.topic, t.topic_id)))


def _report(
    objects: int, live_topics: tuple[TopicHoldings, ...], findings: Iterable[tuple[str, dict[str, Any]]],
    unrecognized: Iterable[str], rules: ReconcileRules,
) -> ReconcileReport:
    found: dict[str, list[dict[str, Any]]] = {
        "orphan": [], "too_young": [], "missing": [], "size_mismatch": [], "deletion_pending": []}
    for category, row in findings:
        found[category].append(row)
    return ReconcileReport(
        objects=objects, live_topics=live_topics,
        orphans=tuple(sorted(found["orphan"], key=lambda r: r["key"])),
        missing=tuple(sorted(found["missing"], key=lambda r: (r["topic"], r["partition"], r["key"]))),
        size_mismatches=tuple(sorted(found["size_mismatch"], key=lambda r: r["key"])),
        unrecognized=tuple(sorted(unrecognized)),
        too_young=tuple(sorted(found["too_young"], key=lambda r: r["key"])),
        deletion_pending=tuple(sorted(found["deletion_pending"], key=lambda r: (r["topic"], r["partition"],
                                                                                 r["segment_id"]))),
        grace_ms=rules.grace_ms,
    )


# --- running the rules -----------------------------------------------------------------------------------

def list_bucket(store: StorageBackend) -> tuple[list[ObjectInfo], int]:
    """The bucket's segment objects (audit files left out) and when the listing started (ms)."""
    started_ms = int(time.time() * 1000)
    return [o for o in store.list("") if not o.key.startswith(f"{ARCHIVE_ROOT}/")], started_ms


def reconcile_in_process(
    objects: Iterable[ObjectInfo], live_segments: Iterable[LiveSegment], rules: ReconcileRules
) -> ReconcileReport:
    """The rules over in-memory listings: what `verify bucket` and `reconcile` use below the Spark threshold."""
    parsed = [BucketObject.of(o) for o in objects]
    by_segment: dict[str, list[BucketObject]] = {}
    for obj in parsed:
        if obj.segment_id is not None:
            by_segment.setdefault(obj.segment_id, []).append(obj)
    live = {s.segment_id: s for s in live_segments}
    findings = (
        finding
        for segment_id in by_segment.keys() | live.keys()
        for finding in classify_segment(by_segment.get(segment_id, ()), live.get(segment_id), rules)
    )
    unrecognized = (o.key for o in parsed if o.segment_id is None)
    return _report(len(parsed), topic_holdings(live.values()), findings, unrecognized, rules)


def reconcile_on_spark(
    spark: SparkSession, objects: Iterable[ObjectInfo], live_segments: DataFrame, rules: ReconcileRules
) -> ReconcileReport:
    """The same rules on Spark: objects and segments co-grouped by segment id, then `classify_segment`."""
    from pyspark.sql import functions as F

    parsed = [BucketObject.of(o) for o in objects]
    recognized = spark.sparkContext.parallelize([(o.segment_id, o) for o in parsed if o.segment_id is not None])
    live = live_segments.rdd.map(lambda row: (row["segment_id"], _live_of_row(row)))

    def verdicts(item: tuple[str, tuple[Iterable[BucketObject], Iterable[LiveSegment]]]) -> list[Any]:
        listed, held = item[1]
        return list(classify_segment(listed, next(iter(held), None), rules))

    findings = recognized.cogroup(live).flatMap(verdicts).collect()
    holdings = _holdings(
        (r["topic_id"], r["topic"], int(r["segments"]), int(r["bytes"]))
        for r in live_segments.where(F.col("state") != DELETION_PENDING).groupBy("topic_id", "topic")
        .agg(F.count("*").alias("segments"), F.sum("segment_size_in_bytes").alias("bytes")).collect()
    )
    unrecognized = (o.key for o in parsed if o.segment_id is None)
    return _report(len(parsed), holdings, findings, unrecognized, rules)


def _live_of_row(row: Any) -> LiveSegment:
    values = row.asDict()
    timestamp = values.get("event_timestamp_ms")
    return LiveSegment(
        values["topic_id"], int(values["partition"]), values["topic"], values["segment_id"], values["state"],
        int(values["start_offset"]), int(values["segment_size_in_bytes"]),
        None if timestamp is None else int(timestamp),
    )


def reconcile(
    spark: SparkSession,
    live_segments: DataFrame,
    store: StorageBackend,
    hashed_keys: bool = False,
    delete_orphans: bool = False,
    grace_ms: int = DEFAULT_GRACE_MS,
    freshness: MetadataFreshness | None = None,
    limit: DeleteLimit = DeleteLimit(),
) -> ReconcileReport:
    """The Spark job: `live_segments` has topic_id, partition, topic, segment_id, state, start_offset,
    segment_size_in_bytes (optionally event_timestamp_ms) for every segment the metadata still holds.
    Deleting needs `freshness`, the proof that the metadata had caught up with the topic."""
    objects, listed_at_ms = list_bucket(store)
    rules = ReconcileRules(listed_at_ms, grace_ms, hashed_keys=hashed_keys)
    report = reconcile_on_spark(spark, objects, live_segments, rules)
    return delete_orphans_of(report, store, freshness, limit) if delete_orphans else report


def check_delete_allowed(report: ReconcileReport, freshness: MetadataFreshness | None, limit: DeleteLimit) -> None:
    """Refuse (MetadataBehindError, LargeDeleteError) a plan that may delete live data: the metadata source was
    behind the topic, or the plan is larger than `limit.max_share` of the live bytes without `limit.allow_large`."""
    if freshness is None:
        raise MetadataBehindError(
            "refusing to delete: nothing proves the metadata source had caught up with the metadata topic when "
            "the bucket was listed, so objects it does not know may be live segments"
        )
    if freshness.behind:
        raise MetadataBehindError(
            f"refusing to delete: {freshness.source} is behind the metadata topic by {freshness.describe_lag()}, "
            "so objects it does not know may be live segments. The metadata side is stale, not the bucket: let "
            "it catch up (or reconcile against the topic, the default source) and run reconcile again"
        )
    plan, live = report.plan_bytes, report.live_bytes
    if limit.allow_large or plan == 0 or plan <= limit.max_share * live:
        return
    share = f"{plan / live:.1%} of the {live:,} bytes" if live else "while it holds no live bytes (0 bytes)"
    raise LargeDeleteError(
        f"refusing to delete: the plan removes {plan:,} bytes in {len(report.delete_plan())} objects, {share} the "
        f"metadata holds live; the limit is {limit.max_share:.1%} (--max-delete-share). A plan this large usually "
        "means the wrong metadata (another cluster, a wrong metadata topic): check the plan (--report-dir), and "
        "rerun with --allow-large-delete if it is right"
    )


def delete_orphans_of(
    report: ReconcileReport, store: StorageBackend, freshness: MetadataFreshness | None,
    limit: DeleteLimit = DeleteLimit(),
) -> ReconcileReport:
    """Delete exactly the report's orphans, once `check_delete_allowed` lets the plan through."""
    check_delete_allowed(report, freshness, limit)
    plan = sorted(o["key"] for o in report.orphans)
    _delete(store, plan)
    return dataclasses.replace(report, deleted=tuple(plan))


def _delete(store: StorageBackend, keys: list[str]) -> None:
    for i in range(0, len(keys), DELETE_BATCH):
        store.delete(keys[i:i + DELETE_BATCH])


def finish_pending_deletions(
    report: ReconcileReport, store: StorageBackend,
    update: Callable[[RemoteLogSegmentMetadataUpdate], Future[None]], broker_id: int, timeout_s: float,
) -> ReconcileReport:
    """Finish what Kafka's delete path left half done: delete every object of each finishable
    DELETE_SEGMENT_STARTED segment (absent ones are fine), then append its DELETE_SEGMENT_FINISHED through
    `update` (a manager's `update_remote_log_segment_metadata`), as the broker would have. Idempotent."""
    pending = report.pending_to_finish
    keys = sorted({k for p in pending for k in p["keys"]})
    _delete(store, keys)
    finished = []
    for p in pending:
        tp = TopicIdPartition(uuid.UUID(p["topic_id"]), p["topic"], p["partition"])
        segment_id = RemoteLogSegmentId(tp, uuid.UUID(p["segment_id"]))
        update(RemoteLogSegmentMetadataUpdate(
            segment_id, int(time.time() * 1000), None, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED, broker_id,
        )).result(timeout_s)
        finished.append(p["segment_id"])
    return dataclasses.replace(report, deleted=tuple(sorted({*report.deleted, *keys})), finished=tuple(finished))


LIVE_SEGMENT_DDL = ("topic_id string, partition long, topic string, segment_id string, state string, "
                    "start_offset long, segment_size_in_bytes long, event_timestamp_ms long")


def live_segments_frame(spark: SparkSession, segments: Iterable[LiveSegment]) -> DataFrame:
    """Live segments in the columns `reconcile` joins on."""
    return spark.createDataFrame([dataclasses.astuple(s) for s in segments], LIVE_SEGMENT_DDL)


def topic_names(objects: Iterable[ObjectInfo], live: Iterable[LiveSegment]) -> dict[str, str]:
    """Topic id -> name for every topic the bucket or the metadata mentions."""
    named = {s.topic_id: s.topic for s in live}
    for obj in map(BucketObject.of, objects):
        if obj.topic_id is not None and obj.topic is not None:
            named.setdefault(obj.topic_id, obj.topic)
    return named


def live_segments_of(entries: DataFrame) -> DataFrame:
    """The segments of a replayed state (see tierlog.pipeline.replay.ENTRY_SCHEMA)."""
    from pyspark.sql import functions as F

    return entries.where(F.col("segment_id").isNotNull())


def deleting_partitions(deletes: Iterable[RemotePartitionDeleteMetadata]) -> frozenset[tuple[str, int]]:
    """The (topic id, partition) of every partition whose deletion the metadata records as started or finished."""
    return frozenset((str(md.topic_id_partition.topic_id), md.topic_id_partition.partition) for md in deletes
                     if md.state.name in PARTITION_DELETING_STATES)


def partition_deletes_of(store: Any) -> list[RemotePartitionDeleteMetadata]:
    """The partition delete states of a view or a folded state (anything with `user_partitions` and
    `partition_delete`)."""
    found = (store.partition_delete(tp) for tp in store.user_partitions())
    return [md for md in found if md is not None]


def partition_deletes_of_entries(entries: DataFrame) -> list[RemotePartitionDeleteMetadata]:
    """The partition delete states of a replayed state (see tierlog.pipeline.replay.ENTRY_SCHEMA)."""
    from pyspark.sql import functions as F

    from rlmm import view_format as vf

    rows = entries.where(F.col("family") == vf.PARTITIONS).select("entry_value").collect()
    return [vf.decode_partition_delete(bytes(r["entry_value"])) for r in rows]


def write_report(report: ReconcileReport, directory: Path) -> tuple[Path, Path]:
    """`report.json` and `delete-plan.txt` (per orphan: key, a tab, why it is an orphan) under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    report_path = directory / "report.json"
    plan_path = directory / "delete-plan.txt"
    report_path.write_text(json.dumps(report.as_json(), indent=2) + "\n")
    plan_path.write_text("".join(f"{o['key']}\t{o['reason']}\n" for o in report.orphans))
    return report_path, plan_path
