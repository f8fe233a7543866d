"""Keeps docker/ honest without Docker: every key its broker configuration passes to tierlog is one the
plugin, the rlmm and the rsm accept, and the compose file, Dockerfile and pins agree with each other."""

from __future__ import annotations

import re
from pathlib import Path

from rlmm.config import parse_config
from rlmm.manager import CONFIG_KEYS as RLMM_KEYS
from rsm.backends import available_backends
from rsm.manager import CORE_CONFIG_KEYS as RSM_CORE_KEYS
from tierlog.agent.broker_config import rlmm_config, rsm_config

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
AGENT_SETTINGS = REPO / "jvm" / "src" / "main" / "java" / "dev" / "tierlog" / "kafka" / "AgentSettings.java"


def _properties() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (DOCKER / "server.properties").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def _plugin_config(prefix: str) -> dict[str, str]:
    return {k[len(prefix) :]: v for k, v in _properties().items() if k.startswith(prefix)}


def _without_adapter_keys(config: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in config.items() if not k.startswith("agent.")}


def _adapter_keys() -> set[str]:
    return set(
        re.findall(r'public static final String \w+ = "(agent\.[a-z.]+)";', AGENT_SETTINGS.read_text())
    )


def _compose_setting(name: str) -> str:
    """A `NAME: value` setting of docker/compose.yaml (read as text: no YAML parser in the dependencies)."""
    found = re.search(
        rf"^\s*{re.escape(name)}:\s*(\S+)\s*$", (DOCKER / "compose.yaml").read_text(), re.MULTILINE
    )
    assert found is not None, f"compose.yaml sets no {name}"
    return found.group(1)


def test_adapter_keys_in_the_broker_config_are_declared_by_the_plugin() -> None:
    used = {
        k
        for prefix in ("rlmm.config.", "rsm.config.")
        for k in _plugin_config(prefix)
        if k.startswith("agent.")
    }
    assert used
    assert used <= _adapter_keys()


def test_both_plugins_start_and_reach_the_agent_the_same_way() -> None:
    def adapter(prefix: str) -> dict[str, str]:
        return {k: v for k, v in _plugin_config(prefix).items() if k.startswith("agent.")}

    assert adapter("rlmm.config.") == adapter("rsm.config.")


def test_rlmm_accepts_the_broker_config_with_what_kafka_adds() -> None:
    # What Kafka 4.x's RemoteLogManager adds to the RLMM's map, with the listener named in server.properties.
    added = {
        "broker.id": "1",
        "node.id": "1",
        "log.dir": "/var/lib/kafka/data",
        "cluster.id": "x",
        "remote.log.metadata.common.client.bootstrap.servers": "localhost:9092",
        "remote.log.metadata.common.client.security.protocol": "PLAINTEXT",
    }
    config = rlmm_config({**_without_adapter_keys(_plugin_config("rlmm.config.")), **added})

    parsed = parse_config(config, RLMM_KEYS, "rlmm", ignore_prefixes=("kafka.",))

    assert parsed["state.dir"] == "/var/lib/kafka/tierlog-rlmm-state-1"


def test_rsm_accepts_the_broker_config_with_what_kafka_adds() -> None:
    config = rsm_config(
        {**_without_adapter_keys(_plugin_config("rsm.config.")), "broker.id": "1", "node.id": "1"}
    )
    backend = available_backends()[config["storage.backend"]]

    parse_config(config, RSM_CORE_KEYS + backend.CONFIG_KEYS, "rsm")


def test_plugin_classes_in_the_broker_config_exist() -> None:
    props = _properties()
    for key in ("remote.log.metadata.manager.class.name", "remote.log.storage.manager.class.name"):
        source = REPO / "jvm" / "src" / "main" / "java" / (props[key].replace(".", "/") + ".java")
        assert source.exists(), f"{key}={props[key]} has no source at {source}"


def test_plugin_jar_path_matches_what_maven_builds() -> None:
    pom = (REPO / "jvm" / "pom.xml").read_text()
    artifact = re.search(r"<artifactId>(tierlog-[^<]+)</artifactId>\s*<version>([^<]+)</version>", pom)
    assert artifact is not None
    jar = f"{artifact.group(1)}-{artifact.group(2)}.jar"
    props = _properties()
    assert Path(props["remote.log.metadata.manager.class.path"]).name == jar
    assert Path(props["remote.log.storage.manager.class.path"]).name == jar
    assert f"/src/jvm/target/{jar}" in (DOCKER / "Dockerfile").read_text()


def test_rsm_credentials_and_bucket_match_the_minio_service() -> None:
    rsm = _plugin_config("rsm.config.")
    assert _compose_setting("MINIO_ROOT_USER") == rsm["s3.access.key.id"]
    assert _compose_setting("MINIO_ROOT_PASSWORD") == rsm["s3.secret.access.key"]
    assert f"mc mb --ignore-existing local/{rsm['s3.bucket']}" in (DOCKER / "compose.yaml").read_text()
    assert rsm["s3.endpoint.url"].startswith("http://minio:")


def test_kafka_version_pins_agree() -> None:
    pinned = (REPO / "dev" / "kafka.version").read_text().strip()
    assert f"ARG KAFKA_VERSION={pinned}" in (DOCKER / "Dockerfile").read_text()
    assert f"<kafka.version>{pinned}</kafka.version>" in (REPO / "jvm" / "pom.xml").read_text()
