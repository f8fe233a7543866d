"""Helpers shared by the CLI tests: a finished `tierlog` run and the metadata topic the tests share.

Kept out of conftest.py so test modules import them by a name no other test package uses.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rlmm.archive import read_archive_file
from rsm.backend import StorageBackend, read_all
from tierlog.audit.archiver import list_archive_files
from tierlog.pipeline.generate import RawRecord

# `python -m tierlog.cli` is what the `tierlog` console script runs, without depending on PATH.
TIERLOG = [sys.executable, "-m", "tierlog.cli"]
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> object:
        return json.loads(self.stdout)


@dataclass(frozen=True)
class MetadataTopic:
    name: str
    bootstrap: str
    records: list[RawRecord]

    def options(self) -> list[str]:
        return ["-o", f"bootstrap.servers={self.bootstrap}", "-o", f"metadata.topic.name={self.name}"]


def archived_offsets(store: StorageBackend, topic: str) -> tuple[Counter[tuple[int, int]], int]:
    """(metadata partition, offset) -> how often the archive holds it, and the number of archive files.

    Also checks that each file holds exactly the offset range its name gives.
    """
    held: Counter[tuple[int, int]] = Counter()
    files = list_archive_files(store, topic)
    for f in files:
        datums = list(read_archive_file(read_all(store.get_range(f.key, 0))))
        assert (datums[0]["offset"], datums[-1]["offset"]) == (f.first_offset, f.last_offset), f.key
        held.update((d["metadata_partition"], d["offset"]) for d in datums)
    return held, len(files)
