"""The base install (no `[spark]` extra): `verify bucket`, `reconcile` and `usage` run small inputs in this
process without pyspark, and a job that needs Spark says which extra to install, in one line, exit 3.

Each command runs in a subprocess whose `pyspark` is a package that fails to import as a missing one does
(first on PYTHONPATH); real Kafka holds the metadata topic, the bucket is a directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_testkit import MetadataTopic, Run

from tierlog.pipeline.generate import fold

Tierlog = Callable[..., Run]
SPARK_MISSING = "this needs Spark, which is not installed: pip install 'tierlog[spark]'"


@pytest.fixture(scope="module")
def without_pyspark(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment in which `import pyspark` fails as it does where the extra is not installed."""
    stub = tmp_path_factory.mktemp("no-spark")
    (stub / "pyspark").mkdir()
    (stub / "pyspark" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyspark'\", name='pyspark')\n")
    path = os.pathsep.join(p for p in (str(stub), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture(scope="module")
def archive(metadata_topic: MetadataTopic, tierlog: Tierlog, tmp_path_factory: pytest.TempPathFactory,
            without_pyspark: dict[str, str]) -> str:
    location = str(tmp_path_factory.mktemp("archive") / "archive")
    run = tierlog("archive", "--once", "--archive", location, *metadata_topic.options(), env=without_pyspark)
    assert run.returncode == 0, run.stderr
    return location


@pytest.fixture(scope="module")
def node(metadata_topic: MetadataTopic, tierlog: Tierlog, tmp_path_factory: pytest.TempPathFactory,
         without_pyspark: dict[str, str]) -> Path:
    state_dir = tmp_path_factory.mktemp("node")
    run = tierlog("rebuild", "--state-dir", str(state_dir), *metadata_topic.options(), env=without_pyspark)
    assert run.returncode == 0, run.stderr
    return state_dir


def _finished_segments(metadata_topic: MetadataTopic) -> int:
    final = fold(metadata_topic.records)
    return sum(1 for tp in final.user_partitions() for md in final.segments_of(tp)
               if md.state.name == "COPY_SEGMENT_FINISHED")


def _no_spark_traceback(run: Run) -> None:
    assert "Traceback" not in run.stderr and "pyspark" not in run.stderr, run.stderr


def test_usage_runs_in_process_without_pyspark(
    metadata_topic: MetadataTopic, archive: str, tierlog: Tierlog, tmp_path: Path, without_pyspark: dict[str, str]
) -> None:
    run = tierlog("usage", "--archive", archive, "--out", str(tmp_path), "--json", *metadata_topic.options(),
                  env=without_pyspark)
    assert run.returncode == 0, run.stderr
    _no_spark_traceback(run)
    assert (tmp_path / "usage.csv").is_file()


def test_reconcile_runs_in_process_without_pyspark(
    metadata_topic: MetadataTopic, tierlog: Tierlog, tmp_path: Path, without_pyspark: dict[str, str]
) -> None:
    # The generated history's segments have no objects in this empty bucket: every one is reported missing.
    run = tierlog("reconcile", "--bucket", str(tmp_path), "--json", *metadata_topic.options(), env=without_pyspark)
    assert run.returncode == 1, run.stderr
    _no_spark_traceback(run)
    report: Any = run.json()
    assert report["missing_count"] == 2 * _finished_segments(metadata_topic)


def test_verify_bucket_runs_in_process_without_pyspark(
    metadata_topic: MetadataTopic, node: Path, tierlog: Tierlog, tmp_path: Path, without_pyspark: dict[str, str]
) -> None:
    run = tierlog("verify", "bucket", "--state-dir", str(node), "--bucket", str(tmp_path), "--json",
                  *metadata_topic.options(), env=without_pyspark)
    assert run.returncode == 1, run.stderr
    _no_spark_traceback(run)
    (check,) = run.json()["checks"]  # type: ignore[index]
    assert check["report"]["missing_count"] == 2 * _finished_segments(metadata_topic)


@pytest.mark.parametrize("command", [
    ["usage", "--spark", "--out", "OUT"],
    ["reconcile", "--spark", "--bucket", "OUT"],
    ["verify", "bucket", "--spark", "--bucket", "OUT"],
], ids=["usage", "reconcile", "verify-bucket"])
def test_a_job_forced_onto_spark_names_the_extra_in_one_line_and_exits_3(
    command: list[str], metadata_topic: MetadataTopic, archive: str, node: Path, tierlog: Tierlog, tmp_path: Path,
    without_pyspark: dict[str, str],
) -> None:
    args = [str(tmp_path) if a == "OUT" else a for a in command]
    where = {"usage": ["--archive", archive], "reconcile": [], "verify": ["--state-dir", str(node)]}[command[0]]
    run = tierlog(*args, *where, *metadata_topic.options(), env=without_pyspark)
    assert run.returncode == 3
    assert run.stderr.splitlines() == [f"tierlog {command[0]}: {SPARK_MISSING}"]
