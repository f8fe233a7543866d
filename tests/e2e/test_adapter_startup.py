"""What the broker log says about the agent at startup: the RLMM is reported ready only once the agent has
created it, and a creation that fails (a metadata topic replication factor above the broker count) reaches
the broker log as an ERROR naming the cause."""

from __future__ import annotations

from collections.abc import Callable

from dev.demo import wait_for
from dev.kafka import KafkaCluster

FAILED = "tierlog REMOTE_LOG_METADATA_MANAGER failed to start in the agent"


def test_a_metadata_manager_that_cannot_create_its_topic_is_an_error_in_the_broker_log(
    tiered_cluster: Callable[..., KafkaCluster],
) -> None:
    cluster = tiered_cluster(1, metadata_replication_factor=3)

    def failure_line() -> str | None:
        lines = cluster.log_file(0).read_text(errors="replace").splitlines()
        return next((line for line in lines if FAILED in line), None)

    line = wait_for(failure_line, 120, "the RLMM's startup failure in the broker log")
    assert " ERROR " in f" {line} ", line
    assert "replication" in line.lower(), line
    text = cluster.log_file(0).read_text(errors="replace")
    assert "tierlog REMOTE_LOG_METADATA_MANAGER is ready" not in text
    assert "tierlog RLMM configured" not in text


def test_a_healthy_start_says_ready_without_keepalive_warnings(
    tiered_cluster: Callable[..., KafkaCluster],
) -> None:
    cluster = tiered_cluster(1)
    wait_for(
        lambda: "tierlog REMOTE_LOG_METADATA_MANAGER is ready" in cluster.log_file(0).read_text(errors="replace"),
        120, "the RLMM ready line in the broker log",
    )
    text = cluster.log_file(0).read_text(errors="replace")
    assert FAILED not in text
    assert "SO_KEEPALIVE" not in text
