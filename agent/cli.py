"""The `tierlog` command: run the agent or the archiver, inspect a node's view, verify, rebuild, and run
the pipeline jobs. Tables for people by default, `--json` for scripts.

Exit codes: 0 success; 1 a check found a problem (verify mismatch, reconcile findings, replay diff);
2 bad usage or configuration; 3 a service, file or resource the command needs is missing or unreachable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
DEFAULT_METADATA_TOPIC = "__tierlog_metadata"
SERVICES_ENV = Path(".dev") / "services.env"


class CommandError(Exception):
    """A failure the user can act on: the message says what is wrong and what to do."""

    def __init__(self, message: str, exit_code: int = EXIT_UNAVAILABLE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- configuration ---------------------------------------------------------------------------------------


def read_properties(path: Path) -> dict[str, str]:
    """A Kafka-style properties file: `key=value` lines, `#` and `!` comments."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CommandError(f"cannot read config file {path}: {exc.strerror}", EXIT_USAGE) from exc
    config: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            raise CommandError(f"{path}:{number}: expected key=value, got {stripped!r}", EXIT_USAGE)
        config[key.strip()] = value.strip()
    return config


def services_env() -> dict[str, str]:
    """KAFKA_BOOTSTRAP / S3_* from the environment, else from .dev/services.env (written by dev/services)."""
    found: dict[str, str] = {}
    if SERVICES_ENV.is_file():
        for line in SERVICES_ENV.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                found[key.strip()] = value.strip()
    found.update({k: v for k, v in os.environ.items() if k.startswith(("KAFKA_", "S3_"))})
    return found


class Settings:
    """Every command's view of the config: the file, `-o` overrides, then the services environment."""

    def __init__(self, config: Mapping[str, str]) -> None:
        self.config = dict(config)
        self.env = services_env()

    def get(self, name: str) -> str | None:
        # A broker-style file may prefix the component: accept rlmm.<name> and rsm.<name> too.
        for key in (name, f"rlmm.{name}", f"rsm.{name}"):
            if self.config.get(key):
                return self.config[key]
        return None

    def bootstrap(self) -> str:
        value = self.get("bootstrap.servers") or self.env.get("KAFKA_BOOTSTRAP")
        if not value:
            raise CommandError(
                "no Kafka to talk to: pass -o bootstrap.servers=HOST:PORT (or a --config file with it), "
                "or set KAFKA_BOOTSTRAP (`dev/services up` writes it to .dev/services.env)",
                EXIT_USAGE,
            )
        return value

    def metadata_topic(self) -> str:
        return self.get("metadata.topic.name") or DEFAULT_METADATA_TOPIC

    def state_dir(self, given: str | None) -> Path:
        value = given or self.get("state.dir")
        if not value:
            raise CommandError("no state dir: pass --state-dir DIR or -o state.dir=DIR", EXIT_USAGE)
        return Path(value)

    def s3(self) -> Any:
        from pipeline.session import S3Settings

        return S3Settings(
            endpoint=self.get("s3.endpoint.url") or self.env.get("S3_ENDPOINT"),
            access_key=self.get("s3.access.key.id") or self.env.get("S3_ACCESS_KEY"),
            secret_key=self.get("s3.secret.access.key") or self.env.get("S3_SECRET_KEY"),
            region=self.get("s3.region") or self.env.get("S3_REGION") or "us-east-1",
        )

    def bucket_location(self, given: str | None) -> str:
        """Where segments live: --bucket, else the rsm storage config, else the dev services' bucket."""
        if given:
            return given
        if self.get("storage.backend") == "filesystem" and self.get("filesystem.root"):
            return str(self.get("filesystem.root"))
        bucket = self.get("s3.bucket") or self.env.get("S3_BUCKET")
        if not bucket:
            raise CommandError(
                "no bucket: pass --bucket s3://BUCKET[/PREFIX] (or a directory), or -o s3.bucket=BUCKET",
                EXIT_USAGE,
            )
        prefix = (self.get("s3.prefix") or "").strip("/")
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"

    def archive_location(self, given: str | None) -> str:
        """Where the audit archive lives: --archive, archive.location, else the segments' bucket."""
        return given or self.get("archive.location") or self.bucket_location(None)

    def node_config(self, state_dir: Path) -> dict[str, Any]:
        """An RLMM config for a node working on `state_dir`, from the rlmm keys of the config."""
        config: dict[str, Any] = {
            k.removeprefix("rlmm."): v for k, v in self.config.items()
            if not k.startswith(("rsm.", "archive.", "s3.", "storage.", "filesystem."))
        }
        config.update({"bootstrap.servers": self.bootstrap(), "state.dir": str(state_dir)})
        config.setdefault("broker.id", "-1")
        config.setdefault("metadata.topic.name", self.metadata_topic())
        return config


