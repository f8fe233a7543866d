"""The agent's log as a person reads it: librdkafka's connection noise while the broker starts is held back
(then one clear line), and the log file is rotated by size."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tierlog.agent.server import QuietClientLog

DEADLINE_S = 30.0


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _refused_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"  # closed again: connecting is refused


def _client_lines(name: str, address: str, quiet: QuietClientLog | None, seconds: float,
                  enough: Callable[[list[str]], bool] = lambda lines: False) -> list[str]:
    """What a real librdkafka producer logs in `seconds` against a refused address, through `quiet` (less, once the
    lines are `enough`)."""
    logger = logging.getLogger(f"test.rdkafka.{name}")
    logger.propagate = False
    lines = _Lines()
    logger.handlers[:] = [lines]
    if quiet is not None:
        logger.filters[:] = [quiet]
    producer = Producer({"bootstrap.servers": address, "logger": logger, "reconnect.backoff.max.ms": 200})
    until = time.monotonic() + seconds
    while time.monotonic() < until and not enough(lines.lines):
        producer.poll(0.1)
    return lines.lines


def _refused(lines: list[str]) -> list[str]:
    return [line for line in lines if "Connection refused" in line]


def test_connection_refused_lines_are_held_back_while_the_broker_starts_then_summarised() -> None:
    address = _refused_address()
    noisy = _client_lines("noisy", address, None, DEADLINE_S, enough=lambda lines: len(_refused(lines)) >= 2)
    # The noise this guards against: librdkafka reports every refused connection attempt.
    assert len(_refused(noisy)) >= 2, noisy

    now = [0.0]
    quiet = QuietClientLog(startup_quiet_s=60.0, interval_s=60.0, clock=lambda: now[0])
    assert not [line for line in _client_lines("quiet", address, quiet, 3.0) if "refused" in line]

    now[0] = 61.0  # the broker should be up by now: a lasting failure shows, once, with what was held back
    after = _client_lines("after", address, quiet, 3.0)
    refused = _refused(after)
    assert len(refused) == 1, after
    assert "similar lines held back" in refused[0], refused[0]


def test_repeated_client_lines_are_rate_limited_per_kind() -> None:
    now = [100.0]
    quiet = QuietClientLog(startup_quiet_s=0.0, interval_s=60.0, clock=lambda: now[0])

    def passes(message: str) -> bool:
        return quiet.filter(logging.LogRecord("x", logging.ERROR, __file__, 1, message, None, None))

    assert passes("FAIL [rdkafka#producer-1] 10.0.0.1:9092/1: Disconnected (after 5ms)")
    assert not passes("FAIL [rdkafka#producer-1] 10.0.0.1:9092/1: Disconnected (after 17ms)")
    assert passes("REQTMOUT [rdkafka#producer-1] Timed out 1 in-flight request")  # another kind
    now[0] += 61.0
    assert passes("FAIL [rdkafka#producer-1] 10.0.0.1:9092/1: Disconnected (after 9ms)")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="tll-") as directory:
        yield Path(directory)


def _wait_for(path: Path, text: str) -> None:
    until = time.monotonic() + DEADLINE_S
    while time.monotonic() < until:
        if any(text in p.read_text(errors="replace") for p in path.parent.glob(path.name + "*")):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path}* within {DEADLINE_S} s")


def test_the_agent_log_file_is_rotated_by_size(short_dir: Path) -> None:
    log_file = short_dir / "agent.log"
    agent = subprocess.Popen(
        [sys.executable, "-m", "tierlog.agent.server", "--socket", str(short_dir / "a.sock"),
         "--log-file", str(log_file), "--log-max-bytes", "60", "--log-backups", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        _wait_for(log_file, "serving on")
        agent.send_signal(signal.SIGTERM)
        agent.wait(DEADLINE_S)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(DEADLINE_S)
    # Each line (serving, signal, stopped) is longer than 60 bytes, so each starts a new file; only the
    # two backups asked for are kept.
    files = sorted(p.name for p in short_dir.glob("agent.log*"))
    assert files == ["agent.log", "agent.log.1", "agent.log.2"], files
    assert "tierlog agent stopped" in log_file.read_text()
    assert agent.stdout is not None and agent.stdout.read() == b""  # everything went to the rotated log


def test_an_rlmm_that_cannot_reach_kafka_logs_one_clear_line(short_dir: Path) -> None:
    log_file = short_dir / "agent.log"
    agent = subprocess.Popen(
        [sys.executable, "-m", "tierlog.agent.server", "--socket", str(short_dir / "a.sock"),
         "--log-file", str(log_file),
         "--config", f"rlmm.bootstrap.servers={_refused_address()}",
         "--config", "rlmm.broker.id=0", "--config", f"rlmm.state.dir={short_dir / 'state'}",
         "--config", "rlmm.startup.timeout.ms=4000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        _wait_for(log_file, "creating the rlmm failed")
    finally:
        agent.terminate()
        agent.wait(DEADLINE_S)
    text = log_file.read_text()
    assert "Connection refused" not in text, text
    assert text.count("creating the rlmm failed") == 1, text
