"""The end-to-end demo (`python -m dev.demo`, `make demo`): a real Kafka broker with tierlog's plugins and
real S3 tier a topic, drop its local segments, and serve every record back from the bucket.

Its building blocks (broker properties, producing, waiting for tiering, reading back) are the e2e tests' too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
JVM_DIR = REPO_ROOT / "jvm"
PLUGIN_JAR = JVM_DIR / "target" / "tierlog-kafka-plugin-0.1.0.jar"

TIERLOG_RLMM = "dev.tierlog.kafka.TierlogRemoteLogMetadataManager"
TIERLOG_RSM = "dev.tierlog.kafka.TierlogRemoteStorageManager"
KAFKA_RLMM = "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"
KAFKA_LOCAL_RSM = "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"

SEGMENT_BYTES = 1024 * 1024  # Kafka 4.x's minimum segment.bytes


def ensure_plugin_jar() -> Path:
    """The plugin jar, built with Maven when missing or older than its sources or the protocol."""
    sources = [
        *JVM_DIR.joinpath("src", "main").rglob("*.java"),
        JVM_DIR / "pom.xml",
        *REPO_ROOT.joinpath("schemas").glob("*.proto"),
    ]
    newest = max(p.stat().st_mtime for p in sources)
    if not PLUGIN_JAR.exists() or PLUGIN_JAR.stat().st_mtime < newest:
        # Maven's output goes to stderr: the benchmarks that call this print their JSON on stdout.
        subprocess.run(
            ["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(JVM_DIR / "pom.xml"), "package", "-DskipTests"],
            check=True, stdout=sys.stderr,
        )
    return PLUGIN_JAR


@dataclass(frozen=True)
class S3Location:
    """Where the rsm writes: a bucket on an S3 endpoint, under a prefix of its own."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    prefix: str
    region: str = "us-east-1"

    def rsm_config(self) -> dict[str, str]:
        return {
            "storage.backend": "s3",
            "s3.endpoint.url": self.endpoint,
            "s3.access.key.id": self.access_key,
            "s3.secret.access.key": self.secret_key,
            "s3.bucket": self.bucket,
            "s3.prefix": self.prefix,
            "s3.region": self.region,
            "s3.path.style.access": "true",
        }

    def client(self) -> Any:
        from dev.s3 import S3Endpoint

        return S3Endpoint(self.endpoint, self.access_key, self.secret_key, self.bucket, self.region).client()

    def objects(self) -> list[dict[str, Any]]:
        """Every object under the prefix (key and size)."""
        found: list[dict[str, Any]] = []
        paginator = self.client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
            found.extend(page.get("Contents", []))
        return found


@dataclass(frozen=True)
class PluginChoice:
    """Which RLMM and RSM the broker loads: tierlog's (through the agent) or Kafka's own (drop-in tests)."""

    rlmm: str = TIERLOG_RLMM
    rsm: str = TIERLOG_RSM
    s3: S3Location | None = None
    local_tiered_storage_dir: Path | None = None
    metadata_replication_factor: int = 1
    metadata_partitions: int = 3
    metrics_port: int | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


def broker_properties(choice: PluginChoice, socket_dir: Path, jar: Path = PLUGIN_JAR) -> dict[str, str]:
    """Broker properties that enable tiered storage with the chosen plugins.

    `{node_id}` is replaced per node by dev.kafka, so each broker of a cluster gets its own agent socket.
    """
    # Identical on both plugins: whichever of them (re)starts the agent starts it the same way.
    agent = {
        "agent.socket.path": str(socket_dir / "agent-{node_id}.sock"),
        "agent.command": f"{sys.executable} -m tierlog.agent.server",
        "agent.log.file": str(socket_dir / "agent-{node_id}.log"),
    }
    if choice.metrics_port is not None:
        agent["agent.metrics.port"] = str(choice.metrics_port)
    props: dict[str, str] = {
        "remote.log.storage.system.enable": "true",
        "remote.log.manager.task.interval.ms": "500",
        "remote.log.metadata.manager.class.name": choice.rlmm,
        "remote.log.storage.manager.class.name": choice.rsm,
        # Both metadata managers find the cluster through the broker's own listener.
        "remote.log.metadata.manager.listener.name": "PLAINTEXT",
        "log.retention.check.interval.ms": "500",
        "log.initial.task.delay.ms": "500",
    }
    if choice.rlmm == TIERLOG_RLMM:
        props["remote.log.metadata.manager.class.path"] = str(jar)
        props.update({f"rlmm.config.{k}": v for k, v in agent.items()})
        props["rlmm.config.metadata.topic.replication.factor"] = str(choice.metadata_replication_factor)
        props["rlmm.config.metadata.topic.num.partitions"] = str(choice.metadata_partitions)
        props["rlmm.config.metadata.topic.min.insync.replicas"] = str(
            min(2, choice.metadata_replication_factor)
        )
    elif choice.rlmm == KAFKA_RLMM:
        props["rlmm.config.remote.log.metadata.topic.replication.factor"] = str(
            choice.metadata_replication_factor
        )
        props["rlmm.config.remote.log.metadata.topic.num.partitions"] = str(choice.metadata_partitions)
    if choice.rsm == TIERLOG_RSM:
        if choice.s3 is None:
            raise ValueError("tierlog's RSM needs an S3 location (PluginChoice.s3)")
        props["remote.log.storage.manager.class.path"] = str(jar)
        props.update({f"rsm.config.{k}": v for k, v in agent.items()})
        props.update({f"rsm.config.{k}": v for k, v in choice.s3.rsm_config().items()})
    elif choice.rsm == KAFKA_LOCAL_RSM:
        if choice.local_tiered_storage_dir is None:
            raise ValueError("LocalTieredStorage needs PluginChoice.local_tiered_storage_dir")
        props["rsm.config.dir"] = str(choice.local_tiered_storage_dir)
    props.update(choice.extra)
    return props


