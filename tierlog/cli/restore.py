"""`tierlog restore`: re-create the metadata topic after it was lost, from what the bucket holds (the newest snapshot
plus the audit archive after it, or the segment objects alone), so that the brokers' nodes rebuild from it.

The state is built and its records replayed in a scratch view first (same view digest, or nothing is written); then
the topic is created (or found empty), written, and a new node's view of it is checked against the same digest.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierlog.cli.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, CommandError, Settings, open_location
from tierlog.cli.output import ProgressBar, emit

if TYPE_CHECKING:
    from tierlog.audit.restore import RestoredState, RestoreMarker

DEFAULT_WAIT_S = 600.0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "restore", parents=[common],
        help="re-create a lost metadata topic from the bucket (snapshot + audit archive, or the segment objects)",
        description="Re-create tierlog's metadata topic after it was lost, from what the bucket holds: the newest "
                    "snapshot plus the audit archive after it (auto, when either exists), else the segment objects "
                    "alone. Refuses a metadata topic that holds records. Exit 1 when anything could not be "
                    "restored (an unreadable object, a state that does not replay to its digest).")
    p.add_argument("--from", dest="source", choices=["auto", "snapshot", "objects"], default="auto",
                   help="snapshot: the newest snapshot plus the archive after it (either alone works); objects: the "
                        "segment objects (a bucket without an archive, or one Kafka's own manager filled); auto "
                        "(default): snapshot when the bucket holds a snapshot or an archive of the topic, else objects")
    p.add_argument("--dry-run", action="store_true", help="build and check the state, print the plan, write nothing")
    p.add_argument("--force", action="store_true",
                   help="write even into a metadata topic that holds records (they stay, and mix with the restored "
                        "ones: the result is checked and most likely differs)")
    p.add_argument("--wait", type=float, default=DEFAULT_WAIT_S, metavar="SECONDS",
                   help=f"longest wait for the records to be written and read back (default {DEFAULT_WAIT_S:.0f})")
    p.add_argument("--work-dir", type=Path, help="scratch space for the state's views (default: a temporary dir)")
    p.set_defaults(run=cmd_restore)


@dataclass(frozen=True)
class NodeSettings:
    config: dict[str, Any]
    metadata_topic: str
    partitions: int
    broker_id: int
    snapshot_location: str


def _node(settings: Settings, state_dir: Path) -> NodeSettings:
    from rlmm.config import parse_config
    from rlmm.errors import ConfigError
    from rlmm.manager import CLIENT_PREFIX, CONFIG_KEYS

    config = settings.node_config(state_dir)
    try:
        parsed = parse_config(config, CONFIG_KEYS, "restore", ignore_prefixes=(CLIENT_PREFIX,))
    except ConfigError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    return NodeSettings(config, parsed["metadata.topic.name"], parsed["metadata.topic.num.partitions"],
                        max(parsed["broker.id"], 0), parsed["snapshot.location"] or "")


def _say(message: str) -> None:
    """A progress line on stderr (stdout carries the report, or the JSON)."""
    print(f"tierlog restore: {message}", file=sys.stderr, flush=True)


def cmd_restore(args: argparse.Namespace, settings: Settings) -> int:
    from tierlog.audit import restore

    with tempfile.TemporaryDirectory(prefix="tierlog-restore-", dir=args.work_dir) as scratch:
        work = Path(scratch)
        node = _node(settings, work / "node")
        topic = node.metadata_topic
        archive_store = open_location(settings.archive_location(None), settings)
        segment_store = open_location(settings.bucket_location(None), settings)
        marker = restore.read_marker(archive_store, topic)
        ends = _end_offsets(settings, node)
        held = sum((ends or {}).values())
        if marker is not None and marker.stage == "moving":
            return _finish_move(args, settings, archive_store, node, marker)
        if held and marker is not None:
            raise CommandError(
                f"metadata topic {topic} holds {held} records and a restore started at {marker.started_ms} ms "
                f"stopped while writing it ({restore.marker_key(topic)}): delete the topic and run again",
                EXIT_PROBLEM)
        if held and not args.force:
            raise CommandError(
                f"metadata topic {topic} holds {held} records ({_offsets(ends)}): a restore writes only into a "
                "missing or empty topic. If it is the remains of the lost one, delete it first (kafka-topics "
                "--delete); --force writes anyway, mixing the records", EXIT_PROBLEM)
        if held:
            _say(f"WARNING: --force: writing into {topic}, which holds {held} records ({_offsets(ends)}); "
                 "they stay and mix with the restored ones")
        state = _recover(args, node, archive_store, segment_store, work)
        try:
            return _restore(args, settings, node, state, archive_store, ends or {}, work)
        finally:
            state.close()


def _end_offsets(settings: Settings, node: NodeSettings) -> dict[int, int] | None:
    from tierlog.audit import restore

    try:
        return restore.topic_end_offsets(settings.kafka_client(), node.metadata_topic, node.partitions,
                                         settings.timeout_s)
    except restore.RestoreError as exc:
        raise CommandError(str(exc), EXIT_PROBLEM) from exc


def _offsets(ends: dict[int, int] | None) -> str:
    return "end offsets " + ", ".join(f"{p}: {e}" for p, e in sorted((ends or {}).items()) if e)


def _recover(args: argparse.Namespace, node: NodeSettings, archive_store: Any, segment_store: Any, work: Path
             ) -> RestoredState:
    from tierlog.audit import restore

    topic = node.metadata_topic
    state = None
    if args.source in ("auto", "snapshot"):
        _say(f"reading the newest snapshot of {topic} (snapshot.location={node.snapshot_location or '(unset)'})"
             " and the audit archive after it")
        state = restore.recover_from_archive(archive_store, topic, node.snapshot_location, work)
        if state is None and args.source == "snapshot":
            raise CommandError(f"the bucket holds no snapshot of {topic} under snapshot.location="
                               f"{node.snapshot_location or '(unset)'} and no archive file under audit/{topic}/: "
                               "use --from objects", EXIT_PROBLEM)
        if state is not None:
            added = restore.compare_with_objects(state, segment_store, state.newest_record_ms, node.broker_id)
            if added:
                _say(f"{len(added)} segments in the bucket are newer than the archive: restored from objects")
    if state is None:
        _say("no snapshot or archive to restore from: reading the segment objects" if args.source == "auto"
             else "reading the segment objects")
        with ProgressBar("reading segments", None) as bar:
            state = restore.recover_from_objects(segment_store, work, node.broker_id,
                                                 lambda done, total: bar.update(done))
    return state


def _restore(args: argparse.Namespace, settings: Settings, node: NodeSettings, state: RestoredState, archive_store: Any,
             ends: dict[int, int], work: Path) -> int:
    from tierlog.audit import restore

    topic = node.metadata_topic
    expected = state.view.digest()
    records = restore.restore_records(state.view, node.partitions, node.broker_id, int(time.time() * 1000), ends)
    count = sum(map(len, records))
    _say(f"state built from {state.source}; replaying its {count} records as a new node would")
    replayed = restore.replayed_digest(records)
    report = _report(state, topic, count, expected, args.dry_run)
    if replayed != expected:
        report["problems"].append(f"the records replay to view digest {replayed}, not the state's {expected}: "
                                  "nothing was written (a bug: keep the --work-dir and report it)")
        _print(args, report)
        return EXIT_PROBLEM
    if args.dry_run:
        _print(args, report)
        return EXIT_PROBLEM if report["problems"] else EXIT_OK
    started = int(time.time() * 1000)
    retired = restore.retired_topic_name(topic, started)
    restore.write_marker(archive_store, topic, restore.RestoreMarker("writing", retired, started))
    _say(f"creating {topic} if missing and writing {count} records")
    deadline = time.monotonic() + args.wait
    with restore.open_node(node.config, work / "check") as check:
        now = _end_offsets(settings, node) or {}
        if any(end > ends.get(partition, 0) for partition, end in now.items()):
            raise CommandError(
                f"records arrived in {topic} before the restore wrote any ({_offsets(now)}): a broker's agent is "
                f"writing to it. Stop the agents, delete the topic and run the restore again", EXIT_PROBLEM)
        with ProgressBar("writing records", count) as bar:
            restore.write_records(settings.kafka_client(), topic, records, args.wait,
                                  lambda done, total: bar.update(done))
        _say("reading the topic back with a new node")
        check.wait_caught_up(max(1.0, deadline - time.monotonic()))
        digest = check.view_digest()
        source = check.view.source(topic)
    assert source is not None  # a manager records the topic it follows when it opens its view
    report["written_digest"] = digest
    if digest != expected:
        report["problems"].append(f"a new node reading {topic} reaches view digest {digest}, not {expected}: another "
                                  "writer appended to the topic meanwhile (stop the agents and run again after "
                                  "deleting the topic), or records were lost")
        _print(args, report)
        return EXIT_PROBLEM
    restore.write_marker(archive_store, topic, restore.RestoreMarker("moving", retired, started))
    report["archive_moved_to"] = _move(archive_store, node, retired, source[0])
    restore.clear_marker(archive_store, topic)
    _print(args, report)
    return EXIT_PROBLEM if report["problems"] else EXIT_OK


def _move(store: Any, node: NodeSettings, retired: str, topic_id: str) -> str | None:
    """Move the lost topic's archive and its snapshots aside (restore.retire_archive, retire_snapshots)."""
    from tierlog.audit import restore

    topic = node.metadata_topic
    with ProgressBar("moving the lost topic's archive", None) as bar:
        moved = restore.retire_archive(store, topic, retired, lambda done, total: bar.update(done))
    snapshots = restore.retire_snapshots(store, node.snapshot_location, topic, retired, topic_id)
    if snapshots:
        _say(f"moved {snapshots} snapshots of the lost topic under {node.snapshot_location}/{retired}/")
    if not moved:
        return None
    _say(f"moved the lost topic's {moved} archive files to audit/{retired}/ (the archiver starts the new topic's "
         f"archive under audit/{topic}/)")
    return f"audit/{retired}/"


