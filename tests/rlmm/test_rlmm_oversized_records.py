"""A metadata record too large for the producer or for the metadata topic fails its own write at once, and the next
write of the same user partition goes ahead: it does not wait for the failed write's deadline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from rlmm_testkit import make_tp, register, segment, update_of
from support.topics import admin_client

from rlmm import RemoteLogMetadataManager, RemoteStorageError
from rlmm.types import RemoteLogSegmentState

S = RemoteLogSegmentState
LIMIT_BYTES = 2_000  # librdkafka's message.max.bytes may not go below 1000
# Far beyond any prompt failure: a write that waited for the failed one's deadline (write.timeout.ms) takes 30 s.
WRITE_TIMEOUT_MS = 30_000
PROMPT_S = 2.0


def _limit_topic(bootstrap: str, topic: str) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", str(LIMIT_BYTES), incremental_operation=AlterConfigOpType.SET)])
    admin = admin_client(bootstrap)  # held until the answer: a client let go cancels its requests
    admin.incremental_alter_configs([resource])[resource].result(30)


@pytest.mark.parametrize("refused_by", ["producer", "broker"])
def test_a_write_too_large_fails_at_once_and_the_partitions_next_write_goes_ahead(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str, refused_by: str
) -> None:
    # The producer refuses a record over its own message.max.bytes before sending it (MSG_SIZE_TOO_LARGE); the
    # broker refuses one over the topic's max.message.bytes (the same error, in the delivery report).
    extra = {"kafka.message.max.bytes": LIMIT_BYTES} if refused_by == "producer" else {}
    manager = make_manager(**{"write.timeout.ms": WRITE_TIMEOUT_MS, **extra})
    if refused_by == "broker":
        _limit_topic(kafka_bootstrap, metadata_topic)
    tp = make_tp()
    register(manager, tp)
    copied = segment(tp, 0, 99, {0: 0})
    manager.add_remote_log_segment_metadata(copied).result(PROMPT_S)

    oversized = manager.update_remote_log_segment_metadata(
        update_of(copied, S.COPY_SEGMENT_FINISHED, custom_metadata=b"x" * (2 * LIMIT_BYTES)))
    with pytest.raises(RemoteStorageError, match="Message size too large"):
        oversized.result(PROMPT_S)
    following = segment(tp, 100, 199, {0: 100})
    manager.add_remote_log_segment_metadata(following).result(PROMPT_S)
    finished = manager.update_remote_log_segment_metadata(update_of(copied, S.COPY_SEGMENT_FINISHED))
    finished.result(PROMPT_S)
    assert manager.list_remote_log_segments(tp) == [
        dataclasses.replace(copied, state=S.COPY_SEGMENT_FINISHED, broker_id=1, event_timestamp_ms=1_700_000_000_001),
        following]
