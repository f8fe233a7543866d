"""Shared setup of the rlmm tests: puts `tests/` on sys.path so `support.*` imports.

Helpers shared by several test modules live in rlmm_testkit.py next to this file.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# tests/support is shared by test packages that are not importable packages themselves.
_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from rlmm_testkit import ManagerSubject, StateSubject, Subject, manager_config  # noqa: E402
from support.topics import unique_topic_name  # noqa: E402

from rlmm import RemoteLogMetadataManager  # noqa: E402


@pytest.fixture
def metadata_topic(request: pytest.FixtureRequest) -> str:
    """A metadata topic name no other test uses (the manager creates it)."""
    return unique_topic_name(f"rlmm-{request.node.name}")


@pytest.fixture
def make_manager(
    kafka_bootstrap: str, metadata_topic: str, tmp_path: Path
) -> Iterator[Callable[..., RemoteLogMetadataManager]]:
    """Start managers on this test's metadata topic: `make_manager(broker_id=0, state_dir=None, **config)`.

    Each gets its own state dir unless one is passed; all are closed after the test.
    """
    managers: list[RemoteLogMetadataManager] = []

    def make(broker_id: int = 0, state_dir: Path | None = None, partitions: int = 1, **extra: Any
             ) -> RemoteLogMetadataManager:
        directory = state_dir or tmp_path / f"state-{broker_id}-{len(managers)}"
        manager = RemoteLogMetadataManager(manager_config(
            kafka_bootstrap, directory, metadata_topic, partitions=partitions, broker_id=broker_id, **extra))
        managers.append(manager)
        return manager

    try:
        yield make
    finally:
        for manager in managers:
            manager.close()


@pytest.fixture(params=["state", "manager"])
def subject(request: pytest.FixtureRequest) -> Subject:
    """A scenario runs against the pure state (a writer over InMemoryState) and against the real manager."""
    if request.param == "state":
        return StateSubject()
    make: Callable[..., RemoteLogMetadataManager] = request.getfixturevalue("make_manager")
    return ManagerSubject(make())
