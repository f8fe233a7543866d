"""`tierlog archive`, the audit loop on its own: it archives every metadata partition, writes bootstrap snapshots
under `snapshot.location` and serves the agent's tierlog_archiver_* metrics; `--once` writes a snapshot too.
(The agent's own audit component: tests/metrics/test_agent_archiving.py.)"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from urllib.request import urlopen

from cli_testkit import REPO_ROOT, TIERLOG, archived_offsets
from prometheus_client.parser import text_string_to_metric_families
from support.topics import create_topic, unique_topic_name

from rlmm.bootstrap import list_snapshots
from rsm.snapshot_source import BucketSnapshotSource
from tierlog.audit.assignment import MetadataTopicDescriber
from tierlog.pipeline.generate import HistoryGenerator, HistorySpec, produce_history
from tierlog.pipeline.locations import open_store

LOCATION = "snapshots"


def metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def new_topic(kafka_bootstrap: str, name: str, events: int) -> tuple[str, Counter[tuple[int, int]]]:
    topic = create_topic(kafka_bootstrap, unique_topic_name(name), partitions=2, config={"cleanup.policy": "compact"})
    records = list(HistoryGenerator(HistorySpec(events=events, metadata_partitions=2, seed=41)).records())
    produce_history(kafka_bootstrap, topic, records)
    return topic, Counter((r.metadata_partition, r.offset) for r in records)


def test_tierlog_archive_archives_writes_snapshots_and_serves_its_metrics(kafka_bootstrap: str, tmp_path: Path
                                                                         ) -> None:
    topic, expected = new_topic(kafka_bootstrap, "archive-loop", 400)
    archive = open_store(str(tmp_path / "archive"))
    command = subprocess.Popen(
        [*TIERLOG, "archive", "--archive", str(tmp_path / "archive"), "--metrics-port", "0",
         "-o", f"bootstrap.servers={kafka_bootstrap}", "-o", f"metadata.topic.name={topic}",
         "-o", f"snapshot.location={LOCATION}", "-o", "snapshot.interval.ms=200", "-o", "archive.max.interval.ms=100"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert command.stderr is not None
        banner = command.stderr.readline()
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", banner)[1])  # type: ignore[index]
        topic_id = MetadataTopicDescriber({"bootstrap.servers": kafka_bootstrap}, topic, None).assignment().topic_id
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = metrics(port)
            if found.get(("tierlog_archiver_lag_records", (("partition", "1"),))) == 0 and \
                    found.get(("tierlog_archiver_lag_records", (("partition", "0"),))) == 0 and \
                    list_snapshots(BucketSnapshotSource(archive), LOCATION, topic, topic_id):
                break
            time.sleep(0.2)
        found = metrics(port)
    finally:
        command.send_signal(signal.SIGTERM)
        _out, err = command.communicate(timeout=30)
    assert command.returncode == 0, err
    assert archived_offsets(archive, topic)[0] == expected
    assert list_snapshots(BucketSnapshotSource(archive), LOCATION, topic, topic_id)
    assert found[("tierlog_archiver_running", ())] == 1
    assert found[("tierlog_archiver_partition_archiving", (("partition", "0"),))] == 1
    assert found[("tierlog_archiver_partition_archiving", (("partition", "1"),))] == 1
    assert found[("tierlog_archiver_archived_offset", (("partition", "0"),))] == \
        max(o for p, o in expected if p == 0)
    assert ("tierlog_archiver_last_snapshot_timestamp_seconds", ()) in found
    assert found[("tierlog_archiver_failures_total", (("stage", "archive"),))] == 0


def test_tierlog_archive_once_writes_a_snapshot_of_what_it_archived(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic, expected = new_topic(kafka_bootstrap, "archive-once", 200)

    run = subprocess.run(
        [*TIERLOG, "archive", "--once", "--json", "--archive", str(tmp_path / "archive"),
         "-o", f"bootstrap.servers={kafka_bootstrap}", "-o", f"metadata.topic.name={topic}",
         "-o", f"snapshot.location={LOCATION}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )

    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["records_archived"] == sum(expected.values())
    archive = open_store(str(tmp_path / "archive"))
    topic_id = MetadataTopicDescriber({"bootstrap.servers": kafka_bootstrap}, topic, None).assignment().topic_id
    assert [ref.key for ref in list_snapshots(BucketSnapshotSource(archive), LOCATION, topic, topic_id)] == \
        [report["snapshot"]]