# --- output ----------------------------------------------------------------------------------------------


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    if not rows:
        print("(none)", file=out)
        return
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(), file=out)
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip(), file=out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{count} B"


def emit(args: argparse.Namespace, payload: Any, human: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))
    else:
        human()


class ProgressBar:
    """A one-line progress bar on stderr; silent when stderr is not a terminal unless forced."""

    def __init__(self, label: str, total: int | None, enabled: bool | None = None) -> None:
        self.label = label
        self.total = total
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self._last_draw = 0.0

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last_draw < 0.2):
            return
        self._last_draw = now
        rate = done / max(now - self.started, 1e-6)
        if self.total:
            fraction = min(done / self.total, 1.0)
            bar = "#" * int(fraction * 30)
            line = f"{self.label} [{bar:<30}] {done}/{self.total} ({fraction:.0%}, {rate:,.0f}/s)"
        else:
            line = f"{self.label} {done} records ({rate:,.0f}/s)"
        print("\r" + line, end="", file=sys.stderr, flush=True)

    def finish(self, done: int) -> None:
        self.update(done, force=True)
        if self.enabled:
            print(file=sys.stderr)


# --- the view -------------------------------------------------------------------------------------------


@contextmanager
def opened_view(state_dir: Path) -> Iterator[Any]:
    from rlmm.view import MetadataView

    if not (state_dir / "view").is_dir():
        raise CommandError(
            f"no metadata view in state dir {state_dir}: pass the state.dir of a node that has run, "
            "or build one with `tierlog rebuild --state-dir DIR`"
        )
    try:
        view = MetadataView.open(state_dir, read_only=True)
    except Exception as exc:  # rocksdict raises its own exception type for unreadable databases
        raise CommandError(f"cannot open the view in {state_dir}: {exc}") from exc
    try:
        yield view
    finally:
        view.close()


def segment_row(md: Any) -> dict[str, Any]:
    return {
        "topic": md.topic_id_partition.topic,
        "partition": md.topic_id_partition.partition,
        "topic_id": str(md.topic_id_partition.topic_id),
        "segment_id": str(md.remote_log_segment_id.id),
        "state": md.state.name,
        "start_offset": md.start_offset,
        "end_offset": md.end_offset,
        "size_bytes": md.segment_size_in_bytes,
        "leader_epochs": {str(e): o for e, o in md.segment_leader_epochs.items()},
        "broker_id": md.broker_id,
        "event_timestamp_ms": md.event_timestamp_ms,
    }


def matching_partitions(view: Any, topic: str | None, partition: int | None) -> list[Any]:
    found = [
        tp for tp in view.user_partitions()
        if (topic is None or tp.topic == topic or str(tp.topic_id) == topic)
        and (partition is None or tp.partition == partition)
    ]
    return sorted(found, key=lambda tp: (tp.topic, tp.partition))


