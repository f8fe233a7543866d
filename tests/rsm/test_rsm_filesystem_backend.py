"""What the filesystem backend adds to the contract: keys cannot leave the root, writes are atomic."""

from __future__ import annotations

from pathlib import Path

import pytest

from rsm import InvalidArgumentError
from rsm.backends.filesystem import FilesystemBackend
from rsm.metrics import Metrics


@pytest.fixture
def backend(tmp_path: Path) -> FilesystemBackend:
    return FilesystemBackend(tmp_path / "root", Metrics())


@pytest.mark.parametrize("key", ["../outside", "a/../../outside", "/etc/passwd", "a//b", "a/./b"])
def test_a_key_that_could_leave_the_root_is_refused(backend: FilesystemBackend, key: str) -> None:
    with pytest.raises(InvalidArgumentError, match="not a safe relative path"):
        backend.put(key, b"x")


def test_an_interrupted_write_leaves_neither_a_partial_object_nor_a_listed_temporary(
    backend: FilesystemBackend, tmp_path: Path
) -> None:
    backend.put("p/object", b"old")
    missing = tmp_path / "vanished-source"
    with pytest.raises(Exception, match="vanished-source"):
        backend.put("p/object", missing)
    with backend.get_range("p/object", 0) as stream:
        assert stream.read() == b"old"
    assert [p.name for p in (tmp_path / "root" / "p").iterdir()] == ["object"]


def test_deleting_the_last_object_of_a_partition_removes_its_empty_directories(
    backend: FilesystemBackend, tmp_path: Path
) -> None:
    backend.put("topic-id/0/segment.log", b"x")
    backend.delete(["topic-id/0/segment.log"])
    assert list((tmp_path / "root").iterdir()) == []
