"""Crash consistency: a writer killed with SIGKILL at random moments, restarted on the same state dir.

After the rounds, the restarted node's view equals a fresh rebuild, and every write it acknowledged is there.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlmm_testkit import make_tp, manager_config, register

from rlmm import RemoteLogMetadataManager, RemoteLogSegmentState

MakeManager = Callable[..., RemoteLogMetadataManager]
ROUNDS = 5
STARTUP_TIMEOUT_S = 60.0
CAUGHT_UP_S = 60.0
HERE = Path(__file__).resolve().parent
ORDER = [s.name for s in RemoteLogSegmentState]


@dataclass
class Round:
    """What one writer process reported before it was killed."""

    sent: list[dict[str, str]] = field(default_factory=list)
    acked: list[dict[str, str]] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)


def run_and_kill(config: dict[str, object], seed: int, topic_id: uuid.UUID, kill_after_s: float) -> Round:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE.parent), str(HERE)])}
    child = subprocess.Popen(
        [sys.executable, str(HERE / "crash_writer.py"), json.dumps(config), str(seed), str(topic_id)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    result = Round()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            tag, _, body = line.strip().partition(" ")
            if tag == "READY":
                result.ready.set()
            elif tag == "SENT":
                result.sent.append(json.loads(body))
            elif tag == "ACK":
                result.acked.append(json.loads(body))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert result.ready.wait(STARTUP_TIMEOUT_S), "the writer process did not get ready"
        time.sleep(kill_after_s)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        reader.join(timeout=10)
    return result


def test_a_writer_killed_at_random_moments_restarts_to_a_fresh_rebuilds_digest_and_keeps_every_acked_write(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str, tmp_path: Path
) -> None:
    rng = random.Random(99)
    topic_id = uuid.uuid4()
    state_dir = tmp_path / "crashing-node"
    config = manager_config(kafka_bootstrap, state_dir, metadata_topic, partitions=2)
    rounds = [run_and_kill(config, seed, topic_id, rng.uniform(0.2, 2.5)) for seed in range(ROUNDS)]
    assert sum(len(r.acked) for r in rounds) > 0, "the writer never completed a write before being killed"

    restarted = make_manager(state_dir=state_dir, partitions=2)
    tps = [make_tp("crash", p, topic_id=topic_id) for p in range(3)]
    register(restarted, *tps)
    restarted.wait_caught_up(CAUGHT_UP_S)
    fresh = make_manager(broker_id=1, partitions=2)
    fresh.wait_caught_up(CAUGHT_UP_S)
    assert restarted.view_digest() == fresh.view_digest()

    states = {str(md.remote_log_segment_id.id): md.state.name for tp in tps
              for md in restarted.list_remote_log_segments(tp)}
    vanishing = {w["segment"] for r in rounds for w in r.sent if w["state"] == "DELETE_SEGMENT_FINISHED"}
    assert [write for r in rounds for write in r.acked if lost(write, states, vanishing)] == []


def lost(write: dict[str, str], states: dict[str, str], vanishing: set[str]) -> bool:
    """An acked write is lost when its segment is behind the acked state, or gone without a sent deletion."""
    segment = write["segment"]
    if segment not in states:
        return segment not in vanishing
    return ORDER.index(states[segment]) < ORDER.index(write["state"])
