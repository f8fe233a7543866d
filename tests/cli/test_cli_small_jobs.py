"""`tierlog replay` and `tierlog usage` on a small archive run in this process: no JVM, no Ivy or Spark
output, the same results as the fold of the topic; and the usage chart a person reads.

Needs the real Kafka broker (the shared metadata topic) for the archive; Spark is never started here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_testkit import MetadataTopic, Run
from matplotlib.lines import Line2D

from rlmm import codec
from rlmm.events import RecordKey
from rlmm.types import RemoteLogSegmentState
from rlmm.view import ConsumedRecord, MetadataView, apply_records
from tierlog.pipeline.generate import fold
from tierlog.pipeline.session import DEFAULT_IVY_DIR, DEFAULT_SPARK_AVRO_VERSION, JARS_DIR_ENV
from tierlog.pipeline.usage import UsageRow, UsageTable, byte_unit, usage_chart, usage_in_process, write_usage

Tierlog = Callable[..., Run]

# A JVM start alone takes longer than this on the test machine; an in-process job does not.
IN_PROCESS_SECONDS = 20


@pytest.fixture(scope="module")
def archive(metadata_topic: MetadataTopic, tierlog: Tierlog, tmp_path_factory: pytest.TempPathFactory) -> str:
    location = str(tmp_path_factory.mktemp("small") / "archive")
    run = tierlog("archive", "--once", "--archive", location, *metadata_topic.options())
    assert run.returncode == 0, run.stderr
    return location


def _view_of(records: list[Any], state_dir: Path, topic: str) -> None:
    ends: dict[int, int] = {}
    for r in records:
        ends[r.metadata_partition] = max(ends.get(r.metadata_partition, 0), r.offset + 1)
    view = MetadataView.open(state_dir)
    try:
        apply_records(view, topic, [
            ConsumedRecord(r.metadata_partition, r.offset, RecordKey.decode(r.key),
                           None if r.value is None else codec.decode(r.value)) for r in records
        ], ends)
    finally:
        view.close()


def test_replay_of_a_small_archive_runs_in_process_quietly_and_matches_the_view(
    metadata_topic: MetadataTopic, archive: str, tierlog: Tierlog, tmp_path: Path
) -> None:
    _view_of(metadata_topic.records, tmp_path, metadata_topic.name)
    started = time.monotonic()
    run = tierlog("replay", "--archive", archive, "--state-dir", str(tmp_path), "--json", *metadata_topic.options())
    assert time.monotonic() - started < IN_PROCESS_SECONDS
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # no Ivy resolution report, no Spark log lines
    report: Any = run.json()
    assert report["matches"] is True
    assert report["archive_digest"] == fold(metadata_topic.records).digest()
    assert report["archived_records"] == len(metadata_topic.records)


def test_replay_in_process_names_the_entries_a_view_that_missed_events_lacks(
    metadata_topic: MetadataTopic, archive: str, tierlog: Tierlog, tmp_path: Path
) -> None:
    _view_of([r for r in metadata_topic.records if r.offset % 10 != 3], tmp_path, metadata_topic.name)
    run = tierlog("replay", "--archive", archive, "--state-dir", str(tmp_path), *metadata_topic.options())
    assert run.returncode == 1, run.stderr
    assert "differing entries" in run.stdout
    assert "only_in_archive" in run.stdout or "value_differs" in run.stdout


def test_usage_of_a_small_archive_runs_in_process_and_ends_at_the_finished_bytes(
    metadata_topic: MetadataTopic, archive: str, tierlog: Tierlog, tmp_path: Path
) -> None:
    started = time.monotonic()
    run = tierlog("usage", "--archive", archive, "--out", str(tmp_path), "--json", *metadata_topic.options())
    assert time.monotonic() - started < IN_PROCESS_SECONDS
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    final = fold(metadata_topic.records)
    expected: dict[str, int] = {}
    for tp in final.user_partitions():
        for md in final.segments_of(tp):
            if md.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED:
                expected[tp.topic] = expected.get(tp.topic, 0) + md.segment_size_in_bytes
    result: Any = run.json()
    assert {r["topic"]: r["remote_bytes"] for r in result["latest_per_topic"]} == expected
    assert (tmp_path / "usage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_usage_in_process_follows_a_segment_from_copy_finished_to_delete_started() -> None:
    hour = 3_600_000
    t0 = 1_767_225_600_000  # 2026-01-01 00:00 UTC
    datums = [
        {"timestamp_ms": t0 + 10, "segment": _segment("s1", "COPY_SEGMENT_STARTED", 100)},
        {"timestamp_ms": t0 + hour + 5, "segment": _segment("s1", "COPY_SEGMENT_FINISHED", 100)},
        {"timestamp_ms": t0 + 3 * hour, "segment": _segment("s1", "DELETE_SEGMENT_STARTED", 100)},
    ]
    table = usage_in_process(datums, "__meta", bucket_ms=hour)
    assert [(r.bucket_start_ms - t0, r.remote_bytes, r.segments) for r in table.rows] == [
        (0, 0, 0), (hour, 100, 1), (2 * hour, 100, 1), (3 * hour, 0, 0),
    ]


def _segment(segment_id: str, state: str, size: int) -> dict[str, Any]:
    return {"topic": "orders", "partition": 0, "segment_id": segment_id, "state": state,
            "segment_size_in_bytes": size}


def test_the_usage_chart_has_wall_clock_time_readable_units_steps_a_total_and_a_title(tmp_path: Path) -> None:
    t0 = 1_767_225_600_000  # 2026-01-01 00:00 UTC
    hour = 3_600_000
    rows = [UsageRow(topic, 0, t0 + i * hour, size * (i + 1), i + 1)
            for topic, size in (("orders", 300 * 2**20), ("clicks", 200 * 2**20)) for i in range(6)]
    table = UsageTable(tuple(sorted(rows, key=lambda r: (r.topic, r.bucket_start_ms))), 6, hour, "__tierlog_metadata")
    figure = usage_chart(table)
    axes = figure.axes[0]
    lines = {line.get_label(): line for line in axes.get_lines() if isinstance(line, Line2D)}
    assert set(lines) == {"orders", "clicks", "total"}
    assert all(line.get_drawstyle() == "steps-post" for line in lines.values())
    # 6 x 500 MiB at the end: 2.9 GiB, drawn in GiB.
    assert axes.get_ylabel() == "remote bytes (GiB)"
    total: Any = lines["total"].get_ydata()
    assert total[-1] == pytest.approx(6 * 500 / 1024)
    assert axes.get_xlabel() == "time (UTC)"
    ticks = [label.get_text() for label in axes.get_xticklabels()]
    assert any(":" in t for t in ticks)  # clock times, not "hours since"
    title = axes.get_title()
    assert "Remote (tiered) storage per topic" in title and "2026-01-01 00:00 to 2026-01-01 06:00 UTC" in title
    _csv, png = write_usage(table, tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_byte_units_are_chosen_from_the_data() -> None:
    assert byte_unit(0) == ("B", 1)
    assert byte_unit(900) == ("B", 1)
    assert byte_unit(5 * 2**20) == ("MiB", 2**20)
    assert byte_unit(3 * 2**40) == ("TiB", 2**40)



@pytest.mark.spark
def test_usage_on_spark_keeps_ivy_and_spark_output_off_the_terminal(
    metadata_topic: MetadataTopic, archive: str, tierlog: Tierlog, tmp_path: Path
) -> None:
    run = tierlog("usage", "--spark", "--archive", archive, "--out", str(tmp_path), *metadata_topic.options(),
                  timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # Ivy's resolution report and log4j went to the Spark log file
    assert run.stdout.startswith("TOPIC")


@pytest.mark.spark
def test_spark_takes_its_packages_from_a_local_jars_directory_without_ivy(
    metadata_topic: MetadataTopic, archive: str, tierlog: Tierlog, tmp_path: Path
) -> None:
    # An air-gapped host: the jars copied once into a directory, and an Ivy cache it never fills.
    jars = tmp_path / "jars"
    jars.mkdir()
    for jar in (DEFAULT_IVY_DIR / "jars").glob("*.jar"):
        if "spark-avro" in jar.name or "scala-parallel" in jar.name or "xz" in jar.name:
            (jars / jar.name).symlink_to(jar)
    if not any("spark-avro" in p.name for p in jars.iterdir()):
        pytest.skip(f"no spark-avro in {DEFAULT_IVY_DIR / 'jars'} to copy (no Spark job has run here)")
    ivy = tmp_path / "ivy-never"
    env = {**os.environ, JARS_DIR_ENV: str(jars), "TIERLOG_IVY_DIR": str(ivy)}
    run = tierlog("usage", "--spark", "--archive", archive, "--out", str(tmp_path / "out"),
                  *metadata_topic.options(), env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert not ivy.exists()


def test_a_jars_directory_without_spark_avro_is_refused_naming_what_is_missing(
    archive: str, metadata_topic: MetadataTopic, tierlog: Tierlog, tmp_path: Path
) -> None:
    env = {**os.environ, JARS_DIR_ENV: str(tmp_path)}
    run = tierlog("usage", "--spark", "--archive", archive, "--out", str(tmp_path / "out"),
                  *metadata_topic.options(), env=env)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"tierlog usage: {JARS_DIR_ENV}={tmp_path} holds no spark-avro_2.13 jar: copy the jars of "
        f"org.apache.spark:spark-avro_2.13:{DEFAULT_SPARK_AVRO_VERSION} and its dependencies there (a connected "
        f"host that ran a Spark job has them in {DEFAULT_IVY_DIR / 'jars'})"
    ]