def tiered_topic_config(**overrides: str) -> dict[str, str]:
    """A topic that tiers every rolled 1 MiB segment and keeps (almost) nothing locally."""
    config = {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.ms": "1000",
        "retention.ms": "-1",
    }
    config.update(overrides)
    return config


def create_topic(
    bootstrap: str,
    name: str,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    config: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=dict(config or tiered_topic_config()),
    )
    admin.create_topics([topic], operation_timeout=timeout)[name].result(timeout)


def record_value(index: int, size: int = 200) -> bytes:
    """Record `index`'s value: derived from the index, so a reader checks it without keeping a copy."""
    stem = f"tierlog-record-{index:010d}|".encode()
    return (stem * (size // len(stem) + 1))[:size]


def record_key(index: int) -> bytes:
    return f"{index:010d}".encode()


def produce(
    bootstrap: str,
    topic: str,
    start: int,
    count: int,
    *,
    partition: int = 0,
    size: int = 200,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Produce records start..start+count-1 (idempotent producer, acks=all) and wait for every ack."""
    from confluent_kafka import Producer

    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "compression.type": "none",
            **(extra or {}),
        }
    )
    for i in range(start, start + count):
        while True:
            try:
                producer.produce(
                    topic,
                    key=record_key(i),
                    value=record_value(i, size),
                    partition=partition,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.1)
        if i % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    if remaining or errors:
        raise RuntimeError(f"producing to {topic}: {remaining} unacknowledged, errors: {errors[:5]}")


def local_segment_offsets(log_dir: Path, topic: str, partition: int = 0) -> list[int]:
    """Base offsets of the segments the broker still holds locally for one partition."""
    directory = log_dir / f"{topic}-{partition}"
    if not directory.exists():
        return []
    return sorted(int(p.stem) for p in directory.glob("*.log") if p.stem.isdigit())


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def remote_segment_count(s3: S3Location, topic: str) -> int:
    return sum(1 for o in s3.objects() if o["Key"].endswith(".log") and f"/{topic}-" in f"/{o['Key']}")


def wait_until_tiered(
    log_dir: Path, topic: str, *, partition: int = 0, min_local_start: int = 1, timeout: float = 90.0
) -> int:
    """Wait until the broker deleted local segments up to at least `min_local_start` (only possible once
    they are in remote storage); return the first offset still held locally. A timeout says where the local log
    started at first and at last, which tells tiering that stopped from tiering that was slow."""
    starts: list[int] = []

    def local_start() -> int | None:
        offsets = local_segment_offsets(log_dir, topic, partition)
        if offsets:
            starts.append(offsets[0])
        return offsets[0] if offsets and offsets[0] >= min_local_start else None

    try:
        return int(
            wait_for(
                local_start,
                timeout,
                f"{topic}-{partition} local segments below offset {min_local_start} to be tiered and deleted",
            )
        )
    except TimeoutError as exc:
        seen = f"at {starts[0]} when the wait began, at {starts[-1]} at its end" if starts else "nowhere (none)"
        raise TimeoutError(f"{exc}; the first local segment started {seen}") from None


@dataclass(frozen=True)
class ReadBack:
    """What a reader got: records by offset, plus anything wrong with them."""

    offsets: list[int]
    keys: list[bytes]
    mismatched: list[int]

    @property
    def indexes(self) -> list[int]:
        return [int(k) for k in self.keys]


def consume(
    bootstrap: str,
    topic: str,
    expected: int,
    *,
    partition: int = 0,
    start_offset: int = 0,
    size: int = 200,
    isolation: str = "read_uncommitted",
    timeout: float = 120.0,
) -> ReadBack:
    """Read from `start_offset` until `expected` records arrived or `timeout` passed; check each value
    against its key."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"tierlog-reader-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "fetch.max.bytes": 4 * SEGMENT_BYTES,
        }
    )
    offsets: list[int] = []
    keys: list[bytes] = []
    mismatched: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, partition, start_offset)])
        deadline = time.monotonic() + timeout
        while len(offsets) < expected and time.monotonic() < deadline:
            for message in consumer.consume(500, 1.0):
                if message.error():
                    continue
                key = message.key() or b""
                offset = message.offset()
                if offset is None:
                    continue
                offsets.append(offset)
                keys.append(key)
                if not key.isdigit() or message.value() != record_value(int(key), size):
                    mismatched.append(offset)
    finally:
        consumer.close()
    return ReadBack(offsets, keys, mismatched)


