"""The `tierlog` command against the real Kafka broker and S3 server: its output and its exit codes.

A node is rebuilt once from a generated metadata topic; the inspecting commands read that node's view.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyspark
import pytest
from cli_testkit import REPO_ROOT, MetadataTopic, Run
from pyspark.sql import SparkSession

from dev.s3 import S3Endpoint
from rlmm import codec
from rlmm.events import RecordKey
from rlmm.types import kafka_uuid_text
from rlmm.view import ConsumedRecord, MetadataView, apply_records
from tierlog.cli import main
from tierlog.pipeline.generate import fold
from tierlog.pipeline.session import DEFAULT_IVY_DIR, spark_packages

Tierlog = Callable[..., Run]


@pytest.fixture(scope="module")
def rebuilt_node(
    metadata_topic: MetadataTopic, tierlog: Tierlog, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Run]:
    state_dir = tmp_path_factory.mktemp("node") / "state"
    run = tierlog("rebuild", "--state-dir", str(state_dir), "--json", *metadata_topic.options())
    return state_dir, run


def test_rebuild_from_the_topic_reaches_the_digest_of_the_fold(
    rebuilt_node: tuple[Path, Run], metadata_topic: MetadataTopic
) -> None:
    _state_dir, run = rebuilt_node
    assert run.returncode == 0, run.stderr
    result: Any = run.json()
    assert result["source"] == "topic"
    assert result["digest"] == fold(metadata_topic.records).digest()


def test_rebuild_refuses_a_state_dir_that_already_holds_a_view(
    rebuilt_node: tuple[Path, Run], metadata_topic: MetadataTopic, tierlog: Tierlog
) -> None:
    state_dir, _ = rebuilt_node
    run = tierlog("rebuild", "--state-dir", str(state_dir), *metadata_topic.options())
    assert run.returncode == 2
    assert "already holds a view" in run.stderr and "empty --state-dir" in run.stderr


def test_segments_lists_every_segment_of_the_view(
    rebuilt_node: tuple[Path, Run], metadata_topic: MetadataTopic, tierlog: Tierlog
) -> None:
    state_dir, _ = rebuilt_node
    run = tierlog("segments", "--state-dir", str(state_dir), "--json")
    assert run.returncode == 0, run.stderr
    folded = fold(metadata_topic.records)
    # Ids as Kafka prints them (base64), the default.
    expected = {
        (kafka_uuid_text(md.remote_log_segment_id.id), md.state.name)
        for tp in folded.user_partitions() for md in folded.segments_of(tp)
    }
    listed: Any = run.json()
    assert {(s["segment_id"], s["state"]) for s in listed} == expected


def test_describe_of_a_partition_shows_its_segments_and_leader_epochs(
    rebuilt_node: tuple[Path, Run], metadata_topic: MetadataTopic, tierlog: Tierlog
) -> None:
    state_dir, _ = rebuilt_node
    folded = fold(metadata_topic.records)
    tp = next(tp for tp in folded.user_partitions() if any(True for _ in folded.segments_of(tp)))
    run = tierlog("describe", tp.topic, str(tp.partition), "--state-dir", str(state_dir))
    assert run.returncode == 0, run.stderr
    assert f"leader epochs of {tp.topic}-{tp.partition}:" in run.stdout
    assert "HIGHEST_LOG_OFFSET" in run.stdout
    for md in folded.segments_of(tp):
        assert kafka_uuid_text(md.remote_log_segment_id.id) in run.stdout


def test_describe_prints_kafka_ids_accepts_either_form_and_hex_on_request(
    rebuilt_node: tuple[Path, Run], metadata_topic: MetadataTopic, tierlog: Tierlog
) -> None:
    state_dir, _ = rebuilt_node
    folded = fold(metadata_topic.records)
    tp = next(tp for tp in folded.user_partitions() if any(True for _ in folded.segments_of(tp)))
    segment = next(iter(folded.segments_of(tp))).remote_log_segment_id.id
    by_kafka_id = tierlog("describe", kafka_uuid_text(tp.topic_id), str(tp.partition), "--state-dir", str(state_dir))
    assert by_kafka_id.returncode == 0, by_kafka_id.stderr
    header, row = by_kafka_id.stdout.splitlines()[:2]
    assert header.split()[:3] == ["TOPIC", "PARTITION", "TOPIC_ID"]
    assert row.split()[:3] == [tp.topic, str(tp.partition), kafka_uuid_text(tp.topic_id)]
    assert kafka_uuid_text(segment) in by_kafka_id.stdout and str(segment) not in by_kafka_id.stdout
    by_hex_id = tierlog("describe", tp.topic_id.hex, str(tp.partition), "--state-dir", str(state_dir),
                        "--uuid-format", "hex")
    assert by_hex_id.returncode == 0, by_hex_id.stderr
    assert str(segment) in by_hex_id.stdout and str(tp.topic_id) in by_hex_id.stdout


@pytest.mark.parametrize("command", [["verify", "topic"], ["rebuild"], ["archive", "--once"]])
def test_a_closed_port_fails_within_the_timeout_in_one_line(
    command: list[str], rebuilt_node: tuple[Path, Run], metadata_topic: MetadataTopic, tierlog: Tierlog,
    tmp_path: Path,
) -> None:
    state_dir, _ = rebuilt_node
    where = {"verify": ["--state-dir", str(state_dir)], "rebuild": ["--state-dir", str(tmp_path / "node")],
             "archive": ["--archive", str(tmp_path / "archive")]}[command[0]]
    with socket.socket() as probe:  # a port nobody listens on: bound, then released
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    timeout_s = 2  # short: against a closed port the command waits all of it
    started = time.monotonic()
    run = tierlog(*command, *where, "--timeout", str(timeout_s), "-o", f"bootstrap.servers=127.0.0.1:{closed}",
                  "-o", f"metadata.topic.name={metadata_topic.name}", timeout=60)
    elapsed = time.monotonic() - started
    assert run.returncode == 3
    assert elapsed < timeout_s + 10  # the timeout, plus the interpreter's start and shutdown
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"tierlog {command[0]}: cannot reach Kafka at 127.0.0.1:{closed}")
    assert f"within {timeout_s} s" in lines[0] and "Connection refused" not in run.stderr


def test_describe_of_an_unknown_topic_exits_1_and_says_how_to_see_what_exists(
    rebuilt_node: tuple[Path, Run], tierlog: Tierlog
) -> None:
    state_dir, _ = rebuilt_node
    run = tierlog("describe", "no-such-topic", "--state-dir", str(state_dir))
    assert run.returncode == 1
    assert "no remote metadata for no-such-topic" in run.stderr and "tierlog segments" in run.stderr


def test_verify_against_the_topic_passes_for_a_view_rebuilt_from_it(
    rebuilt_node: tuple[Path, Run], metadata_topic: MetadataTopic, tierlog: Tierlog
) -> None:
    state_dir, _ = rebuilt_node
    run = tierlog("verify", "topic", "--state-dir", str(state_dir), *metadata_topic.options())
    assert run.returncode == 0, run.stderr
    assert "view against topic  yes" in run.stdout


def test_verify_against_the_topic_exits_1_when_the_view_missed_events(
    metadata_topic: MetadataTopic, tierlog: Tierlog, tmp_path: Path
) -> None:
    ends: dict[int, int] = {}
    for r in metadata_topic.records:
        ends[r.metadata_partition] = max(ends.get(r.metadata_partition, 0), r.offset + 1)
    view = MetadataView.open(tmp_path)
    try:
        kept = [r for r in metadata_topic.records if r.offset % 10 != 3]
        apply_records(view, metadata_topic.name, [
            ConsumedRecord(r.metadata_partition, r.offset, RecordKey.decode(r.key),
                           None if r.value is None else codec.decode(r.value)) for r in kept
        ], ends)
    finally:
        view.close()
    run = tierlog("verify", "topic", "--state-dir", str(tmp_path), "--json", *metadata_topic.options())
    assert run.returncode == 1
    result: Any = run.json()
    assert result["ok"] is False
    assert result["checks"][0]["view_digest"] != result["checks"][0]["topic_digest"]


def test_a_command_without_kafka_settings_exits_2_and_says_how_to_give_them(
    tierlog: Tierlog, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "S3_"))}
    run = tierlog("archive", "--once", "--archive", str(tmp_path), cwd=tmp_path, env=env)
    assert run.returncode == 2
    assert "bootstrap.servers" in run.stderr and "KAFKA_BOOTSTRAP" in run.stderr


def test_archive_then_snapshot_then_rebuild_from_it_reaches_the_topic_digest(
    metadata_topic: MetadataTopic,
    tierlog: Tierlog,
    spark: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    archive = str(tmp_path / "archive")
    archived = tierlog("archive", "--once", "--archive", archive, "--json", *metadata_topic.options())
    assert archived.returncode == 0, archived.stderr
    result: Any = archived.json()
    assert result["records_archived"] == len(metadata_topic.records)

    snapshot = tmp_path / "snapshot.avro"
    code = main(
        ["snapshot", "--archive", archive, "--out", str(snapshot), "--json", *metadata_topic.options()]
    )
    assert code == 0
    capsys.readouterr()

    rebuilt = tierlog("rebuild", "--snapshot", str(snapshot), "--state-dir", str(tmp_path / "node"), "--json",
                      *metadata_topic.options())
    assert rebuilt.returncode == 0, rebuilt.stderr
    loaded: Any = rebuilt.json()
    assert loaded["source"] == "snapshot"
    assert loaded["digest"] == fold(metadata_topic.records).digest()


def test_reconcile_of_an_empty_bucket_reports_topics_the_cluster_does_not_list_and_deletes_nothing(
    metadata_topic: MetadataTopic,
    rebuilt_node: tuple[Path, Run],
    spark: SparkSession,
    s3_endpoint: S3Endpoint,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The generated history's topics never existed in the cluster: a listing is no proof of deletion, so they are
    # reported as not listed, their segments' objects as missing (tests/cli/test_reconcile_safety.py: issue 24).
    state_dir, _ = rebuilt_node
    bucket = f"s3://{s3_endpoint.bucket}/cli-empty-{uuid.uuid4().hex[:8]}"
    code = main(["reconcile", "--state-dir", str(state_dir), "--bucket", bucket, "--json",
                 *metadata_topic.options()])
    report = json.loads(capsys.readouterr().out)
    folded = fold(metadata_topic.records)
    topics = {str(tp.topic_id): tp.topic for tp in folded.user_partitions()
              if any(True for _ in folded.segments_of(tp))}
    assert code == 1
    assert {t["topic_id"]: t["topic"] for t in report["unlisted_topics"]} == topics
    assert report["missing_count"] == 2 * sum(1 for tp in folded.user_partitions() for md in folded.segments_of(tp)
                                              if md.state.name == "COPY_SEGMENT_FINISHED")
    assert report["orphan_count"] == 0 and report["deleted"] == []


def test_replay_of_the_archive_against_the_rebuilt_view_matches_and_lists_its_partitions(
    metadata_topic: MetadataTopic,
    rebuilt_node: tuple[Path, Run],
    tierlog: Tierlog,
    spark: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state_dir, _ = rebuilt_node
    archive = str(tmp_path / "archive")
    assert tierlog("archive", "--once", "--archive", archive, *metadata_topic.options()).returncode == 0
    # --spark: a small archive would otherwise be replayed in-process (test_cli_small_jobs.py).
    code = main(["replay", "--spark", "--archive", archive, "--state-dir", str(state_dir), "--partitions", "--json",
                 *metadata_topic.options()])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["matches"] is True
    folded = fold(metadata_topic.records)
    expected = {
        (tp.topic, tp.partition, sum(1 for _ in folded.segments_of(tp)))
        for tp in folded.user_partitions() if any(True for _ in folded.segments_of(tp))
    }
    assert {(p["topic"], p["partition"], p["segments"]) for p in report["partitions"]} == expected


def test_usage_writes_its_table_and_chart_and_prints_remote_bytes_per_topic(
    metadata_topic: MetadataTopic,
    tierlog: Tierlog,
    spark: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    archive = str(tmp_path / "archive")
    assert tierlog("archive", "--once", "--archive", archive, *metadata_topic.options()).returncode == 0
    code = main(["usage", "--spark", "--archive", archive, "--out", str(tmp_path / "usage"),
                 *metadata_topic.options()])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("TOPIC")
    assert (tmp_path / "usage" / "usage.csv").is_file()
    assert (tmp_path / "usage" / "usage.png").read_bytes().startswith(b"\x89PNG")


def test_spark_submit_runs_the_replay_job_unchanged(
    metadata_topic: MetadataTopic, rebuilt_node: tuple[Path, Run], tierlog: Tierlog, tmp_path: Path
) -> None:
    state_dir, _ = rebuilt_node
    archive = str(tmp_path / "archive")
    assert tierlog("archive", "--once", "--archive", archive, *metadata_topic.options()).returncode == 0
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    completed = subprocess.run(
        [str(spark_submit), "--master", "local[2]", "--packages", ",".join(spark_packages(with_s3=False)),
         "--conf", f"spark.jars.ivy={DEFAULT_IVY_DIR}", "--conf", "spark.ui.showConsoleProgress=false",
         "tierlog/cli/submit.py", "replay", "--archive", archive, "--state-dir", str(state_dir), "--json",
         *metadata_topic.options()],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout)
    assert report["matches"] is True
    assert report["archived_records"] == len(metadata_topic.records)


def test_verify_against_an_empty_bucket_reports_missing_objects_of_topics_the_cluster_does_not_list(
    metadata_topic: MetadataTopic,
    rebuilt_node: tuple[Path, Run],
    spark: SparkSession,
    s3_endpoint: S3Endpoint,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The generated history's topics never existed in the cluster; a listing is no proof of deletion (issue 24),
    # so their segments' objects are missing and the advice names the topics the cluster does not list.
    state_dir, _ = rebuilt_node
    bucket = f"s3://{s3_endpoint.bucket}/cli-verify-{uuid.uuid4().hex[:8]}"
    code = main(["verify", "bucket", "--state-dir", str(state_dir), "--bucket", bucket,
                 *metadata_topic.options()])
    out = capsys.readouterr().out
    assert code == 1
    assert "view against bucket  no" in out and "the BUCKET lost data" in out
    assert "not listed by the cluster" in out and "--deleted-topic-id" in out
