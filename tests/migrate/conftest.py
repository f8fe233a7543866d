"""Shared setup of the migration tests: Kafka's own serde and its TopicBasedRemoteLogMetadataManager through small
Java probes, and the rlmm test helpers.

`kafka_probe` runs tests/migrate/KafkaSerdeProbe.java, `tbrlmm` tests/migrate/TbrlmmProbe.java, against the Kafka jars
dev/services caches (.dev/kafka-libs).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

_TESTS_DIR = Path(__file__).resolve().parents[1]
for _path in (str(_TESTS_DIR), str(_TESTS_DIR / "rlmm")):  # support.* and the rlmm strategies and testkit
    if _path not in sys.path:
        sys.path.insert(0, _path)

from migrate_testkit import Tbrlmm, source_partitions  # noqa: E402

from dev.kafka import default_libs_dir, java_executable, kafka_libs_cached  # noqa: E402

PROBE = Path(__file__).resolve().parent / "KafkaSerdeProbe.java"
PROBE_TIMEOUT_S = 120.0  # compiling the probe takes a few seconds; answering a few thousand lines, less


@pytest.fixture(scope="session")
def kafka_probe() -> Callable[[Sequence[str]], list[str]]:
    """Send request lines to Kafka's real RemoteLogMetadataSerde / partitioner; one answer line per request."""
    if not kafka_libs_cached():
        pytest.skip(f"the Kafka jars are not in {default_libs_dir()} (`dev/services up` fetches them)")

    def ask(requests: Sequence[str]) -> list[str]:
        result = subprocess.run(
            [java_executable(), "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{default_libs_dir()}/*",
             str(PROBE)],
            input="".join(f"{line}\n" for line in requests), capture_output=True, text=True,
            timeout=PROBE_TIMEOUT_S, check=False,
        )
        assert result.returncode == 0, f"the Kafka probe failed:\n{result.stderr[-4000:]}"
        answers = result.stdout.splitlines()
        assert len(answers) == len(requests), result.stderr[-4000:]
        return answers

    return ask


@pytest.fixture(scope="module")
def tbrlmm(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tbrlmm]:
    """One TBRLMM JVM for the module, on the dev broker's `__remote_log_metadata`."""
    if not kafka_libs_cached():
        pytest.skip(f"the Kafka jars are not in {default_libs_dir()} (`dev/services up` fetches them)")
    partitions = source_partitions(kafka_bootstrap)
    workdir = tmp_path_factory.mktemp("tbrlmm")
    with open(workdir / "stderr.log", "w", encoding="utf-8") as stderr:
        probe = Tbrlmm(kafka_bootstrap, partitions, workdir / "log", stderr)
        try:
            yield probe
        finally:
            probe.close()
