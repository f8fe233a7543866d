"""`tierlog verify` (a view against the topic or the bucket) and `tierlog rebuild` (a view from the topic or a
snapshot)."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierlog.cli.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, CommandError, Settings
from tierlog.cli.inspect import opened_view
from tierlog.cli.output import ProgressBar, emit, print_table

if TYPE_CHECKING:
    from rlmm import RemoteLogMetadataManager
    from rlmm.archive import SnapshotHeader


def topic_partitions(consumer: Any, settings: Settings, topic: str) -> list[int]:
    """The partitions of `topic`, or one clear CommandError when Kafka does not answer within the timeout."""
    from confluent_kafka import KafkaException

    bootstrap = settings.bootstrap_setting()
    try:
        described = consumer.list_topics(topic, timeout=settings.timeout_s).topics.get(topic)
    except KafkaException as exc:
        reason = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        raise CommandError(
            f"cannot reach Kafka at {bootstrap.value} (bootstrap.servers from {bootstrap.source}) within "
            f"{settings.timeout_s:g} s: {reason}; check the address, or raise --timeout"
        ) from exc
    if described is None or described.error is not None:
        raise CommandError(
            f"metadata topic {topic} does not exist on {bootstrap.value}; pass -o metadata.topic.name=NAME"
        )
    return sorted(described.partitions)


def require_topic(settings: Settings, topic: str) -> list[int]:
    """The partitions of `topic`; one clear CommandError within the timeout when Kafka does not answer.

    For commands whose own clients would wait longer (the archiver's), checked before they start."""
    from confluent_kafka import Consumer

    consumer = Consumer(settings.kafka_client(**{"group.id": "tierlog-cli-probe"}))
    try:
        return topic_partitions(consumer, settings, topic)
    finally:
        consumer.close()


def fold_topic(settings: Settings, topic: str, up_to: Mapping[int, int], progress: ProgressBar | None) -> Any:
    """Fold the metadata topic, below `up_to` per partition, through the pure state machine.

    Fails when no record arrives for the settings' timeout: the broker went away or the topic shrank.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from rlmm import codec, state
    from rlmm.events import RecordKey

    folded = state.InMemoryState()
    consumer = Consumer(settings.kafka_client(**{
        "group.id": f"tierlog-verify-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True,
    }))
    try:
        topic_partitions(consumer, settings, topic)
        wanted = {p: end for p, end in up_to.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in wanted])
        buffered: dict[int, list[Any]] = {p: [] for p in wanted}
        done: set[int] = set()
        seen = 0
        stalled_after = time.monotonic() + settings.timeout_s
        while len(done) < len(wanted):
            if time.monotonic() > stalled_after:
                raise CommandError(
                    f"reading {topic} stalled: nothing arrived for {settings.timeout_s:g} s after {seen} "
                    "records; is the broker healthy? (raise --timeout to wait longer)"
                )
            for message in consumer.consume(1000, timeout=min(1.0, settings.timeout_s)):
                stalled_after = time.monotonic() + settings.timeout_s
                partition = message.partition() or 0
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        done.add(partition)
                        continue
                    raise CommandError(f"reading {topic}-{partition} failed: {error.str()}")
                offset = message.offset() or 0
                if partition in done or offset >= wanted[partition]:
                    done.add(partition)
                    continue
                buffered[partition].append(message)
                seen += 1
                if offset + 1 >= wanted[partition]:
                    done.add(partition)
            if progress:
                progress.update(seen)
        for messages in buffered.values():
            for message in messages:
                value = message.value()
                event = None if value is None else codec.decode(value)
                state.apply_record(folded, RecordKey.decode(message.key() or b""), event, message.offset())
        if progress:
            progress.finish(seen)
    finally:
        consumer.close()
    return folded


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    if args.against == "migration":  # tierlog.cli.verify_migration: no view involved
        from tierlog.cli.verify_migration import cmd_verify_migration

        return cmd_verify_migration(args, settings)
    state_dir = settings.state_dir(args.state_dir)
    topic = settings.metadata_topic()
    results: list[dict[str, Any]] = []
    if args.against in ("topic", "all"):
        with opened_view(state_dir) as view:
            applied = view.applied_offsets(topic)
            view_digest = view.digest()
        if not applied:
            raise CommandError(
                f"the view in {state_dir} has applied nothing of {topic}: wrong metadata topic? "
                "pass -o metadata.topic.name=NAME", EXIT_USAGE
            )
        total = sum(applied.values())
        with ProgressBar("reading topic", total) as bar:
            folded = fold_topic(settings, topic, applied, bar)
        topic_digest = folded.digest()
        results.append({
            "check": "view against topic", "ok": topic_digest == view_digest,
            "view_digest": view_digest, "topic_digest": topic_digest,
            "detail": f"applied offsets {dict(sorted(applied.items()))}",
        })
    if args.against in ("bucket", "all"):
        from tierlog.cli.bucket import TopicReader, check_bucket

        checked = check_bucket(args, settings, TopicReader(_end_offsets, fold_topic), state_dir=state_dir)
        report = checked.report
        results.append({
            "check": "view against bucket", "ok": report.clean and not checked.freshness.behind,
            "detail": f"{report.objects} objects, {report.live_segments} live segments, "
                      f"{len(report.deletion_pending)} deletion pending "
                      f"({sum(p['size'] for p in report.deletion_pending)} bytes), "
                      f"{len(report.orphans)} orphans, {len(report.missing)} missing, "
                      f"{len(report.size_mismatches)} size mismatches, {len(report.too_young)} within the grace "
                      f"period, view behind the topic by {sum(checked.freshness.behind.values())} records",
            "advice": checked.advice(),
            "report": report.as_json(), "freshness": checked.freshness.as_json(),
        })
        from tierlog.cli.rewrap import data_key_check

        keys_checked = data_key_check(settings, checked.bucket)
        if keys_checked is not None:  # a key ring is configured: segments still under retired key ids
            results.append(keys_checked)
    ok = all(r["ok"] for r in results)

    def human() -> None:
        print_table(results, ["check", "ok", "detail"])
        for line in (advice for r in results for advice in r.get("advice", ())):
            print(f"\n{line}")
        if not ok:
            print("\nthe view disagrees; see `tierlog verify --json` for details, "
                  "`tierlog reconcile` for a delete plan, or rebuild the node with `tierlog rebuild`")

    emit(args, {"ok": ok, "checks": results}, human)
    return EXIT_OK if ok else EXIT_PROBLEM


def _require_empty(state_dir: Path) -> None:
    view = state_dir / "view"
    if view.exists() and any(view.iterdir()):
        raise CommandError(
            f"state dir {state_dir} already holds a view; move it away (or pass an empty --state-dir) "
            "before rebuilding", EXIT_USAGE
        )


def _end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    """The metadata topic's end offsets, read as a node reads them (rlmm's OffsetReader)."""
    from rlmm.errors import RemoteStorageError
    from rlmm.event_log import OffsetReader

    partitions = require_topic(settings, topic)
    try:
        return OffsetReader(topic, settings.kafka_client()).end_offsets(partitions, settings.timeout_s)
    except RemoteStorageError as exc:
        raise CommandError(f"cannot read the end offsets of {topic}: {exc}") from exc


# How often a catch-up without a progress bar (stderr not a terminal) says how far it got.
PROGRESS_LINE_S = 10.0


@contextmanager
def caught_up_node(
    settings: Settings, state_dir: Path, label: str, show: bool | None, writes: bool = False
) -> Iterator[tuple[RemoteLogMetadataManager, dict[str, Any]]]:
    """A manager on `state_dir` that has applied the metadata topic up to its end offsets as they were at the
    start, with what it did (digest, applied offsets, seconds). Says on stderr when it starts and ends, and (without
    a progress bar) how far it got every PROGRESS_LINE_S; fails once nothing is applied for the settings' timeout.
    A manager that `writes` signs its records with the configured broker.id, else 0 (Kafka's records need one)."""
    from rlmm import RemoteLogMetadataManager

    config = settings.node_config(state_dir)
    if writes and int(config["broker.id"]) < 0:
        config["broker.id"] = "0"
    topic = config["metadata.topic.name"]
    ends = _end_offsets(settings, topic)
    config.setdefault("metadata.topic.num.partitions", str(len(ends)))
    config["metadata.topic.create"] = "false"
    total = sum(ends.values())
    started = time.monotonic()
    print(f"{label}: reading {total} records of {topic} ({len(ends)} partitions) at {settings.bootstrap()} into "
          f"{state_dir}", file=sys.stderr)
    with ProgressBar(label, total, show) as bar, RemoteLogMetadataManager(config) as manager:
        done, last_progress, stalled_after = -1, 0, time.monotonic() + settings.timeout_s
        next_line = time.monotonic() + PROGRESS_LINE_S
        while True:
            applied = manager.applied_offsets()
            done = sum(min(applied.get(p, 0), end) for p, end in ends.items())
            bar.update(done)
            if done >= total or manager.metadata_errors():
                break
            now = time.monotonic()
            if done > last_progress:
                last_progress, stalled_after = done, now + settings.timeout_s
            elif now > stalled_after:
                raise CommandError(
                    f"{label} stalled: nothing applied for {settings.timeout_s:g} s at {done} of {total} "
                    "records; is the broker healthy? (raise --timeout to wait longer)"
                )
            if not bar.enabled and now >= next_line:
                print(f"{label}: {done} of {total} records applied ({now - started:.0f} s)", file=sys.stderr)
                next_line = now + PROGRESS_LINE_S
            time.sleep(0.1)
        bar.finish(done)
        errors = manager.metadata_errors()
        if errors:
            raise CommandError(
                "the view stopped at a record it cannot apply: "
                + "; ".join(str(e) for e in errors.values()), EXIT_PROBLEM
            )
        seconds = time.monotonic() - started
        print(f"{label}: done, {done} records applied in {seconds:.1f} s; the view holds "
              f"{len(manager.view.user_partitions())} user partitions", file=sys.stderr)
        yield manager, {"digest": manager.view_digest(), "applied_offsets": manager.applied_offsets(),
                        "seconds": round(seconds, 3)}


def _catch_up(settings: Settings, state_dir: Path, label: str, show: bool | None) -> dict[str, Any]:
    with caught_up_node(settings, state_dir, label, show) as (_manager, result):
        return result


def cmd_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    from rlmm.errors import SnapshotError
    from rlmm.snapshot import read_header

    state_dir = settings.state_dir(args.state_dir)
    _require_empty(state_dir)
    result: dict[str, Any] = {"state_dir": str(state_dir)}
    started = time.monotonic()
    if args.snapshot:
        snapshot = Path(args.snapshot)
        if not snapshot.is_file():
            raise CommandError(f"snapshot {snapshot} does not exist; build one with `tierlog snapshot`")
        try:
            header = read_header(snapshot)
        except SnapshotError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        settings.set_default("metadata.topic.name", header.metadata_topic, f"snapshot {snapshot}")
        refusal = None if args.no_catch_up else _snapshot_refusal(settings, header)
        if refusal is None:
            result.update(_load_snapshot(snapshot, state_dir, args.progress))
        else:
            # The topic always works: the node is rebuilt from it instead, and the operator told why.
            print(f"snapshot {snapshot} is not used: {refusal}; rebuilding from the topic", file=sys.stderr)
            result.update({"source": "topic", "snapshot": str(snapshot), "snapshot_refused": refusal})
        if args.no_catch_up:
            from rlmm.view import MetadataView

            view = MetadataView.open(state_dir, read_only=True)
            try:
                result["digest"] = view.digest()
            finally:
                view.close()
        else:
            label = "catching up from topic" if refusal is None else "rebuilding from topic"
            result.update(_catch_up(settings, state_dir, label, args.progress))
    else:
        result["source"] = "topic"
        result.update(_catch_up(settings, state_dir, "rebuilding from topic", args.progress))
    result["seconds"] = round(time.monotonic() - started, 3)

    def human() -> None:
        print(f"rebuilt {state_dir} from the {result['source']} in {result['seconds']:.1f} s")
        print(f"view digest: {result['digest']}")

    emit(args, result, human)
    return EXIT_OK


def _snapshot_refusal(settings: Settings, header: SnapshotHeader) -> str | None:
    """Why the snapshot must not seed a node that then tails the topic from its end offsets (foreign, stale, or
    naming no topic id), or None: the same rules as a node bootstrapping from the bucket (rlmm.bootstrap)."""
    from confluent_kafka.admin import AdminClient

    from rlmm.bootstrap import TopicPosition, why_not_trusted
    from rlmm.errors import ConfigError, RemoteStorageError
    from rlmm.event_log import OffsetReader, check_topic

    if header.topic_id is None:
        return ("it names no metadata topic id (written before snapshots recorded one), so nothing shows it is "
                f"of this incarnation of {header.metadata_topic}; write a new one with `tierlog snapshot`")
    topic = header.metadata_topic
    partitions = require_topic(settings, topic)
    client = settings.kafka_client()
    admin = AdminClient(client)
    try:
        info = check_topic(admin, topic, len(partitions), settings.timeout_s)
        starts = OffsetReader(topic, client, admin).start_offsets(partitions, settings.timeout_s)
    except (ConfigError, RemoteStorageError) as exc:
        raise CommandError(f"cannot check snapshot against topic {topic}: {exc}") from exc
    refusal = why_not_trusted(header, topic, TopicPosition(info.topic_id, info.delete_retention_ms, starts),
                              int(time.time() * 1000))
    return None if refusal is None else str(refusal)


def _load_snapshot(snapshot: Path, state_dir: Path, show: bool | None) -> dict[str, Any]:
    from rlmm.errors import SnapshotError
    from rlmm.snapshot import load_snapshot

    loaded = [0]
    with ProgressBar("loading snapshot", _snapshot_records(snapshot), show) as bar:

        def progress(count: int) -> None:
            loaded[0] = count
            bar.update(count)

        try:
            _topic, ends = load_snapshot(snapshot, state_dir, progress=progress)
        except SnapshotError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        bar.finish(loaded[0])
    return {"source": "snapshot", "snapshot": str(snapshot), "records": loaded[0],
            "snapshot_end_offsets": {str(k): v for k, v in ends.items()}}


def _snapshot_records(path: Path) -> int | None:
    import fastavro

    try:
        with path.open("rb") as handle:
            return sum(block.num_records for block in fastavro.block_reader(handle))
    except Exception:  # the loader reports what is wrong with the file; the bar just has no total
        return None