def cmd_describe(args: argparse.Namespace, settings: Settings) -> int:
    from rlmm.types import RemoteLogSegmentState as S

    with opened_view(settings.state_dir(args.state_dir)) as view:
        partitions = matching_partitions(view, args.topic, args.partition)
        if not partitions:
            where = args.topic if args.partition is None else f"{args.topic}-{args.partition}"
            raise CommandError(
                f"the view holds no remote metadata for {where}; list what it has with `tierlog segments`", 1
            )
        described = []
        for tp in partitions:
            segments = sorted(view.segments(tp), key=lambda md: md.start_offset)
            delete = view.partition_delete(tp)
            states: dict[str, int] = {}
            for md in segments:
                states[md.state.name] = states.get(md.state.name, 0) + 1
            described.append({
                "topic": tp.topic, "partition": tp.partition, "topic_id": str(tp.topic_id),
                "segments": len(segments),
                "states": states,
                "remote_bytes": sum(md.segment_size_in_bytes for md in segments
                                    if md.state is S.COPY_SEGMENT_FINISHED),
                "start_offset": min((md.start_offset for md in segments), default=None),
                "end_offset": max((md.end_offset for md in segments), default=None),
                "delete_state": delete.state.name if delete else None,
                "epochs": [
                    {"epoch": lin.epoch, "highest_log_offset": lin.highest_log_offset,
                     "displaced_segments": len(lin.displaced_segment_ids)}
                    for lin in view.lineages_of(tp)
                ],
                "segment_list": [segment_row(md) for md in segments] if args.partition is not None else None,
            })

    def human() -> None:
        print_table(
            [{**d, "remote": human_bytes(d["remote_bytes"]),
              "states": ", ".join(f"{k}={v}" for k, v in sorted(d["states"].items())),
              "epochs": len(d["epochs"])} for d in described],
            ["topic", "partition", "segments", "remote", "start_offset", "end_offset", "delete_state",
             "epochs", "states"],
        )
        for d in described:
            if d["segment_list"] is None:
                continue
            print(f"\nleader epochs of {d['topic']}-{d['partition']}:")
            print_table(d["epochs"], ["epoch", "highest_log_offset", "displaced_segments"])
            print(f"\nsegments of {d['topic']}-{d['partition']}:")
            print_table(
                [{**s, "size": human_bytes(s["size_bytes"]),
                  "leader_epochs": " ".join(f"{e}@{o}" for e, o in s["leader_epochs"].items())}
                 for s in d["segment_list"]],
                ["segment_id", "state", "start_offset", "end_offset", "size", "leader_epochs"],
            )

    emit(args, described, human)
    return EXIT_OK


def cmd_segments(args: argparse.Namespace, settings: Settings) -> int:
    with opened_view(settings.state_dir(args.state_dir)) as view:
        rows = [
            segment_row(md)
            for tp in matching_partitions(view, args.topic, args.partition)
            for md in view.segments(tp)
            if args.state is None or md.state.name == args.state
        ]
    rows.sort(key=lambda r: (r["topic"], r["partition"], r["start_offset"], r["segment_id"]))

    def human() -> None:
        print_table(
            [{**r, "size": human_bytes(r["size_bytes"])} for r in rows],
            ["topic", "partition", "segment_id", "state", "start_offset", "end_offset", "size"],
        )

    emit(args, rows, human)
    return EXIT_OK


# --- verify ----------------------------------------------------------------------------------------------