def prometheus_samples(port: int) -> dict[str, float]:
    """The agent's metrics endpoint, as `name{labels}` -> value."""
    from urllib.request import urlopen

    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def sum_samples(samples: Mapping[str, float], prefix: str, contains: Iterable[str] = ()) -> float:
    return sum(v for k, v in samples.items() if k.startswith(prefix) and all(c in k for c in contains))


def run_demo(base_dir: Path, records: int, size: int, rlmm: str = TIERLOG_RLMM) -> dict[str, Any]:
    from dev.kafka import KafkaCluster
    from dev.process import free_ports
    from dev.s3 import SeaweedS3

    jar = ensure_plugin_jar()
    topic = "tierlog-demo"
    metrics_port = free_ports(1)[0]
    started = time.monotonic()
    with SeaweedS3(base_dir / "s3") as seaweed:
        endpoint = seaweed.endpoint
        s3 = S3Location(endpoint.endpoint, endpoint.access_key, endpoint.secret_key, endpoint.bucket, "demo")
        choice = PluginChoice(rlmm=rlmm, s3=s3, metrics_port=metrics_port)
        # Socket paths are limited to ~100 bytes: keep them out of a possibly deep base_dir.
        with (
            tempfile.TemporaryDirectory(prefix="tierlog-") as sockets,
            KafkaCluster(
                base_dir / "kafka", 1, properties=broker_properties(choice, Path(sockets), jar)
            ) as kafka,
        ):
            print(
                f"Kafka {kafka.bootstrap} and S3 {endpoint.endpoint} are up; "
                "the broker runs tierlog's plugins"
            )
            create_topic(kafka.bootstrap, topic)
            produce(kafka.bootstrap, topic, 0, records, size=size)
            print(f"produced {records} records of {size} bytes to {topic}")
            local_start = wait_until_tiered(kafka.log_dir(0), topic, min_local_start=records // 2)
            print(f"local segments below offset {local_start} were tiered to S3 and deleted locally")
            read = consume(kafka.bootstrap, topic, records, size=size)
            ok = (
                read.offsets == list(range(records))
                and read.indexes == list(range(records))
                and not read.mismatched
            )
            print(
                f"consumed {len(read.offsets)} records from offset 0: "
                f"{'every record matches what was produced' if ok else 'MISMATCH'}"
            )
            objects = s3.objects()
            samples = prometheus_samples(metrics_port)
        summary = {
            "records_produced": records,
            "records_read_back": len(read.offsets),
            "records_verified": ok,
            "first_local_offset": local_start,
            "segments_tiered": sum(1 for o in objects if o["Key"].endswith(".log")),
            "bucket_objects": len(objects),
            "bucket_bytes": sum(int(o["Size"]) for o in objects),
            "s3_requests": int(sum_samples(samples, "tierlog_rsm_events", ['counter="s3.http_attempts.'])),
            "bytes_streamed_to_broker": int(sum_samples(samples, "tierlog_agent_streamed_bytes_total")),
            "agent_calls": int(sum_samples(samples, "tierlog_agent_calls_total")),
            "seconds": round(time.monotonic() - started, 1),
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=30_000, help="records to produce (default 30000)")
    parser.add_argument("--size", type=int, default=200, help="bytes per record value (default 200)")
    parser.add_argument("--dir", type=Path, default=None, help="working directory (default: a temporary one)")
    parser.add_argument(
        "--metadata-manager",
        choices=("tierlog", "kafka"),
        default="tierlog",
        help="kafka: Kafka's built-in TopicBasedRemoteLogMetadataManager with tierlog's RSM",
    )
    args = parser.parse_args(argv)
    rlmm = TIERLOG_RLMM if args.metadata_manager == "tierlog" else KAFKA_RLMM
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        summary = run_demo(args.dir.resolve(), args.records, args.size, rlmm)
    else:
        with tempfile.TemporaryDirectory(prefix="tierlog-demo-") as tmp:
            summary = run_demo(Path(tmp), args.records, args.size, rlmm)
    print(json.dumps(summary, indent=2))
    print("stopped Kafka, S3 and the agent")
    return 0 if summary["records_verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
