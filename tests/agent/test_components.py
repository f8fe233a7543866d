"""A component is created in the background (the rlmm may wait for the very broker configuring it): calls
that only inform it are queued until it exists, and reads wait for it within their deadline."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rlmm.errors import RemoteStorageNotReadyError
from rlmm.view import MetadataView
from tierlog.agent.components import ComponentName, Components, ComponentSlot, NotConfiguredError


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


class _TogetherComponents(Components):
    """Components whose Configure calls pass config translation together, as the broker's threads that all
    found a restarted agent unconfigured do."""

    def __init__(self, callers: int, state_dir: Path) -> None:
        super().__init__({ComponentName.REMOTE_LOG_METADATA_MANAGER: lambda config: MetadataView.open(state_dir)})
        self._together = threading.Barrier(callers)

    def translate(self, name: ComponentName, config: Mapping[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        self._together.wait(10)
        return dict(config)


def _configure_together(components: Components, callers: int, config: dict[str, str]) -> list[BaseException]:
    """What `callers` threads configuring the rlmm at once got wrong."""
    failures: list[BaseException] = []

    def configure() -> None:
        try:
            components.configure(ComponentName.REMOTE_LOG_METADATA_MANAGER, config)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=configure) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return failures


def test_configure_calls_arriving_together_create_the_component_once(tmp_path: Path) -> None:
    # The rlmm's RocksDB view takes one opener: a second rlmm created beside the first failed for good. Racing
    # callers interleave differently each time, so several rounds.
    callers = 4
    for round_ in range(5):
        state_dir = tmp_path / str(round_)
        components = _TogetherComponents(callers, state_dir)
        try:
            assert _configure_together(components, callers, {"state.dir": str(state_dir)}) == [], f"round {round_}"
            assert components.get(ComponentName.REMOTE_LOG_METADATA_MANAGER, 5) is not None
        finally:
            components.close_all()
