"""How `tierlog` reads its configuration: properties files (a broker's server.properties too), -o overrides,
and the services environment (only in development), and how `tierlog config --explain` reports them.

No services needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tierlog.cli import main
from tierlog.cli.common import EXIT_USAGE, CommandError, Settings, read_properties


def test_a_properties_file_gives_keys_and_values_and_skips_comments(tmp_path: Path) -> None:
    path = tmp_path / "tierlog.properties"
    path.write_text("# a comment\n! another\nbootstrap.servers = 127.0.0.1:9092\n\nstate.dir=/var/tierlog\n")
    assert read_properties(path) == {"bootstrap.servers": "127.0.0.1:9092", "state.dir": "/var/tierlog"}


def test_java_properties_syntax_is_read_as_kafka_reads_it(tmp_path: Path) -> None:
    # key:value, a key with whitespace separator, \ continuations, escapes and \uXXXX: what a broker accepts.
    path = tmp_path / "server.properties"
    path.write_text(
        "bootstrap.servers: 10.0.0.1:9092,\\\n    10.0.0.2:9092\n"
        "s3.bucket tiered\\u002dsegments\n"
        "s3.prefix=a\\=b\n"
        "state.dir\n"
    )
    assert read_properties(path) == {
        "bootstrap.servers": "10.0.0.1:9092,10.0.0.2:9092",
        "s3.bucket": "tiered-segments",
        "s3.prefix": "a=b",
        "state.dir": "",
    }


def test_a_missing_config_file_exits_2_naming_it(tmp_path: Path) -> None:
    with pytest.raises(CommandError) as raised:
        read_properties(tmp_path / "nope.properties")
    assert raised.value.exit_code == EXIT_USAGE
    assert "nope.properties" in str(raised.value)


def test_broker_style_prefixed_keys_are_found_by_their_plain_name() -> None:
    settings = Settings({"rlmm.bootstrap.servers": "b:1", "rsm.s3.bucket": "segments", "rsm.s3.prefix": "p/"})
    assert settings.bootstrap() == "b:1"
    assert settings.bucket_location(None) == "s3://segments/p"


def test_an_option_without_equals_exits_2_and_says_what_it_expects(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["segments", "--state-dir", "/nowhere", "-o", "state.dir"]) == EXIT_USAGE
    assert "-o expects KEY=VALUE" in capsys.readouterr().err


SERVER_PROPERTIES = """\
# a KRaft broker's server.properties
process.roles=broker,controller
node.id=3
log.dirs=/var/lib/kafka/data,/var/lib/kafka/data2
remote.log.storage.system.enable=true
remote.log.metadata.manager.impl.prefix=meta.
meta.bootstrap.servers = 10.0.0.1:9092,\\
    10.0.0.2:9092
rsm.config.s3.bucket: segments
rsm.config.s3.prefix=prod/
rsm.config.s3.secret.access.key=hunter2
"""


def test_a_brokers_server_properties_gives_the_cli_its_settings(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(SERVER_PROPERTIES)
    settings = Settings(read_properties(path), config_file=path)
    assert settings.bootstrap() == "10.0.0.1:9092,10.0.0.2:9092"
    assert settings.bucket_location(None) == "s3://segments/prod"
    # The agent's default: beside the broker's first log dir, named by node id.
    assert settings.state_dir(None) == Path("/var/lib/kafka/tierlog-rlmm-state-3")
    node = settings.node_config(tmp_path / "state")
    assert "process.roles" not in node and "log.dirs" not in node and "s3.bucket" not in node
    assert node["bootstrap.servers"] == "10.0.0.1:9092,10.0.0.2:9092"


def test_an_override_beats_the_files_prefixed_key() -> None:
    settings = Settings({"rlmm.config.bootstrap.servers": "file:1"}, {"bootstrap.servers": "cli:2"})
    assert settings.bootstrap() == "cli:2"


def test_the_cli_reaches_a_secured_cluster_with_the_nodes_translated_security_settings() -> None:
    settings = Settings({
        "rlmm.config.bootstrap.servers": "b:9093",
        "rlmm.config.kafka.security.protocol": "SASL_SSL",
        "rlmm.config.kafka.sasl.mechanism": "SCRAM-SHA-512",
        "rlmm.config.kafka.sasl.jaas.config":
            'org.apache.kafka.common.security.scram.ScramLoginModule required username="ops" password="s3cret";',
    })
    client = settings.kafka_client(**{"group.id": "g"})
    assert client["security.protocol"] == "SASL_SSL"
    assert (client["sasl.mechanism"], client["sasl.username"], client["sasl.password"]) == (
        "SCRAM-SHA-512", "ops", "s3cret")
    assert "sasl.jaas.config" not in client and client["group.id"] == "g"


def test_a_java_keystore_the_cli_cannot_use_is_a_usage_error_naming_the_key() -> None:
    settings = Settings({"bootstrap.servers": "b:9093", "rlmm.config.kafka.ssl.truststore.type": "JKS",
                         "rlmm.config.kafka.ssl.truststore.location": "/etc/kafka/trust.jks"})
    with pytest.raises(CommandError, match="truststore") as failure:
        settings.kafka_client()
    assert failure.value.exit_code == EXIT_USAGE


def test_config_explain_names_the_file_and_key_of_each_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIERLOG_DEV", raising=False)
    path = tmp_path / "server.properties"
    path.write_text(SERVER_PROPERTIES)
    assert main(["config", "--explain", "--config", str(path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert lines["bootstrap.servers"].endswith(f"{path}: meta.bootstrap.servers")
    assert lines["bucket"].endswith(f"{path}: rsm.config.s3.bucket")
    assert "hunter2" not in lines["s3.secret.access.key"] and "(set)" in lines["s3.secret.access.key"]
    assert "log.dirs and node.id" in lines["state.dir"]


def test_outside_development_neither_services_env_nor_variables_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".dev").mkdir()
    (tmp_path / ".dev" / "services.env").write_text("KAFKA_BOOTSTRAP=10.9.9.9:9\nS3_BUCKET=devbucket\n")
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith(("KAFKA_", "S3_", "TIERLOG_DEV"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("S3_ENDPOINT", "http://10.8.8.8:9")
    assert main(["config", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "10.9.9.9" not in out and "devbucket" not in out and "10.8.8.8" not in out
    assert main(["config", "--explain", "--dev"]) == 0
    out = capsys.readouterr().out
    assert "10.9.9.9:9" in out and "services.env: KAFKA_BOOTSTRAP" in out
    assert "10.8.8.8:9" in out and "environment: S3_ENDPOINT" in out


def test_without_rlmm_bootstrap_the_broker_listener_named_for_the_rlmm_is_used(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(
        "listeners=PLAINTEXT://:9092,CONTROLLER://:9093,INTERNAL://10.1.2.3:9094\n"
        "advertised.listeners=PLAINTEXT://kafka-1.example:9092\n"
        "remote.log.metadata.manager.listener.name=PLAINTEXT\n"
    )
    settings = Settings(read_properties(path), config_file=path)
    found = settings.bootstrap_setting()
    assert found.value == "kafka-1.example:9092"
    assert found.source == f"{path}: advertised.listeners (the PLAINTEXT listener of " \
                           "remote.log.metadata.manager.listener.name)"
    path.write_text("listeners=PLAINTEXT://:9092,INTERNAL://10.1.2.3:9094\n"
                    "remote.log.metadata.manager.listener.name=INTERNAL\n")
    assert Settings(read_properties(path), config_file=path).bootstrap() == "10.1.2.3:9094"
