"""The metadata topic's min.insync.replicas follows its replication factor (issue 24): unset, min(2, RF), so a
topic of RF 1 accepts writes; set above the RF, a config error naming both keys before anything is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmm import ConfigError, RemoteLogMetadataManager
from rlmm.event_log import TopicSettings


def settings(replication_factor: int, min_insync_replicas: int | None) -> TopicSettings:
    return TopicSettings("__tierlog_metadata", 50, replication_factor, min_insync_replicas, 0, {})


@pytest.mark.parametrize(("replication_factor", "expected"), [(1, "1"), (2, "2"), (3, "2"), (5, "2")])
def test_unset_min_insync_replicas_is_two_or_the_replication_factor_if_lower(
    replication_factor: int, expected: str
) -> None:
    assert settings(replication_factor, None).configs()["min.insync.replicas"] == expected


def test_an_explicit_min_insync_replicas_is_used_as_given() -> None:
    assert settings(3, 3).configs()["min.insync.replicas"] == "3"


def test_min_insync_replicas_above_the_replication_factor_is_refused_naming_both_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"metadata\.topic\.min\.insync\.replicas \(2\).*"
                                          r"metadata\.topic\.replication\.factor \(1\)"):
        RemoteLogMetadataManager({"bootstrap.servers": "127.0.0.1:1", "broker.id": 0, "state.dir": str(tmp_path),
                                  "metadata.topic.replication.factor": 1, "metadata.topic.min.insync.replicas": 2})
