"""`tierlog describe` against a dead bootstrap address fails fast and says so once; `tierlog rebuild` into an
empty state dir says what it reads and what it did (issue 24).

describe reads a view written here (no Kafka); rebuild reads the CLI tests' metadata topic on the real broker.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_testkit import MetadataTopic, Run

from rlmm import codec
from rlmm.events import RecordKey
from rlmm.view import ConsumedRecord, MetadataView, apply_records
from tierlog.pipeline.generate import HistoryGenerator, HistorySpec, fold

Tierlog = Callable[..., Run]


def _closed_port() -> int:
    with socket.socket() as probe:  # a port nobody listens on: bound, then released
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def view_of_a_history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """A node's state dir holding a small generated history, one of its topics and its partition count."""
    records = list(HistoryGenerator(HistorySpec(events=300, topics=1, partitions_per_topic=3,
                                                metadata_partitions=2, seed=5)).records())
    state_dir = tmp_path_factory.mktemp("node")
    ends: dict[int, int] = {}
    for r in records:
        ends[r.metadata_partition] = max(ends.get(r.metadata_partition, 0), r.offset + 1)
    view = MetadataView.open(state_dir)
    try:
        apply_records(view, "__meta", [
            ConsumedRecord(r.metadata_partition, r.offset, RecordKey.decode(r.key),
                           None if r.value is None else codec.decode(r.value)) for r in records
        ], ends)
    finally:
        view.close()
    (topic,) = {tp.topic for tp in fold(records).user_partitions()}
    return state_dir, topic, len(fold(records).user_partitions())


def test_describe_against_a_dead_bootstrap_fails_within_seconds_saying_so_once(
    view_of_a_history: tuple[Path, str, int], tierlog: Tierlog
) -> None:
    state_dir, topic, partitions = view_of_a_history
    port = _closed_port()
    started = time.monotonic()
    run = tierlog("describe", topic, "--state-dir", str(state_dir), "--timeout", "30",
                  "-o", f"bootstrap.servers=127.0.0.1:{port}", timeout=60)
    elapsed = time.monotonic() - started

    assert run.returncode == 3
    assert elapsed < 10, f"describe took {elapsed:.1f} s against a closed port"  # not the 30 s timeout
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"tierlog describe: cannot tell which topics the cluster still has: no broker at "
                           f"127.0.0.1:{port} accepts a connection")
    # The view is still described, the topic state unknown, and the error is not repeated in the rows.
    rows = run.stdout.splitlines()[1:]
    assert len(rows) == partitions
    assert all(" unknown " in row for row in rows) and "connection" not in run.stdout


def test_rebuild_into_an_empty_state_dir_says_what_it_reads_and_what_it_did(
    metadata_topic: MetadataTopic, tierlog: Tierlog, tmp_path: Path
) -> None:
    state_dir = tmp_path / "node"
    run = tierlog("rebuild", "--state-dir", str(state_dir), *metadata_topic.options())

    assert run.returncode == 0, run.stderr
    records = len(metadata_topic.records)
    partitions = len(fold(metadata_topic.records).user_partitions())
    started, done = run.stderr.splitlines()
    assert started == (f"rebuilding from topic: reading {records} records of {metadata_topic.name} (3 partitions) "
                       f"at {metadata_topic.bootstrap} into {state_dir}")
    assert done.startswith(f"rebuilding from topic: done, {records} records applied in ")
    assert done.endswith(f"the view holds {partitions} user partitions")