def fold_topic(bootstrap: str, topic: str, up_to: Mapping[int, int], progress: ProgressBar | None) -> Any:
    """Fold the metadata topic, below `up_to` per partition, through the pure state machine."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from rlmm import codec, state
    from rlmm.events import RecordKey

    folded = state.InMemoryState()
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"tierlog-verify-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True,
    })
    try:
        wanted = {p: end for p, end in up_to.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in wanted])
        buffered: dict[int, list[Any]] = {p: [] for p in wanted}
        done: set[int] = set()
        seen = 0
        deadline = time.monotonic() + 600
        while len(done) < len(wanted):
            if time.monotonic() > deadline:
                raise CommandError(f"reading {topic} took longer than 600 s; is the broker healthy?")
            for message in consumer.consume(1000, timeout=1.0):
                partition = message.partition() or 0
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        done.add(partition)
                        continue
                    raise CommandError(f"reading {topic}-{partition} failed: {error}")
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
                state.apply_record(folded, RecordKey.decode(message.key() or b""), event)
        if progress:
            progress.finish(seen)
    finally:
        consumer.close()
    return folded


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
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
        folded = fold_topic(settings.bootstrap(), topic, applied, ProgressBar("reading topic", total))
        topic_digest = folded.digest()
        results.append({
            "check": "view against topic", "ok": topic_digest == view_digest,
            "view_digest": view_digest, "topic_digest": topic_digest,
            "detail": f"applied offsets {dict(sorted(applied.items()))}",
        })
    if args.against in ("bucket", "all"):
        from pipeline.reconcile import live_segments_from_view, reconcile

        location = settings.bucket_location(args.bucket)
        spark = _spark(settings, args)
        with opened_view(state_dir) as view:
            live = live_segments_from_view(spark, view)
        report = reconcile(spark, live, _store(location, settings), hashed_keys=args.hashed_keys)
        results.append({
            "check": "view against bucket", "ok": report.clean,
            "detail": f"{report.objects} objects, {report.live_segments} live segments, "
                      f"{len(report.orphans)} orphans, {len(report.missing)} missing, "
                      f"{len(report.size_mismatches)} size mismatches",
            "report": report.as_json(),
        })
    ok = all(r["ok"] for r in results)

    def human() -> None:
        print_table(results, ["check", "ok", "detail"])
        if not ok:
            print("\nthe view disagrees; see `tierlog verify --json` for details, "
                  "`tierlog reconcile` for a delete plan, or rebuild the node with `tierlog rebuild`")

    emit(args, {"ok": ok, "checks": results}, human)
    return EXIT_OK if ok else EXIT_PROBLEM


# --- rebuild ---------------------------------------------------------------------------------------------


def _require_empty(state_dir: Path) -> None:
    view = state_dir / "view"
    if view.exists() and any(view.iterdir()):
        raise CommandError(
            f"state dir {state_dir} already holds a view; move it away (or pass an empty --state-dir) "
            "before rebuilding", EXIT_USAGE
        )


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tierlog-cli-offsets"})
    try:
        try:
            described = consumer.list_topics(topic, timeout=15).topics.get(topic)
        except KafkaException as exc:
            raise CommandError(f"cannot reach Kafka at {bootstrap}: {exc}; is the broker up?") from exc
        if described is None or described.error is not None:
            raise CommandError(
                f"metadata topic {topic} does not exist on {bootstrap}; pass -o metadata.topic.name=NAME"
            )
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
            for p in described.partitions
        }
    finally:
        consumer.close()


def _catch_up(settings: Settings, state_dir: Path, label: str, show: bool | None) -> dict[str, Any]:
    from rlmm import RemoteLogMetadataManager

    config = settings.node_config(state_dir)
    ends = _end_offsets(settings.bootstrap(), config["metadata.topic.name"])
    config.setdefault("metadata.topic.num.partitions", str(len(ends)))
    config["metadata.topic.create"] = "false"
    total = sum(ends.values())
    bar = ProgressBar(label, total, show)
    started = time.monotonic()
    with RemoteLogMetadataManager(config) as manager:
        while True:
            applied = manager.applied_offsets()
            done = sum(min(applied.get(p, 0), end) for p, end in ends.items())
            bar.update(done)
            if done >= total or manager.metadata_errors():
                break
            time.sleep(0.1)
        bar.finish(done)
        errors = manager.metadata_errors()
        if errors:
            raise CommandError(
                "the view stopped at a record it cannot apply: "
                + "; ".join(str(e) for e in errors.values()), EXIT_PROBLEM
            )
        return {"digest": manager.view_digest(), "applied_offsets": manager.applied_offsets(),
                "seconds": round(time.monotonic() - started, 3)}


def cmd_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    from rlmm.snapshot import SnapshotError, load_snapshot

    state_dir = settings.state_dir(args.state_dir)
    _require_empty(state_dir)
    result: dict[str, Any] = {"state_dir": str(state_dir)}
    started = time.monotonic()
    if args.snapshot:
        snapshot = Path(args.snapshot)
        if not snapshot.is_file():
            raise CommandError(f"snapshot {snapshot} does not exist; build one with `tierlog snapshot`")
        bar = ProgressBar("loading snapshot", _snapshot_records(snapshot), args.progress)
        loaded = [0]

        def progress(count: int) -> None:
            loaded[0] = count
            bar.update(count)

        try:
            topic, ends = load_snapshot(snapshot, state_dir, progress=progress)
        except SnapshotError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        bar.finish(loaded[0])
        result.update({"source": "snapshot", "snapshot": str(snapshot), "records": loaded[0],
                       "snapshot_end_offsets": {str(k): v for k, v in ends.items()}})
        settings.config.setdefault("metadata.topic.name", topic)
        if args.no_catch_up:
            from rlmm.view import MetadataView

            view = MetadataView.open(state_dir, read_only=True)
            try:
                result["digest"] = view.digest()
            finally:
                view.close()
        else:
            result.update(_catch_up(settings, state_dir, "catching up from topic", args.progress))
    else:
        result["source"] = "topic"
        result.update(_catch_up(settings, state_dir, "rebuilding from topic", args.progress))
    result["seconds"] = round(time.monotonic() - started, 3)

    def human() -> None:
        print(f"rebuilt {state_dir} from the {result['source']} in {result['seconds']:.1f} s")
        print(f"view digest: {result['digest']}")

    emit(args, result, human)
    return EXIT_OK


def _snapshot_records(path: Path) -> int | None:
    import fastavro

    try:
        with path.open("rb") as handle:
            return sum(block.num_records for block in fastavro.block_reader(handle))
    except Exception:  # the loader reports what is wrong with the file; the bar just has no total
        return None


# --- the archiver and the agent ----------------------------------------------------------------------------


def _store(location: str, settings: Settings) -> Any:
    from pipeline.locations import open_store

    try:
        return open_store(location, settings.s3())
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc


def archiver_settings(settings: Settings, group: bool, instance_id: str | None) -> Any:
    from agent.archiver import ArchiverSettings

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
    from agent.archiver import Archiver
    from rlmm.errors import MetadataLogError

    location = settings.archive_location(args.archive)
    archiver = Archiver(_store(location, settings), archiver_settings(settings, args.group, args.instance_id))
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
    from agent.archiver import Archiver, ArchiverThread
    from agent.server import serve

    # The agent takes only component keys; the rest (bootstrap.servers, archive.*) serve the archiver.
    config = {k: v for k, v in settings.config.items() if k.startswith(("rlmm.", "rsm."))}
    thread: ArchiverThread | None = None
    if args.archive or (settings.get("archive.enable") or "").lower() == "true":
        location = settings.archive_location(None)
        broker = settings.get("broker.id") or "0"
        archive = archiver_settings(settings, group=True, instance_id=f"tierlog-archiver-broker-{broker}")
        thread = ArchiverThread(lambda: Archiver(_store(location, settings), archive))
        thread.start()
    try:
        serve(config, args.socket, args.metrics_port)
    finally:
        if thread is not None:
            thread.stop()
    return EXIT_OK


# --- the pipeline jobs -------------------------------------------------------------------------------------


def _spark(settings: Settings, args: argparse.Namespace, *locations: str) -> Any:
    """A session for the job; with s3a (and its jars) only when one of `locations` is in S3."""
    from pipeline.locations import is_s3
    from pipeline.session import get_spark

    needs_s3 = any(is_s3(location) for location in locations)
    spark = get_spark("tierlog-cli", master=args.master, s3=settings.s3() if needs_s3 else None)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextmanager
def archive_errors() -> Iterator[None]:
    from pipeline.archive import ArchiveNotFoundError

    try:
        yield
    except ArchiveNotFoundError as exc:
        raise CommandError(str(exc)) from exc


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.replay import replay

    location = settings.archive_location(args.archive)
    state_dir = Path(args.state_dir) if args.state_dir else None
    if state_dir is not None and not (state_dir / "view").is_dir():
        raise CommandError(f"no metadata view in state dir {state_dir}; pass a node's state.dir")
    with archive_errors():
        report = replay(_spark(settings, args, location), location, settings.metadata_topic(), state_dir)

    def human() -> None:
        print_table([{
            "archived_records": report.archived_records, "replayed_records": report.replayed_records,
            "user_partitions": report.user_partitions, "archive_digest": report.archive_digest[:16],
            "view_digest": (report.view_digest or "")[:16] or None, "matches": report.matches,
        }], ["archived_records", "replayed_records", "user_partitions", "archive_digest", "view_digest",
             "matches"])
        if args.partitions:
            print("\nuser partitions of the replayed state:")
            print_table([{**p, "remote": human_bytes(p["remote_bytes"])} for p in report.partitions],
                        ["topic", "partition", "segments", "remote"])
        if report.differences:
            print(f"\n{report.difference_count} differing entries; the first {len(report.differences)}:")
            print_table([dataclasses.asdict(d) for d in report.differences],
                        ["topic_id", "partition", "family", "kind", "entry_key"])

    emit(args, report.as_json(), human)
    return EXIT_PROBLEM if report.matches is False else EXIT_OK


def cmd_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.archive import read_archive
    from pipeline.reconcile import live_segments_from_view, live_segments_of, reconcile, write_report
    from pipeline.replay import compacted, fold_by_user_partition

    bucket = settings.bucket_location(args.bucket)
    archive_location = None if args.state_dir else settings.archive_location(args.archive)
    spark = _spark(settings, args, *(loc for loc in (bucket, archive_location) if loc))
    if args.state_dir:
        with opened_view(Path(args.state_dir)) as view:
            live = live_segments_from_view(spark, view)
        source = f"view {args.state_dir}"
    else:
        assert archive_location is not None
        with archive_errors():
            archive = read_archive(spark, archive_location, settings.metadata_topic())
        live = live_segments_of(fold_by_user_partition(compacted(archive)))
        source = f"archive {archive_location}"
    report = reconcile(spark, live, _store(bucket, settings), hashed_keys=args.hashed_keys,
                       delete_orphans=args.delete)
    paths = write_report(report, Path(args.report_dir)) if args.report_dir else None

    def human() -> None:
        print(f"metadata from {source}; bucket {bucket}")
        print_table([{"objects": report.objects, "live_segments": report.live_segments,
                      "orphans": len(report.orphans), "missing": len(report.missing),
                      "size_mismatches": len(report.size_mismatches), "deleted": len(report.deleted)}],
                    ["objects", "live_segments", "orphans", "missing", "size_mismatches", "deleted"])
        for title, rows, columns in (
            ("orphans", report.orphans, ["key", "size"]),
            ("missing objects", report.missing, ["key", "segment_id"]),
            ("size mismatches", report.size_mismatches, ["key", "size", "expected_size"]),
        ):
            if rows:
                print(f"\n{title}:")
                print_table(list(rows), columns)
        if paths:
            print(f"\nreport: {paths[0]}\ndelete plan: {paths[1]}")
        if report.orphans and not args.delete:
            print("\norphans were NOT deleted; rerun with --delete to delete exactly the delete plan")

    payload = {**report.as_json(), "delete_plan": report.delete_plan(), "bucket": bucket, "source": source}
    emit(args, payload, human)
    return EXIT_OK if report.clean or (args.delete and not report.missing and not report.size_mismatches) \
        else EXIT_PROBLEM


def cmd_usage(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.usage import per_topic, usage_over_time, write_usage

    location = settings.archive_location(args.archive)
    with archive_errors():
        result = usage_over_time(_spark(settings, args, location), location, settings.metadata_topic(),
                                 bucket_ms=args.bucket_minutes * 60_000)
    csv_path, png_path = write_usage(result, Path(args.out))
    latest = [r.asDict() for r in per_topic(result.table).collect()]
    last: dict[str, dict[str, Any]] = {}
    for row in latest:
        last[row["topic"]] = row

    def human() -> None:
        print_table([{**r, "remote": human_bytes(r["remote_bytes"])} for r in last.values()],
                    ["topic", "remote", "segments"])
        print(f"\ntable: {csv_path}\nchart: {png_path}")

    emit(args, {"table": str(csv_path), "chart": str(png_path), "buckets": result.buckets,
                "latest_per_topic": list(last.values())}, human)
    return EXIT_OK


def cmd_snapshot(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.snapshot import build_snapshot

    location = settings.archive_location(args.archive)
    with archive_errors():
        spark = _spark(settings, args, location)
        summary = build_snapshot(spark, location, settings.metadata_topic(), Path(args.out))
    payload = {"path": summary.path, "records": summary.records, "archived_records": summary.archived_records,
               "end_offsets": {str(k): v for k, v in summary.end_offsets.items()}}
    emit(args, payload, lambda: print(
        f"wrote {summary.path}: {summary.records} records (of {summary.archived_records} archived); "
        f"load it with `tierlog rebuild --snapshot {summary.path} --state-dir DIR`"))
    return EXIT_OK


# --- the parser ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tierlog",
        description="Kafka tiered storage: run the agent, inspect and verify metadata, run pipeline jobs.",
        epilog="exit codes: 0 ok, 1 a check found a problem, 2 bad usage or config, 3 something needed "
               "is missing or unreachable. Kafka and S3 default to KAFKA_BOOTSTRAP / S3_* "
               "(or .dev/services.env).",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path,
                        help="properties file (bootstrap.servers, state.dir, s3.bucket, ...)")
    common.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a config entry overriding the file (repeatable)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    spark_opts = argparse.ArgumentParser(add_help=False)
    spark_opts.add_argument("--master", help="Spark master (default local[*], or spark-submit's)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("agent", parents=[common], help="run the agent (rlmm + rsm over gRPC) for a broker")
    p.add_argument("--socket", required=True, help="Unix domain socket path to serve on")
    p.add_argument("--metrics-port", type=int, help="Prometheus port on 127.0.0.1 (0 picks one)")
    p.add_argument("--archive", action="store_true",
                   help="also run the audit archiver (or archive.enable=true)")
    p.set_defaults(run=cmd_agent)

    p = sub.add_parser("describe", parents=[common], help="a topic's or partition's remote segments, states, "
                                                          "epochs and sizes")
    p.add_argument("topic", help="topic name or topic id")
    p.add_argument("partition", nargs="?", type=int, help="one partition (adds its segment list)")
    p.add_argument("--state-dir", help="a node's state.dir (read-only)")
    p.set_defaults(run=cmd_describe)

    p = sub.add_parser("segments", parents=[common], help="list remote segments")
    p.add_argument("--topic")
    p.add_argument("--partition", type=int)
    p.add_argument("--state",
                   choices=["COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED", "DELETE_SEGMENT_STARTED"])
    p.add_argument("--state-dir", help="a node's state.dir (read-only)")
    p.set_defaults(run=cmd_segments)

    p = sub.add_parser("verify", parents=[common, spark_opts],
                       help="check a view against the topic or the bucket")
    p.add_argument("against", choices=["topic", "bucket", "all"], nargs="?", default="topic")
    p.add_argument("--state-dir", help="a node's state.dir (read-only)")
    p.add_argument("--bucket", help="s3://BUCKET[/PREFIX] or a directory (default: the rsm config's)")
    p.add_argument("--hashed-keys", action="store_true", help="objects use storage.hash.prefix=true")
    p.set_defaults(run=cmd_verify)

    p = sub.add_parser("rebuild", parents=[common], help="build a node's view from the topic or a snapshot")
    p.add_argument("--state-dir", help="an empty state dir to build into")
    p.add_argument("--snapshot", help="a snapshot file from `tierlog snapshot` (default: the topic)")
    p.add_argument("--no-catch-up", action="store_true", help="after a snapshot, do not read the topic")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    p.set_defaults(run=cmd_rebuild)

    archive_opt = argparse.ArgumentParser(add_help=False)
    archive_opt.add_argument("--archive", help="archive location: s3://BUCKET[/PREFIX] or a directory "
                                               "(default: archive.location, else the segments' bucket)")

    p = sub.add_parser("replay", parents=[common, spark_opts, archive_opt],
                       help="fold the audit archive; with --state-dir, diff it against that view")
    p.add_argument("--state-dir", help="a node's state.dir to compare with")
    p.add_argument("--partitions", action="store_true", help="also list each user partition's state")
    p.set_defaults(run=cmd_replay)

    p = sub.add_parser("reconcile", parents=[common, spark_opts, archive_opt],
                       help="orphans, missing objects and size mismatches between bucket and metadata")
    p.add_argument("--bucket", help="s3://BUCKET[/PREFIX] or a directory holding the segments")
    p.add_argument("--state-dir", help="take the live metadata from this view instead of the archive")
    p.add_argument("--report-dir", help="write report.json and delete-plan.txt here")
    p.add_argument("--delete", action="store_true", help="delete the orphans (the delete plan)")
    p.add_argument("--hashed-keys", action="store_true", help="objects use storage.hash.prefix=true")
    p.set_defaults(run=cmd_reconcile)

    p = sub.add_parser("usage", parents=[common, spark_opts, archive_opt],
                       help="remote bytes and segments per topic and partition over time")
    p.add_argument("--out", required=True, help="directory for usage.csv and usage.png")
    p.add_argument("--bucket-minutes", type=int, default=60, help="time bucket width (default 60)")
    p.set_defaults(run=cmd_usage)

    p = sub.add_parser("snapshot", parents=[common, spark_opts, archive_opt],
                       help="build a bootstrap snapshot from the audit archive")
    p.add_argument("--out", required=True, help="snapshot file to write")
    p.set_defaults(run=cmd_snapshot)

    p = sub.add_parser("archive", parents=[common, archive_opt],
                       help="copy the metadata topic into the audit archive")
    p.add_argument("--once", action="store_true", help="archive what is there now, then exit")
    p.add_argument("--group", action="store_true",
                   help="share the metadata partitions with other archivers in a consumer group")
    p.add_argument("--instance-id", help="static group membership id (restarts take over at once)")
    p.set_defaults(run=cmd_archive)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    try:
        config = read_properties(args.config) if args.config else {}
        for option in args.option:
            key, sep, value = option.partition("=")
            if not sep or not key:
                raise CommandError(f"-o expects KEY=VALUE, got {option!r}", EXIT_USAGE)
            config[key.strip()] = value.strip()
        return int(args.run(args, Settings(config)))
    except CommandError as exc:
        print(f"tierlog {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (head, less) went away; nothing is wrong with the command itself.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        from rlmm.errors import ConfigError, RemoteStorageError

        if isinstance(exc, ConfigError):
            print(f"tierlog {args.command}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(exc, RemoteStorageError):
            print(f"tierlog {args.command}: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        raise


if __name__ == "__main__":
    sys.exit(main())
