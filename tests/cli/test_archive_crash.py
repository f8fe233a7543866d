"""`tierlog archive` killed with SIGKILL while the topic grows, then restarted: nothing lost, nothing twice.

The resume point comes only from the files in audit/, so every restart must continue exactly where the
last whole file ended.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from cli_testkit import REPO_ROOT, TIERLOG, Run, archived_offsets
from support.spark import s3_settings
from support.topics import create_topic, unique_topic_name

from dev.s3 import S3Endpoint
from rlmm.archive import archive_key, encode_archive_file, to_archived
from rsm.backend import ObjectInfo
from rsm.backends.filesystem import FilesystemBackend
from rsm.metrics import Metrics
from tierlog.audit.archiver import Archiver, ArchiverSettings, list_archive_files
from tierlog.pipeline.generate import HistoryGenerator, HistorySpec, produce_history
from tierlog.pipeline.locations import open_store
from tierlog.pipeline.session import S3Settings

KILLS = 4


def archive_offsets(location: str, topic: str, settings: S3Settings) -> tuple[Counter[tuple[int, int]], int]:
    return archived_offsets(open_store(location, settings), topic)


def test_archiver_killed_and_restarted_archives_every_record_exactly_once(
    kafka_bootstrap: str, s3_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    spec = HistorySpec(events=6_000, metadata_partitions=3, topics=2, partitions_per_topic=3, seed=29)
    records = list(HistoryGenerator(spec).records())
    topic = create_topic(kafka_bootstrap, unique_topic_name("archive-crash"), partitions=3,
                         config={"cleanup.policy": "compact"})
    location = f"s3://{s3_endpoint.bucket}/archive-crash-{uuid.uuid4().hex[:10]}"
    settings = s3_settings(s3_endpoint)
    command = [
        *TIERLOG, "archive", "--archive", location, "-o", f"bootstrap.servers={kafka_bootstrap}",
        "-o", f"metadata.topic.name={topic}", "-o", "archive.max.records.per.file=37",
        "-o", "archive.max.interval.ms=100",
    ]
    rng = random.Random(3)
    chunk = len(records) // KILLS
    files_before = 0
    for round_number in range(KILLS):
        archiver = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            produce_history(kafka_bootstrap, topic, records[round_number * chunk:(round_number + 1) * chunk])
            # Kill it mid-stream: once it has written something new, after a random extra moment.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if archive_offsets(location, topic, settings)[1] > files_before:
                    break
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 0.5))
        finally:
            archiver.send_signal(signal.SIGKILL)
            archiver.wait(10)
        files_now = archive_offsets(location, topic, settings)[1]
        assert files_now > files_before, f"round {round_number}: archiver wrote nothing before the kill"
        files_before = files_now
    produce_history(kafka_bootstrap, topic, records[KILLS * chunk:])

    finish = subprocess.run([*command, "--once"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    run = Run(finish.returncode, finish.stdout, finish.stderr)
    assert run.returncode == 0, run.stderr

    held, _files = archive_offsets(location, topic, settings)
    assert held == Counter((r.metadata_partition, r.offset) for r in records)


class PredecessorRacingStore(FilesystemBackend):
    """A real filesystem store where a paused predecessor's file lands after our resume, before our flush.

    The race (another archiver writing between our resume and our flush) cannot be timed on demand
    against real processes, so the store plays the predecessor at that moment: on the second listing
    (the first is the resume, the second the check before writing).
    """

    def __init__(self, root: Path, predecessor_key: str, predecessor_file: bytes) -> None:
        super().__init__(root, Metrics())
        self._pending: tuple[str, bytes] | None = (predecessor_key, predecessor_file)
        self._listings = 0

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._listings += 1
        if self._listings == 2 and self._pending is not None:
            pending, self._pending = self._pending, None
            self.put(*pending)
        return super().list(prefix)


def test_archiver_keeps_only_what_follows_a_file_a_predecessor_wrote_after_it_resumed(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    records = list(HistoryGenerator(HistorySpec(events=300, metadata_partitions=1, seed=8)).records())
    topic = create_topic(kafka_bootstrap, unique_topic_name("archive-race"), partitions=1,
                         config={"cleanup.policy": "compact"})
    produce_history(kafka_bootstrap, topic, records)
    head = [to_archived(topic, 0, r.offset, r.timestamp_ms, r.key, r.value) for r in records[:150]]
    store = PredecessorRacingStore(
        tmp_path, archive_key(topic, 0, 0, 149), encode_archive_file(topic, 0, head)
    )
    archiver = Archiver(store, ArchiverSettings(kafka_bootstrap, topic, max_records_per_file=1_000))
    stats = archiver.run_until_caught_up(60)

    held, _ = archived_offsets(store, topic)
    assert held == Counter((0, r.offset) for r in records)
    assert stats.files_skipped_as_already_archived == 1
    assert [(f.first_offset, f.last_offset) for f in list_archive_files(store, topic)] == [
        (0, 149), (150, len(records) - 1)
    ]
