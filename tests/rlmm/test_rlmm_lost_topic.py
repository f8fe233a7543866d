"""A metadata topic deleted under a running manager is not re-created by its writes: a broker that auto-creates
topics would make one without the metadata topic's settings (not compacted, one partition), and records would land
there. The write fails by its deadline instead, and the topic stays gone for `tierlog restore` to re-create.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rlmm_testkit import make_tp, register, segment
from support.topics import admin_client

from rlmm import RemoteLogMetadataManager, RemoteStorageError

WRITE_TIMEOUT_MS = 3_000


def _topics(bootstrap: str) -> set[str]:
    return set(admin_client(bootstrap).list_topics(timeout=10).topics)


def test_a_write_after_the_metadata_topic_is_deleted_fails_and_does_not_create_it_again(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str
) -> None:
    manager = make_manager(**{"write.timeout.ms": WRITE_TIMEOUT_MS})
    tp = make_tp()
    register(manager, tp)
    manager.add_remote_log_segment_metadata(segment(tp, 0, 99, {0: 0})).result(10)

    admin = admin_client(kafka_bootstrap)
    admin.delete_topics([metadata_topic])[metadata_topic].result(30)

    with pytest.raises((RemoteStorageError, TimeoutError)):
        manager.add_remote_log_segment_metadata(segment(tp, 100, 199, {0: 100})).result(WRITE_TIMEOUT_MS / 1000 + 10)
    assert metadata_topic not in _topics(kafka_bootstrap)