def _finish_move(args: argparse.Namespace, settings: Settings, store: Any, node: NodeSettings,
                 marker: RestoreMarker) -> int:
    from tierlog.audit import restore
    from tierlog.audit.snapshots import metadata_topic_now

    topic = node.metadata_topic
    _say(f"a restore started at {marker.started_ms} ms wrote and checked {topic} but stopped while moving the "
         f"lost topic's archive to audit/{marker.retired_topic}/: finishing that")
    if args.dry_run:
        return EXIT_OK
    topic_id, _ends = metadata_topic_now(settings.kafka_client(), topic, settings.timeout_s)
    moved = _move(store, node, marker.retired_topic, topic_id)
    restore.clear_marker(store, topic)
    emit(args, {"finished_archive_move": moved}, lambda: print(f"restore of {topic} finished"))
    return EXIT_OK


def _report(state: RestoredState, topic: str, records: int, digest: str, dry_run: bool) -> dict[str, Any]:
    view = state.view
    partitions = view.user_partitions()
    return {
        "metadata_topic": topic,
        "dry_run": dry_run,
        "source": state.source,
        "user_partitions": len(partitions),
        "segments": sum(1 for _ in view.segments()),
        "records": records,
        "view_digest": digest,
        "unknown": state.unknown,
        "skipped": [{"key": s.key, "reason": s.reason} for s in state.skipped],
        "orphans": [{"key": s.key, "reason": s.reason} for s in state.orphans],
        "notes": list(state.notes),
        "problems": [f"{len(state.skipped)} objects could not be restored (see skipped)"] if state.skipped else [],
    }


