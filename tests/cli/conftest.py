"""Fixtures of the CLI tests: a metadata topic holding a generated history, and ways to run `tierlog`.

Commands that start Spark run in-process on the session's shared local[2] SparkSession; the rest run
`python -m tierlog.cli` (the console script's module) in a subprocess, as a person would.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_testkit import REPO_ROOT, TIERLOG, MetadataTopic, Run
from support.topics import create_topic, unique_topic_name

from tierlog.pipeline.generate import HistoryGenerator, HistorySpec, produce_history

# The CLI reads the dev services' KAFKA_BOOTSTRAP / S3_* only in development; these tests are development.
os.environ.setdefault("TIERLOG_DEV", "1")


@pytest.fixture(scope="module")
def metadata_topic(kafka_bootstrap: str) -> MetadataTopic:
    spec = HistorySpec(events=3_000, topics=2, partitions_per_topic=2, metadata_partitions=3, seed=17)
    records = list(HistoryGenerator(spec).records())
    name = create_topic(kafka_bootstrap, unique_topic_name("cli-meta"), partitions=3,
                        config={"cleanup.policy": "compact"})
    produce_history(kafka_bootstrap, name, records)
    return MetadataTopic(name, kafka_bootstrap, records)


@pytest.fixture(scope="session")
def tierlog(services: object) -> Callable[..., Run]:
    """Run the tierlog command in a subprocess; `cwd` and `env` replace the defaults when given."""

    def run(
        *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
    ) -> Run:
        completed = subprocess.run(
            [*TIERLOG, *args], capture_output=True, text=True, timeout=timeout,
            cwd=cwd or REPO_ROOT, env=env if env is not None else dict(os.environ),
        )
        return Run(completed.returncode, completed.stdout, completed.stderr)

    return run
