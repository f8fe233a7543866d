"""`tierlog agent --config server.properties` and `tierlog config --explain` read a broker's file through one
mapping (tierlog/agent/broker_config.py): the agent's rlmm and rsm get what the broker would hand its plugins,
and a real broker's file starts an agent that becomes ready against the dev Kafka and S3."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import grpc
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from prometheus_client.parser import text_string_to_metric_families
from support.agent_segments import segment_metadata

from rlmm import TopicIdPartition
from rlmm.config import parse_config
from rlmm.manager import CONFIG_KEYS as RLMM_KEYS
from rsm.backends import available_backends
from rsm.manager import CORE_CONFIG_KEYS as RSM_CORE_KEYS
from tierlog.agent import messages
from tierlog.agent import server as agent_server
from tierlog.agent.broker_config import plugin_configs, rlmm_config, rsm_config
from tierlog.agent.components import Components
from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc
from tierlog.cli import main

READY_S = 60.0


def server_properties(
    directory: Path, bootstrap: str, s3: dict[str, str], bucket: str, topic: str, extra: str = ""
) -> Path:
    """A KRaft broker's server.properties with tierlog's plugins, as docs/operations.md describes it."""
    host, _, port = bootstrap.rpartition(":")
    path = directory / "server.properties"
    path.write_text(f"""\