def _print(args: argparse.Namespace, report: dict[str, Any]) -> None:
    emit(args, report, lambda: _print_human(report))


def _print_human(report: dict[str, Any]) -> None:
    verb = "would write" if report["dry_run"] else "wrote"
    print(f"restore of {report['metadata_topic']} from {report['source']}")
    print(f"  {verb} {report['records']} records: {report['segments']} segments of {report['user_partitions']} "
          f"user partitions, view digest {report['view_digest']}")
    if report.get("written_digest") == report["view_digest"]:
        print("  a new node reading the topic reaches the same view digest")
    if report.get("archive_moved_to"):
        print(f"  the lost topic's archive is now under {report['archive_moved_to']}")
    if report["unknown"]:
        print("could not be known, per partition (restored with the value said):")
        reasons: dict[str, set[str]] = {}
        for fields in report["unknown"].values():
            for name, why in fields.items():
                reasons.setdefault(name, set()).add(why)
        for partition, fields in sorted(report["unknown"].items()):
            print(f"  {partition}: {', '.join(sorted(fields))}")
            for name, why in sorted(fields.items()):
                if len(reasons[name]) > 1:  # says which of the partition's segments: shown with the partition
                    print(f"    {name}: {why}")
        shared = {name: next(iter(found)) for name, found in sorted(reasons.items()) if len(found) == 1}
        if shared:
            print("  why:")
        for name, why in shared.items():
            print(f"    {name}: {why}")
    for title, rows in (("skipped (not restored)", report["skipped"]), ("orphans (not restored)", report["orphans"])):
        if rows:
            print(f"{title}:")
            for row in rows:
                print(f"  {row['key']}: {row['reason']}")
    for note in report["notes"]:
        print(f"note: {note}")
    for problem in report["problems"]:
        print(f"PROBLEM: {problem}")
