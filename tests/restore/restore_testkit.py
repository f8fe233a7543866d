"""What the restore tests share: the shared Kafka and a bucket of the test's own as `tierlog restore` sees them, and
the command run in this process with the settings a broker's config would give it."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from rlmm_testkit import drive, register, workload

from dev.process import wait_until
from rlmm import RemoteLogMetadataManager, TopicIdPartition
from rsm.backend import StorageBackend
from tierlog.audit.archiver import Archiver, ArchiverSettings
from tierlog.cli.main import main
from tierlog.pipeline.locations import open_store
from tierlog.pipeline.session import S3Settings

METADATA_PARTITIONS = 2


@dataclass(frozen=True)
class RestoreRun:
    exit_code: int
    report: dict[str, Any]
    stderr: str


@dataclass(frozen=True)
class Cluster:
    """The shared Kafka and a bucket of this test's own, as `tierlog restore` and the managers see them."""

    bootstrap: str
    metadata_topic: str
    bucket: str
    s3: S3Settings
    capsys: pytest.CaptureFixture[str]

    def store(self) -> StorageBackend:
        return open_store(f"s3://{self.bucket}", self.s3)

    def options(self, **extra: str) -> list[str]:
        """The `-o` options of a broker's config: the metadata topic (RF 1 here), the bucket, snapshots."""
        settings = {
            "bootstrap.servers": self.bootstrap,
            "metadata.topic.name": self.metadata_topic,
            "metadata.topic.num.partitions": str(METADATA_PARTITIONS),
            "metadata.topic.replication.factor": "1",
            "metadata.topic.min.insync.replicas": "1",
            "metadata.topic.min.compaction.lag.ms": "0",
            "broker.id": "7",
            "s3.bucket": self.bucket,
            "s3.endpoint.url": self.s3.endpoint or "",
            "s3.access.key.id": self.s3.access_key or "",
            "s3.secret.access.key": self.s3.secret_key or "",
            "snapshot.location": "snapshots",
            **extra,
        }
        return [arg for key, value in settings.items() for arg in ("-o", f"{key}={value}")]

    def restore(self, *flags: str, **extra: str) -> RestoreRun:
        """Run `tierlog restore --json` in this process; its exit code, report and progress lines."""
        self.capsys.readouterr()
        code = main(["restore", "--json", "--timeout", "20", "--wait", "60", *self.options(**extra), *flags])
        out, err = self.capsys.readouterr()
        return RestoreRun(code, json.loads(out) if out.strip() else {}, err)

    def delete_metadata_topic(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.delete_topics([self.metadata_topic], operation_timeout=20)[self.metadata_topic].result(30)
        wait_until(lambda: self.metadata_topic not in admin.list_topics(timeout=10).topics, timeout=30,
                   description=f"topic {self.metadata_topic} deleted")
        time.sleep(0.5)  # the broker forgets the deleted partitions' logs asynchronously

    def topic_exists(self) -> bool:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return self.metadata_topic in admin.list_topics(timeout=10).topics


def archive(cluster: Cluster) -> None:
    """Archive every record of the cluster's metadata topic into its bucket, as the agents do."""
    Archiver(cluster.store(), ArchiverSettings(cluster.bootstrap, cluster.metadata_topic)).run_until_caught_up(60)


def write_history(writer: RemoteLogMetadataManager, tps: list[TopicIdPartition], seed: int,
                  delete_last: bool = False) -> None:
    """A broker's writes on `tps` through the manager: uploads over leader epochs, re-uploads, retention, and with
    `delete_last` the last partition's deletion."""
    register(writer, *tps)
    drive(writer, {tp: workload(random.Random(seed + i), tp, uploads=6,
                                delete_partition=delete_last and i == len(tps) - 1) for i, tp in enumerate(tps)})
    writer.wait_caught_up(30)


