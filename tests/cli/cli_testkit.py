"""Helpers shared by the CLI tests: a finished `tierlog` run and the metadata topic the tests share.

Kept out of conftest.py so test modules import them by a name no other test package uses.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.generate import RawRecord

# `python -m agent.cli` is what the `tierlog` console script runs, without depending on PATH.
TIERLOG = [sys.executable, "-m", "agent.cli"]
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
