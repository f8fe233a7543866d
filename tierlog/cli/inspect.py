"""`tierlog describe` and `tierlog segments`: read a node's view, read-only."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tierlog.cli.common import EXIT_OK, EXIT_UNAVAILABLE, CommandError, Settings
from tierlog.cli.output import emit, format_id, human_bytes, print_table


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


def topic_states(settings: Settings) -> tuple[Callable[..., str], str | None]:
    """A function (topic, topic id or None) -> "live" | "not listed" | "unknown": whether the cluster lists the
    topic (Kafka never sends a partition delete for a topic whose partitions it no longer hosts, so the metadata
    alone cannot tell), and why the cluster could not be asked (None when it was, or when no Kafka is configured).

    A dead bootstrap address fails within about a second, a silent one within the timeout."""
    from tierlog.pipeline.cluster_topics import ClusterUnavailableError, cluster_topics

    try:
        settings.bootstrap_setting()
    except CommandError:  # no Kafka configured: the view alone is described
        return (lambda topic, topic_id=None: "unknown"), None
    try:
        found = cluster_topics(settings.kafka_client(), settings.timeout_s)
    except ClusterUnavailableError as exc:
        return (lambda topic, topic_id=None: "unknown"), f"cannot tell which topics the cluster still has: {exc}"
    return found.state_of, None


def segment_row(md: Any, uuid_format: str) -> dict[str, Any]:
    return {
        "topic": md.topic_id_partition.topic,
        "partition": md.topic_id_partition.partition,
        "topic_id": format_id(md.topic_id_partition.topic_id, uuid_format),
        "segment_id": format_id(md.remote_log_segment_id.id, uuid_format),
        "state": md.state.name,
        "start_offset": md.start_offset,
        "end_offset": md.end_offset,
        "size_bytes": md.segment_size_in_bytes,
        "leader_epochs": {str(e): o for e, o in md.segment_leader_epochs.items()},
        "broker_id": md.broker_id,
        "event_timestamp_ms": md.event_timestamp_ms,
    }


def matching_partitions(view: Any, topic: str | None, partition: int | None) -> list[Any]:
    """The view's user partitions of `topic` (a name, or an id in Kafka's or the hex form)."""
    from rlmm.errors import InvalidArgumentError
    from rlmm.types import parse_uuid

    topic_id = None
    if topic is not None:
        with suppress(InvalidArgumentError):  # not an id: a topic name
            topic_id = parse_uuid(topic)
    found = [
        tp for tp in view.user_partitions()
        if (topic is None or tp.topic == topic or tp.topic_id == topic_id)
        and (partition is None or tp.partition == partition)
    ]
    return sorted(found, key=lambda tp: (tp.topic, tp.partition))


def cmd_describe(args: argparse.Namespace, settings: Settings) -> int:
    """The view's partitions of a topic; when Kafka does not answer, still the table (topic state unknown), then the
    error once and exit 3."""
    from rlmm.types import RemoteLogSegmentState as S
    from tierlog.pipeline.cluster_topics import TOPIC_NOT_LISTED

    with opened_view(settings.state_dir(args.state_dir)) as view:
        partitions = matching_partitions(view, args.topic, args.partition)
        if not partitions:
            where = args.topic if args.partition is None else f"{args.topic}-{args.partition}"
            raise CommandError(
                f"the view holds no remote metadata for {where}; list what it has with `tierlog segments`", 1
            )
        described = []
        in_cluster, unreachable = topic_states(settings)
        for tp in partitions:
            segments = sorted(view.segments(tp), key=lambda md: md.start_offset)
            delete = view.partition_delete(tp)
            states: dict[str, int] = {}
            for md in segments:
                states[md.state.name] = states.get(md.state.name, 0) + 1
            described.append({
                "topic": tp.topic, "partition": tp.partition, "topic_id": format_id(tp.topic_id, args.uuid_format),
                "segments": len(segments),
                "states": states,
                "remote_bytes": sum(md.segment_size_in_bytes for md in segments
                                    if md.state is S.COPY_SEGMENT_FINISHED),
                "start_offset": min((md.start_offset for md in segments), default=None),
                "end_offset": max((md.end_offset for md in segments), default=None),
                "delete_state": delete.state.name if delete else None,
                "topic_state": in_cluster(tp.topic, str(tp.topic_id)),
                "epochs": [
                    {"epoch": lin.epoch, "highest_log_offset": lin.highest_log_offset,
                     "displaced_segments": len(lin.displaced_segment_ids),
                     "overwritten_segments": len(lin.overwritten_segment_ids)}
                    for lin in view.lineages_of(tp)
                ],
                "segment_list": ([segment_row(md, args.uuid_format) for md in segments]
                                 if args.partition is not None else None),
            })

    def human() -> None:
        print_table(
            [{**d, "remote": human_bytes(d["remote_bytes"]),
              "states": ", ".join(f"{k}={v}" for k, v in sorted(d["states"].items())),
              "epochs": len(d["epochs"])} for d in described],
            ["topic", "partition", "topic_id", "topic_state", "segments", "remote", "start_offset", "end_offset",
             "delete_state", "epochs", "states"],
        )
        if any(d["topic_state"] == TOPIC_NOT_LISTED for d in described):
            print(f"\n{TOPIC_NOT_LISTED}: the cluster does not list the topic but its metadata remains. If it was "
                  "deleted (Kafka sent no partition delete), `tierlog reconcile --deleted-topic-id ID --delete` "
                  "removes its objects; a listing alone is no proof (this principal may not see the topic)")
        for d in described:
            if d["segment_list"] is None:
                continue
            print(f"\nleader epochs of {d['topic']}-{d['partition']}:")
            print_table(d["epochs"], ["epoch", "highest_log_offset", "displaced_segments", "overwritten_segments"])
            print(f"\nsegments of {d['topic']}-{d['partition']}:")
            print_table(
                [{**s, "size": human_bytes(s["size_bytes"]),
                  "leader_epochs": " ".join(f"{e}@{o}" for e, o in s["leader_epochs"].items())}
                 for s in d["segment_list"]],
                ["segment_id", "state", "start_offset", "end_offset", "size", "leader_epochs"],
            )

    emit(args, described, human)
    if unreachable is not None:
        raise CommandError(unreachable, EXIT_UNAVAILABLE)
    return EXIT_OK


def cmd_segments(args: argparse.Namespace, settings: Settings) -> int:
    with opened_view(settings.state_dir(args.state_dir)) as view:
        rows = [
            segment_row(md, args.uuid_format)
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
