"""A component is created in the background (the rlmm may wait for the very broker configuring it): calls
that only inform it are queued until it exists, and reads wait for it within their deadline."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from rlmm.errors import RemoteStorageNotReadyError
from tierlog.agent.components import ComponentName, ComponentSlot, NotConfiguredError


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []


def _slow_factory(release: threading.Event) -> Any:
    def create(config: Mapping[str, Any]) -> _Recorder:
        release.wait(10)
        return _Recorder()

    return create


def test_informing_calls_made_before_creation_run_in_order_once_created() -> None:
    release = threading.Event()
    slot: ComponentSlot[_Recorder] = ComponentSlot(
        ComponentName.REMOTE_LOG_METADATA_MANAGER, _slow_factory(release), {}
    )
    slot.when_ready(lambda r: r.calls.append("leaders"))
    slot.when_ready(lambda r: r.calls.append("stop"))

    release.set()

    assert slot.get(5).calls == ["leaders", "stop"]


def test_a_read_before_creation_is_retriable_not_ready() -> None:
    release = threading.Event()
    slot: ComponentSlot[_Recorder] = ComponentSlot(
        ComponentName.REMOTE_LOG_METADATA_MANAGER, _slow_factory(release), {}
    )
    try:
        with pytest.raises(RemoteStorageNotReadyError):
            slot.get(0.05)
    finally:
        release.set()


def test_a_failed_creation_reports_its_cause_to_callers() -> None:
    def failing(config: Mapping[str, Any]) -> _Recorder:
        raise ValueError("metadata topic has 3 partitions, config says 50")

    slot: ComponentSlot[_Recorder] = ComponentSlot(ComponentName.REMOTE_LOG_METADATA_MANAGER, failing, {})

    with pytest.raises(NotConfiguredError, match="3 partitions"):
        slot.get(5)
