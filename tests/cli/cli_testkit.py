"""Helpers shared by the CLI tests: a finished `tierlog` run and the metadata topic the tests share.

Kept out of conftest.py so test modules import them by a name no other test package uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipeline.generate import RawRecord


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
