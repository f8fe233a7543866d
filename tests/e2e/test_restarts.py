"""Restarts on a single tierlog broker: the broker itself (metadata survives in the metadata topic and the
agent's RocksDB view) and the agent alone, killed while the broker tiers and serves data."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from e2e_testkit import agent_pid, describe, finished, remote_segments, wait_for_new_agent

from dev.demo import consume, create_topic, produce, wait_for, wait_until_tiered
from dev.kafka import KafkaCluster

RECORDS = 25_000


def test_broker_restart_keeps_remote_metadata_and_serves_remote_data(
    tiered_cluster: Callable[..., KafkaCluster], socket_dir: Path
) -> None:
    cluster = tiered_cluster()
    create_topic(cluster.bootstrap, "restarted")
    produce(cluster.bootstrap, "restarted", 0, RECORDS)
    wait_until_tiered(cluster.log_dir(0), "restarted", min_local_start=RECORDS // 2)
    tp, _ = describe(cluster.bootstrap, "restarted")
    before = finished(remote_segments(socket_dir, 0, tp))

    cluster.restart_node(0)

    after = wait_for(
        lambda: finished(remote_segments(socket_dir, 0, tp)), 60, "the rlmm to serve the partition"
    )
    assert [s.remote_log_segment_id for s in after][: len(before)] == [
        s.remote_log_segment_id for s in before
    ]
    read = consume(cluster.bootstrap, "restarted", RECORDS)
    assert read.indexes == list(range(RECORDS))
    assert not read.mismatched


def test_agent_killed_while_tiering_is_restarted_and_nothing_is_lost_or_duplicated(
    tiered_cluster: Callable[..., KafkaCluster], socket_dir: Path
) -> None:
    cluster = tiered_cluster()
    create_topic(cluster.bootstrap, "agent-killed")
    produce(cluster.bootstrap, "agent-killed", 0, RECORDS)
    wait_until_tiered(cluster.log_dir(0), "agent-killed", min_local_start=RECORDS // 4)
    first_agent = agent_pid(socket_dir, 0)
    assert first_agent is not None

    # Kill the agent in the middle of a second round of produce (and so of segment copies).
    producing = threading.Thread(target=produce, args=(cluster.bootstrap, "agent-killed", RECORDS, RECORDS))
    producing.start()
    os.kill(first_agent, signal.SIGKILL)
    producing.join(180)
    assert not producing.is_alive()

    wait_for_new_agent(socket_dir, 0, first_agent)
    wait_until_tiered(cluster.log_dir(0), "agent-killed", min_local_start=RECORDS + RECORDS // 2, timeout=120)
    read = consume(cluster.bootstrap, "agent-killed", 2 * RECORDS, timeout=150)
    assert read.indexes == list(range(2 * RECORDS))
    assert read.offsets == list(range(2 * RECORDS))
    assert not read.mismatched
    assert cluster.is_running(0)


def _start_agent(socket: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tierlog.agent.server", "--socket", str(socket)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    wait_for(lambda: agent_pid(socket.parent, 0) == process.pid, 30, f"the agent on {socket}")
    return process


def test_broker_serves_local_data_while_its_external_agent_is_down_and_resumes_tiering_when_it_returns(
    tiered_cluster: Callable[..., KafkaCluster], socket_dir: Path
) -> None:
    socket = socket_dir / "agent-0.sock"
    agent = _start_agent(socket, socket_dir / "external-agent.log")
    try:
        cluster = tiered_cluster(
            extra={"rlmm.config.agent.start": "false", "rsm.config.agent.start": "false"}
        )
        create_topic(cluster.bootstrap, "agent-down")
        produce(cluster.bootstrap, "agent-down", 0, RECORDS)
        wait_until_tiered(cluster.log_dir(0), "agent-down", min_local_start=RECORDS // 4)

        agent.kill()
        agent.wait(10)
        produce(cluster.bootstrap, "agent-down", RECORDS, RECORDS)
        recent = consume(cluster.bootstrap, "agent-down", RECORDS, start_offset=RECORDS, timeout=60)
        assert recent.indexes == list(range(RECORDS, 2 * RECORDS))
        wait_for(
            lambda: "tierlog agent at" in cluster.log_file(0).read_text(errors="replace"),
            30,
            "the broker to log that the agent is unreachable",
        )

        agent = _start_agent(socket, socket_dir / "external-agent.log")
        wait_until_tiered(
            cluster.log_dir(0), "agent-down", min_local_start=RECORDS + RECORDS // 2, timeout=120
        )
        read = consume(cluster.bootstrap, "agent-down", 2 * RECORDS, timeout=150)
        assert read.indexes == list(range(2 * RECORDS))
        assert not read.mismatched
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_hung_agent_is_replaced_and_the_brokers_reads_of_tiered_data_recover(
    tiered_cluster: Callable[..., KafkaCluster], socket_dir: Path
) -> None:
    cluster = tiered_cluster()
    create_topic(cluster.bootstrap, "agent-hung")
    produce(cluster.bootstrap, "agent-hung", 0, RECORDS)
    wait_until_tiered(cluster.log_dir(0), "agent-hung", min_local_start=RECORDS // 4)
    hung = agent_pid(socket_dir, 0)
    assert hung is not None

    os.kill(hung, signal.SIGSTOP)  # the agent's process exists and holds its socket but answers nothing
    try:
        # Reading the tiered records makes the broker's lookups miss their deadline; the adapter finds the
        # agent hung, kills it and starts another, and the same read then completes.
        read = consume(cluster.bootstrap, "agent-hung", RECORDS, timeout=120)
        wait_for_new_agent(socket_dir, 0, hung, timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung, signal.SIGCONT)

    assert read.indexes == list(range(RECORDS))
    assert not read.mismatched
    lines = cluster.log_file(0).read_text(errors="replace").splitlines()
    tierlog = [line for line in lines if "tierlog" in line]
    # The broker logs a failed remote read at its own level; the lookup failed on its 5 s deadline.
    assert any("did not answer" in line and "within 5000 ms" in line for line in tierlog), tierlog[-30:]
    warnings = [line for line in tierlog if " WARN " in line]
    for expected in (
        "is hung",
        f"Stopping the tierlog agent (pid {hung})",
        "because it was hung",
        f"(pid {hung}) at {socket_dir / 'agent-0.sock'} exited with status 137",
    ):
        assert any(expected in line for line in warnings), (expected, tierlog[-30:])