process.roles=broker,controller
node.id=0
controller.quorum.voters=0@127.0.0.1:1
listeners=PLAINTEXT://{host}:{port},CONTROLLER://127.0.0.1:1
log.dirs={directory / "kafka-logs"}
remote.log.storage.system.enable=true
remote.log.metadata.manager.class.name=dev.tierlog.kafka.TierlogRemoteLogMetadataManager
remote.log.storage.manager.class.name=dev.tierlog.kafka.TierlogRemoteStorageManager
remote.log.metadata.manager.listener.name=PLAINTEXT
rlmm.config.metadata.topic.name={topic}
rlmm.config.metadata.topic.num.partitions=2
rlmm.config.metadata.topic.replication.factor=1
rsm.config.storage.backend=s3
rsm.config.s3.bucket={bucket}
rsm.config.s3.endpoint.url={s3["endpoint"]}
rsm.config.s3.region={s3["region"]}
rsm.config.s3.access.key.id={s3["access_key"]}
rsm.config.s3.secret.access.key={s3["secret_key"]}
rsm.config.log.dirs={directory / "kafka-logs"}
{extra}""")
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def readiness(port: int) -> dict[str, float]:
    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {s.labels["component"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "tierlog_agent_component_ready"}


def test_the_agent_and_config_explain_give_the_components_the_same_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s3 = {"endpoint": "http://127.0.0.1:1", "region": "eu-west-1", "access_key": "AK", "secret_key": "SK"}
    path = server_properties(tmp_path, "10.0.0.7:9092", s3, "segments", "__meta",
                             "rlmm.config.agent.socket.path=/run/tierlog/agent.sock\n"
                             "rsm.config.agent.socket.path=/run/tierlog/agent.sock\n"
                             "rlmm.config.agent.metrics.port=9464\nrsm.config.agent.metrics.port=9464\n")
    served: dict[str, Any] = {}
    monkeypatch.setattr(agent_server, "serve", lambda config, socket_path, port, **kw: served.update(
        config=config, socket=socket_path, port=port, **kw))
    assert main(["agent", "--config", str(path)]) == 0
    assert main(["config", "--explain", "--json", "--config", str(path)]) == 0
    explained = {e["setting"]: e for e in json.loads(capsys.readouterr().out)["agent"]}

    created = {
        f"{name.short}.{key}": value
        for name, config in agent_server.split_config(served["config"]).items()
        for key, value in Components.translate(name, config).items()
    }
    shown = {k: ("(set)" if k == "rsm.s3.secret.access.key" else v) for k, v in created.items()}
    assert {k: e["value"] for k, e in explained.items()} == shown
    assert created["rlmm.bootstrap.servers"] == "10.0.0.7:9092"
    assert created["rlmm.broker.id"] == "0"
    assert created["rlmm.state.dir"] == str(tmp_path.resolve() / "tierlog-rlmm-state-0")
    assert created["rsm.s3.bucket"] == "segments"
    assert explained["rlmm.bootstrap.servers"]["source"].endswith(
        "listeners (the PLAINTEXT listener of remote.log.metadata.manager.listener.name)")
    assert explained["rsm.s3.bucket"]["source"] == f"{path}: rsm.config.s3.bucket"
    # The adapter's own keys place the socket and the metrics port, as for the broker-started agent.
    assert (served["socket"], served["port"]) == ("/run/tierlog/agent.sock", 9464)
    assert not [k for k in created if ".agent." in k]


def test_short_agent_prefixes_in_a_tierlog_file_still_configure_the_agent() -> None:
    plugins = plugin_configs({"rlmm.bootstrap.servers": "k:1", "rlmm.broker.id": "4", "rlmm.state.dir": "/s"})

    assert plugins.agent_config() == {"rlmm.bootstrap.servers": "k:1", "rlmm.broker.id": "4", "rlmm.state.dir": "/s"}
    assert plugins.rsm is None


def test_a_listener_with_a_mapped_protocol_gives_the_rlmm_its_security_protocol() -> None:
    plugins = plugin_configs({
        "listeners": "INTERNAL://:9094", "listener.security.protocol.map": "INTERNAL:SASL_SSL,CONTROLLER:PLAINTEXT",
        "remote.log.metadata.manager.listener.name": "INTERNAL", "node.id": "2", "log.dirs": "/d",
        "rlmm.config.remote.log.metadata.common.client.sasl.mechanism": "SCRAM-SHA-512",
    })

    assert plugins.rlmm is not None
    assert plugins.rlmm["remote.log.metadata.common.client.bootstrap.servers"] == "localhost:9094"
    assert plugins.rlmm["remote.log.metadata.common.client.security.protocol"] == "SASL_SSL"
    assert plugins.rlmm["remote.log.metadata.common.client.sasl.mechanism"] == "SCRAM-SHA-512"


def test_a_brokers_server_properties_starts_an_agent_that_becomes_ready_and_writes(
    tmp_path: Path, short_dir: Path, kafka_bootstrap: str, s3_config: dict[str, str], s3_bucket: str,
    unique_topic: str,
) -> None:
    topic = f"__tierlog_metadata_{unique_topic}"
    port = free_port()
    sock = short_dir / "agent.sock"
    (tmp_path / "kafka-logs").mkdir()
    # No metadata.topic.min.insync.replicas: with replication factor 1 the topic must accept writes.
    path = server_properties(tmp_path, kafka_bootstrap, s3_config, s3_bucket, topic,
                             f"rlmm.config.agent.socket.path={sock}\nrsm.config.agent.socket.path={sock}\n"
                             f"rlmm.config.agent.metrics.port={port}\nrsm.config.agent.metrics.port={port}\n")
    agent = subprocess.Popen([sys.executable, "-m", "tierlog.cli", "agent", "--config", str(path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + READY_S
        while True:
            assert agent.poll() is None, f"the agent exited: {agent.communicate()[1][-3000:]}"
            try:
                if readiness(port) == {"rlmm": 1.0, "rsm": 1.0}:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the agent's rlmm and rsm never became ready"
            time.sleep(0.2)
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            metadata = pb_grpc.RemoteLogMetadataStub(channel)
            segment = segment_metadata(TopicIdPartition(uuid.uuid4(), "orders", 0), 100)
            metadata.AddRemoteLogSegmentMetadata(messages.segment_metadata_msg(segment), timeout=30)
            # Led here, the partition's listing in one answer is the stream's.
            tp = messages.topic_id_partition_msg(segment.topic_id_partition)
            metadata.OnPartitionLeadershipChanges(pb.LeadershipChanges(leaders=[tp]), timeout=30)
            while not metadata.IsReady(tp, timeout=30).ready:
                assert time.monotonic() < deadline + READY_S, "the partition never became ready"
                time.sleep(0.05)
            query = pb.ListQuery(topic_id_partition=tp)
            at_once = metadata.ListRemoteLogSegmentsAtOnce(query, timeout=30)
            assert not at_once.stream_instead
            assert [messages.segment_metadata(m) for m in at_once.segments] == [
                messages.segment_metadata(m) for m in metadata.ListRemoteLogSegments(query, timeout=30)
            ] == [segment]
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        assert admin.describe_configs([resource])[resource].result(30)["min.insync.replicas"].value == "1"
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.communicate(timeout=30)


def test_an_rlmm_without_bootstrap_or_listener_is_explained_as_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "server.properties"
    path.write_text("node.id=1\nlog.dirs=/d\n"
                    "remote.log.metadata.manager.class.name=dev.tierlog.kafka.TierlogRemoteLogMetadataManager\n")
    assert main(["config", "--explain", "--json", "--config", str(path)]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["agent"]
    assert entry["setting"] == "rlmm" and "bootstrap.servers is not set" in entry["source"]


def test_the_documented_server_properties_sample_is_accepted_as_it_stands() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    sample = docs.split("```properties\n", 1)[1].split("```", 1)[0]
    # The rest of a broker's file: its listeners, node id and log dirs.
    properties = dict(
        line.strip().split("=", 1) for line in sample.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )
    properties.update({"listeners": "INTERNAL://:9094", "node.id": "1", "log.dirs": "/var/lib/kafka/data"})

    plugins = plugin_configs(properties)
    assert plugins.rlmm is not None and plugins.rsm is not None
    rlmm = parse_config(rlmm_config(plugins.rlmm), RLMM_KEYS, "rlmm", ignore_prefixes=("kafka.",))
    rsm = rsm_config(plugins.rsm)
    parse_config(rsm, RSM_CORE_KEYS + available_backends()[rsm["storage.backend"]].CONFIG_KEYS, "rsm")

    assert rlmm["state.dir"] == "/var/lib/kafka/tierlog-state"
    assert rlmm["metadata.topic.min.insync.replicas"] <= rlmm["metadata.topic.replication.factor"]
    assert plugins.adapter["agent.metrics.port"] == "9464" and plugins.adapter["agent.metrics.address"]
