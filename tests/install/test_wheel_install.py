"""The product as an operator installs it: the wheel (built from this checkout, Maven's plugin jar inside) is
installed into a fresh virtualenv outside the checkout, and everything runs from there: the `tierlog` command,
`tierlog plugin-path`, a metadata command, and a real Kafka broker whose plugin class path is the installed jar
and whose agent is the one the jar finds in its own environment (no agent.command, no agent.python).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dev.demo import (
    PluginChoice,
    S3Location,
    broker_properties,
    create_topic,
    produce,
    tiered_topic_config,
    wait_until_tiered,
)
from dev.kafka import KafkaCluster
from dev.s3 import S3Endpoint

pytestmark = [pytest.mark.install, pytest.mark.services, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
STEP_TIMEOUT_S = 600.0
COMMAND_TIMEOUT_S = 120.0


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = COMMAND_TIMEOUT_S) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed() -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(venv, a working directory outside the checkout, a clean environment) with the wheel installed."""
    with tempfile.TemporaryDirectory(prefix="tl-install-") as tmp:
        base = Path(tmp)
        assert not base.resolve().is_relative_to(REPO)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "TIERLOG_"))}
        # The dev environment already holds the build requirements; building without isolation keeps it offline.
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
              "-w", str(base / "dist"), str(REPO)], base, env, STEP_TIMEOUT_S)
        (wheel,) = (base / "dist").glob("tierlog-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
        assert "tierlog/jars/tierlog-kafka-plugin.jar" in names
        assert {"rlmm/schemas/segment_record.v1.avsc", "tierlog/agent/proto/agent_pb2_grpc.py"} <= names
        # rlmm's C extensions, compiled (setup.py; a C compiler is on every machine this suite runs on).
        for extension in ("_segment_lookup", "_avro_reader", "_slots", "_digest"):
            assert any(n.startswith(f"rlmm/{extension}.") and n.endswith(".so") for n in names), sorted(names)
        # No generic top-level names (agent, pipeline) that could shadow or be shadowed in site-packages.
        dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
        assert {n.split("/")[0] for n in names} == {"rlmm", "rsm", "tierlog", dist_info}
        venv = base / "venv"
        _run([sys.executable, "-m", "venv", str(venv)], base, env)
        _run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
             base, env, STEP_TIMEOUT_S)
        work = base / "work"
        work.mkdir()
        yield venv, work, env


def test_the_installed_command_runs_outside_the_checkout(installed: tuple[Path, Path, dict[str, str]]) -> None:
    venv, work, env = installed
    tierlog = str(venv / "bin" / "tierlog")
    assert "plugin-path" in _run([tierlog, "--help"], work, env)
    jar = Path(_run([tierlog, "plugin-path"], work, env).strip())
    assert jar.is_file() and jar.resolve().is_relative_to(venv.resolve()), jar
    # Nothing of the checkout is importable from the venv's interpreter.
    where = _run([str(venv / "bin" / "python"), "-c",
                  "import rlmm, rsm, tierlog.agent.proto, rlmm._segment_lookup as c, rlmm._avro_reader as a, "
                  "rlmm._slots as s, rlmm._digest as d; "
                  "print(rlmm.__file__, rsm.__file__, tierlog.agent.proto.__file__, c.__file__, a.__file__, "
                  "s.__file__, d.__file__)"],
                 work, env)
    for path in where.split():
        assert Path(path).resolve().is_relative_to(venv.resolve()), where


def test_a_metadata_command_reads_the_dev_kafka(
    installed: tuple[Path, Path, dict[str, str]], kafka_bootstrap: str, create_topic: Callable[..., str]
) -> None:
    venv, work, env = installed
    topic = create_topic("tl-install-meta", partitions=3, config={"cleanup.policy": "compact"})
    out = _run([str(venv / "bin" / "tierlog"), "rebuild", "--json", "--state-dir", str(work / "rebuilt"),
                "-o", f"bootstrap.servers={kafka_bootstrap}", "-o", f"metadata.topic.name={topic}",
                "-o", "metadata.topic.num.partitions=3"], work, env)
    # Before the schemas were packaged this failed with "event schemas missing" (and retried forever).
    assert json.loads(out)["source"] == "topic", out


def test_bucket_checks_run_in_process_without_the_spark_extra(
    installed: tuple[Path, Path, dict[str, str]], kafka_bootstrap: str, create_topic: Callable[..., str]
) -> None:
    venv, work, env = installed
    assert _run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; print(u.find_spec('pyspark'))"],
                work, env).strip() == "None"
    topic = create_topic("tl-install-nospark", partitions=3, config={"cleanup.policy": "compact"})
    options = ["-o", f"bootstrap.servers={kafka_bootstrap}", "-o", f"metadata.topic.name={topic}"]
    tierlog, state_dir, bucket = str(venv / "bin" / "tierlog"), work / "nospark-node", work / "nospark-bucket"
    bucket.mkdir()
    _run([tierlog, "rebuild", "--state-dir", str(state_dir), *options], work, env)
    reconciled = json.loads(_run([tierlog, "reconcile", "--json", "--bucket", str(bucket), *options], work, env))
    assert (reconciled["objects"], reconciled["live_segments"]) == (0, 0)
    verified = json.loads(_run([tierlog, "verify", "bucket", "--json", "--state-dir", str(state_dir), "--bucket",
                                str(bucket), *options], work, env))
    assert verified["ok"] is True


def test_a_broker_runs_the_installed_jar_and_agent(
    installed: tuple[Path, Path, dict[str, str]], s3_endpoint: S3Endpoint
) -> None:
    venv, work, env = installed
    jar = Path(_run([str(venv / "bin" / "tierlog"), "plugin-path"], work, env).strip())
    location = S3Location(s3_endpoint.endpoint, s3_endpoint.access_key, s3_endpoint.secret_key,
                          s3_endpoint.bucket, f"install-{uuid.uuid4().hex[:8]}")
    with tempfile.TemporaryDirectory(prefix="tli-") as sockets:
        properties = broker_properties(PluginChoice(s3=location), Path(sockets), jar)
        # What an operator following jvm/README.md sets: no agent.command, no agent.python.
        properties = {k: v for k, v in properties.items() if not k.endswith(".agent.command")}
        cluster = KafkaCluster(work / "kafka", 1, properties=properties)
        try:
            cluster.start()
            topic = f"tl-install-{uuid.uuid4().hex[:8]}"
            create_topic(cluster.bootstrap, topic, config=tiered_topic_config())
            produce(cluster.bootstrap, topic, 0, 12_000, size=300)
            wait_until_tiered(cluster.log_dir(0), topic, timeout=120)
        finally:
            cluster.stop()
            client = location.client()
            for obj in location.objects():
                client.delete_object(Bucket=location.bucket, Key=obj["Key"])
        agent_log = "\n".join(p.read_text(errors="replace") for p in sorted(Path(sockets).glob("agent-0.log*")))
        broker_log = cluster.log_file(0).read_text(errors="replace")
    started = re.search(r"tierlog agent \(pid \d+, from (\S+)\) serving on", agent_log)
    assert started, agent_log[-3000:]
    assert Path(started[1]).resolve().is_relative_to(venv.resolve()), started[0]
    assert f"Starting the tierlog agent: [{venv / 'bin' / 'tierlog-agent'}" in broker_log
    # The lines a person sees: the RLMM says it is ready (not before), no keepalive warning, no connection noise.
    assert "tierlog REMOTE_LOG_METADATA_MANAGER is ready" in broker_log
    assert "SO_KEEPALIVE" not in broker_log
    assert "Connection refused" not in agent_log, agent_log[-3000:]
