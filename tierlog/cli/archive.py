"""`tierlog archive` (the audit archiver on its own) and `tierlog agent` (the per-broker agent, optionally
with the archiver)."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from tierlog.cli.common import EXIT_OK, EXIT_USAGE, CommandError, Settings, open_location
from tierlog.cli.output import emit


def archiver_settings(settings: Settings, group: bool, instance_id: str | None) -> Any:
    from tierlog.audit.archiver import ArchiverSettings

    topic = settings.metadata_topic()
    try:
        return ArchiverSettings(
            bootstrap_servers=settings.bootstrap(),
            metadata_topic=topic,
            max_records_per_file=int(settings.get("archive.max.records.per.file") or 10_000),
            max_file_interval_s=int(settings.get("archive.max.interval.ms") or 5_000) / 1000,
            group_id=f"tierlog-archiver.{topic}" if group else None,
            group_instance_id=instance_id,
        )
    except ValueError as exc:
        raise CommandError(f"archive settings: {exc}", EXIT_USAGE) from exc


def cmd_archive(args: argparse.Namespace, settings: Settings) -> int:
    from rlmm.errors import MetadataLogError
    from tierlog.audit.archiver import Archiver
    from tierlog.cli.verify import require_topic

    location = settings.archive_location(args.archive)
    # The archiver's own client waits longer than --timeout on a wrong address; fail first, in one line.
    require_topic(settings, settings.metadata_topic())
    archiver = Archiver(open_location(location, settings), archiver_settings(settings, args.group, args.instance_id))
    try:
        if args.once:
            stats = archiver.run_until_caught_up()
            payload = {"archive": location, "files_written": stats.files_written,
                       "records_archived": stats.records_archived}
            emit(args, payload, lambda: print(
                f"archived {stats.records_archived} records in {stats.files_written} files to {location}"))
            return EXIT_OK
        stop = threading.Event()
        import signal

        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        print(f"archiving {settings.metadata_topic()} to {location}; Ctrl-C stops", file=sys.stderr)
        archiver.run(stop)
        return EXIT_OK
    except MetadataLogError as exc:
        raise CommandError(str(exc)) from exc


def cmd_agent(args: argparse.Namespace, settings: Settings) -> int:
    from rsm.snapshot_source import BucketSnapshotSource
    from tierlog.agent.server import serve
    from tierlog.audit.archiver import Archiver, ArchiverThread
    from tierlog.audit.snapshots import SnapshotSettings, SnapshotWriterThread, start_snapshot_writer

    # The agent takes only component keys; the rest (bootstrap.servers, archive.*) serve the archiver.
    config = {k: v for k, v in settings.config.items() if k.startswith(("rlmm.", "rsm."))}
    thread: ArchiverThread | None = None
    snapshots: SnapshotWriterThread | None = None
    source = None
    if args.archive or (settings.get("archive.enable") or "").lower() == "true":
        location = settings.archive_location(None)
        broker = settings.get("broker.id") or "0"
        archive = archiver_settings(settings, group=True, instance_id=f"tierlog-archiver-broker-{broker}")
        thread = ArchiverThread(lambda: Archiver(open_location(location, settings), archive))
        thread.start()
        snapshot_location = settings.get("snapshot.location")
        if snapshot_location:
            # Snapshots are folded from the archive, so they live in the archive's bucket; the rlmm reads them there.
            store = open_location(location, settings)
            source = BucketSnapshotSource(store)
            interval_s = int(settings.get("snapshot.interval.ms") or 3_600_000) / 1000
            try:
                snapshot_settings = SnapshotSettings(snapshot_location, settings.metadata_topic(), interval_s)
            except ValueError as exc:
                raise CommandError(f"snapshot settings: {exc}", EXIT_USAGE) from exc
            snapshots = start_snapshot_writer(store, snapshot_settings, settings.bootstrap())
    try:
        serve(config, args.socket, args.metrics_port, metrics_address=args.metrics_address, archiver=thread,
              snapshot_source=source)
    finally:
        if snapshots is not None:
            snapshots.stop()
        if thread is not None:
            thread.stop()
    return EXIT_OK
