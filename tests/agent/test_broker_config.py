"""What the agent makes of the maps a broker hands the plugins' configure(): Kafka's own keys are turned
into the rlmm's bootstrap.servers, broker.id and state.dir, or dropped, and missing facts are named."""

from __future__ import annotations

import pytest

from rlmm.errors import ConfigError
from tierlog.agent.broker_config import rlmm_config, rsm_config

KAFKA_ADDS = {
    "broker.id": "2",
    "node.id": "2",
    "log.dir": "/data/kafka/logs",
    "cluster.id": "abc",
    "remote.log.metadata.common.client.bootstrap.servers": "10.0.0.5:9092",
    "remote.log.metadata.common.client.security.protocol": "PLAINTEXT",
}


def test_bootstrap_servers_come_from_the_listener_kafka_passes() -> None:
    assert rlmm_config(KAFKA_ADDS)["bootstrap.servers"] == "10.0.0.5:9092"


def test_explicit_bootstrap_servers_win_over_the_listener() -> None:
    assert rlmm_config({**KAFKA_ADDS, "bootstrap.servers": "k:1"})["bootstrap.servers"] == "k:1"


def test_listener_client_settings_become_the_rlmms_kafka_client_settings() -> None:
    config = rlmm_config({**KAFKA_ADDS, "remote.log.metadata.common.client.security.protocol": "SSL"})

    assert config["kafka.security.protocol"] == "SSL"


def test_state_dir_is_derived_beside_the_log_dir_not_inside_it() -> None:
    assert rlmm_config(KAFKA_ADDS)["state.dir"] == "/data/kafka/tierlog-rlmm-state-2"


def test_kafkas_other_keys_are_not_passed_to_the_rlmm() -> None:
    config = rlmm_config(KAFKA_ADDS)

    assert not {"node.id", "log.dir", "cluster.id"} & set(config)
    assert not [k for k in config if k.startswith("remote.log.metadata.common.client.")]


def test_missing_bootstrap_servers_names_both_ways_to_set_it() -> None:
    broker = {k: v for k, v in KAFKA_ADDS.items() if "common.client" not in k}

    with pytest.raises(ConfigError, match=r"rlmm\.config\.bootstrap\.servers.*listener\.name"):
        rlmm_config(broker)


def test_missing_state_dir_without_a_log_dir_is_named() -> None:
    broker = {k: v for k, v in KAFKA_ADDS.items() if k != "log.dir"}

    with pytest.raises(ConfigError, match=r"state\.dir"):
        rlmm_config(broker)


def test_rsm_gets_its_own_keys_without_kafkas_broker_and_node_ids() -> None:
    # Kafka passes its RSM no log.dirs: the rsm then reads only files inside a Kafka log directory.
    assert rsm_config({"storage.backend": "filesystem", "broker.id": "1", "node.id": "1"}) == {
        "storage.backend": "filesystem", "log.dirs.detect": "true",
    }
