"""The metadata end-offset reader rides out a leader change: a fenced or stale leader epoch (which a real
broker answers for a moment after leadership moves, not on demand) is retried on a fresh client until the
deadline; any other failure is reported at once as a tierlog error."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from rlmm import event_log
from rlmm.errors import MetadataLogError


class _Offset:
    def __init__(self, offset: int) -> None:
        self.offset = offset


def _failing_then_answering(failures: list[int], created: list[object]) -> type:
    class Admin:
        def __init__(self, config: dict[str, Any]) -> None:
            created.append(self)

        def list_offsets(self, request: dict[Any, Any], request_timeout: float) -> dict[Any, Future[_Offset]]:
            answers: dict[Any, Future[_Offset]] = {}
            for tp in request:
                future: Future[_Offset] = Future()
                if failures:
                    future.set_exception(KafkaException(KafkaError(failures[0])))
                else:
                    future.set_result(_Offset(42))
                answers[tp] = future
            if failures:
                failures.pop(0)
            return answers

    return Admin


def test_a_fenced_leader_epoch_is_retried_on_a_fresh_client_until_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[object] = []
    failures = [KafkaError.FENCED_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION]
    monkeypatch.setattr(event_log, "AdminClient", _failing_then_answering(failures, created))

    ends = event_log.OffsetReader("meta", {}).end_offsets([0, 1], timeout_s=10)

    assert ends == {0: 42, 1: 42}
    assert len(created) == 3  # a new client after each fenced answer


def test_a_failure_that_is_not_a_leader_change_is_a_tierlog_error_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    failures = [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    monkeypatch.setattr(event_log, "AdminClient", _failing_then_answering(failures, []))

    with pytest.raises(MetadataLogError, match="listing offsets of metadata topic meta failed"):
        event_log.OffsetReader("meta", {}).end_offsets([0], timeout_s=10)


def test_a_leader_change_that_outlasts_the_deadline_fails_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    failures = [KafkaError.FENCED_LEADER_EPOCH] * 1000
    monkeypatch.setattr(event_log, "AdminClient", _failing_then_answering(failures, []))

    with pytest.raises(MetadataLogError, match="FENCED_LEADER_EPOCH"):
        event_log.OffsetReader("meta", {}).end_offsets([0], timeout_s=1)
