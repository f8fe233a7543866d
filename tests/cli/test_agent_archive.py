"""`tierlog agent --archive`: the agent serves its socket and archives the metadata topic alongside.

The embedded archiver joins a consumer group, so several agents split the metadata partitions.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from cli_testkit import REPO_ROOT, TIERLOG, archived_offsets
from support.topics import create_topic, unique_topic_name

from tierlog.pipeline.generate import HistoryGenerator, HistorySpec, produce_history
from tierlog.pipeline.locations import open_store


def archived(location: Path, topic: str) -> Counter[tuple[int, int]]:
    return archived_offsets(open_store(str(location)), topic)[0]


def test_agent_with_archive_serves_its_socket_and_archives_every_record_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic_name("agent-archive"), partitions=2,
                         config={"cleanup.policy": "compact"})
    records = list(HistoryGenerator(HistorySpec(events=800, metadata_partitions=2, seed=41)).records())
    socket = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        [*TIERLOG, "agent", "--socket", str(socket), "--archive",
         "-o", f"bootstrap.servers={kafka_bootstrap}", "-o", f"metadata.topic.name={topic}",
         "-o", f"archive.location={tmp_path / 'archive'}",
         "-o", "archive.max.interval.ms=200"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        produce_history(kafka_bootstrap, topic, records)
        expected = Counter((r.metadata_partition, r.offset) for r in records)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and archived(tmp_path / "archive", topic) != expected:
            time.sleep(0.5)
        assert socket.is_socket()
    finally:
        agent.send_signal(signal.SIGTERM)
        _out, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    assert archived(tmp_path / "archive", topic) == expected
