"""A real Apache Kafka KRaft cluster (1 or N combined broker+controller nodes) on 127.0.0.1.

Runs the broker jars resolved from Maven Central by dev/kafka/pom.xml with `java -cp`; no Docker.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from dev.process import LOOPBACK, free_ports, port_is_free, stop_pid, stop_pids, tail, wait_until
from dev.tls import TlsFiles

REPO_ROOT = Path(__file__).resolve().parent.parent
KAFKA_VERSION_FILE = REPO_ROOT / "dev" / "kafka.version"
KAFKA_POM = REPO_ROOT / "dev" / "kafka" / "pom.xml"
BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"
# Placeholders allowed inside broker property values, replaced per node (e.g. a per-node state dir
# for a plugin when several brokers share one host).
NODE_ID_PLACEHOLDER = "{node_id}"
NODE_DIR_PLACEHOLDER = "{node_dir}"

# Small JVMs: the machine has 2 cores shared with other brokers, Maven and Spark. C1 only and the
# serial collector start faster and keep background threads down; heap stays well inside 24 GB.
DEFAULT_HEAP = "512m"
BASE_JVM_OPTIONS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


def kafka_version() -> str:
    """The pinned Apache Kafka version (dev/kafka.version)."""
    return KAFKA_VERSION_FILE.read_text(encoding="ascii").strip()


def default_libs_dir() -> Path:
    """Where the broker jars are cached: $TIERLOG_KAFKA_LIBS, else <repo>/.dev/kafka-libs.

    Not under TIERLOG_DEV_DIR on purpose: it is a download cache, shared by every state directory.
    """
    override = os.environ.get("TIERLOG_KAFKA_LIBS")
    return Path(override) if override else REPO_ROOT / ".dev" / "kafka-libs"


def _libs_fingerprint(version: str) -> str:
    # The cache is valid for one Kafka version and one pom; editing either refreshes it.
    digest = hashlib.sha256(KAFKA_POM.read_bytes()).hexdigest()[:16]
    return f"{version} {digest}\n"


def kafka_libs_cached(libs_dir: Path | None = None) -> bool:
    """True when `libs_dir` holds a complete download for the pinned version and the current pom."""
    marker = (libs_dir or default_libs_dir()) / ".complete"
    return marker.exists() and marker.read_text(encoding="ascii") == _libs_fingerprint(kafka_version())


def ensure_kafka_libs(libs_dir: Path | None = None, *, quiet: bool = True) -> Path:
    """Resolve the broker's jars from Maven Central into `libs_dir` unless already there.

    Safe to call from several processes at once: a file lock serialises the download, and the
    directory only appears (renamed into place) once complete.
    """
    target = (libs_dir or default_libs_dir()).resolve()
    if kafka_libs_cached(target):
        return target
    version = kafka_version()
    fingerprint = _libs_fingerprint(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if kafka_libs_cached(target):
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            _run_maven_copy(staging, version, quiet=quiet)
            if not any(staging.glob("kafka_2.13-*.jar")):
                raise RuntimeError(f"Maven finished but left no kafka_2.13 jar in {staging}")
            (staging / ".complete").write_text(fingerprint, encoding="ascii")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _run_maven_copy(output_dir: Path, version: str, *, quiet: bool) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (`mvn`) is not on PATH; install Maven 3.8+ to fetch the Kafka jars")
    command = [
        mvn,
        "-B",
        "-Dstyle.color=never",
        *(["-q"] if quiet else []),
        "-f",
        str(KAFKA_POM),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={output_dir}",
        "-DincludeScope=runtime",
    ]
    # One retry: a first download from Maven Central on a fresh machine occasionally drops a
    # connection, and everything already fetched stays in ~/.m2 for the second attempt.
    for attempt in (1, 2):
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if result.returncode == 0:
            return
        if attempt == 2:
            raise RuntimeError(
                f"fetching Kafka {version} jars with Maven failed (exit {result.returncode}):\n"
                f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
            )


def java_executable() -> str:
    """`$JAVA_HOME/bin/java` when set, else `java` from PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise RuntimeError("Java is not on PATH; install a JDK 17+ to run the Kafka broker")
    return found


def new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID in Kafka's URL-safe base64 form (22 characters)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        # A leading '-' would be read as an option by the storage tool's argument parser.
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass(frozen=True)
class ListenerSecurity:
    """How the client listener of a cluster is secured (the controller listener stays PLAINTEXT on loopback).

    `broker` are broker properties; `format_args` go to `kafka-storage format` (SCRAM users are created
    there, before the broker starts); `client` are librdkafka settings a client needs besides the address.
    """

    protocol: str
    broker: Mapping[str, str]
    client: Mapping[str, str]
    format_args: tuple[str, ...] = ()


def scram_listener(username: str, password: str, mechanism: str = "SCRAM-SHA-512") -> ListenerSecurity:
    """SASL_PLAINTEXT with one SCRAM user, also used between brokers."""
    jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{username}" '
            f'password="{password}";')
    return ListenerSecurity(
        protocol="SASL_PLAINTEXT",
        broker={
            "sasl.enabled.mechanisms": mechanism,
            "sasl.mechanism.inter.broker.protocol": mechanism,
            f"listener.name.sasl_plaintext.{mechanism.lower()}.sasl.jaas.config": jaas,
        },
        client={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
                "sasl.username": username, "sasl.password": password},
        format_args=("--add-scram", f"{mechanism}=[name={username},password={password}]"),
    )


def tls_listener(tls: TlsFiles, client_auth: bool = False) -> ListenerSecurity:
    """SSL with the broker's PKCS12 key store from `dev.tls`; clients trust its CA (and, when the broker
    requires client certificates, present the client certificate)."""
    broker = {
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(tls.broker_keystore),
        "ssl.keystore.password": tls.keystore_password,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca_pem),
        "ssl.client.auth": "required" if client_auth else "none",
    }
    client = {"security.protocol": "SSL", "ssl.ca.location": str(tls.ca_pem)}
    if client_auth:
        client.update({"ssl.certificate.location": str(tls.client_pem), "ssl.key.location": str(tls.client_pem)})
    return ListenerSecurity(protocol="SSL", broker=broker, client=client)


@dataclass(frozen=True)
class KafkaNode:
    """One combined broker+controller node: its id, its two loopback ports and its directory."""

    node_id: int
    broker_port: int
    controller_port: int
    directory: Path

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.broker_port}"

    @property
    def log_dir(self) -> Path:
        """The broker's data log directory (`log.dirs`): topic partitions live here."""
        return self.directory / "data"

    @property
    def metadata_dir(self) -> Path:
        """The KRaft metadata log directory, kept apart so wiping `log_dir` keeps the quorum intact."""
        return self.directory / "metadata"

    @property
    def log_file(self) -> Path:
        """The broker's own log (log4j2), for debugging."""
        return self.directory / "server.log"

    @property
    def console_file(self) -> Path:
        """stdout and stderr of the JVM (startup failures before logging is configured land here)."""
        return self.directory / "console.log"

    @property
    def config_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.directory / "pid"


class KafkaCluster:
    """Formats and runs a KRaft cluster of `nodes` combined broker+controller nodes on 127.0.0.1.

    `properties` are extra broker properties for every node (e.g. `remote.log.storage.system.enable`,
    `remote.log.storage.manager.class.name`, `rsm.config.*`); values may contain `{node_id}` and
    `{node_dir}`, replaced per node. `classpath` entries are appended to the broker's classpath
    (plugin jars). Ports not given are picked free. Use as a context manager, or start()/stop().
    """

    def __init__(
        self,
        base_dir: Path | str,
        nodes: int = 1,
        *,
        broker_ports: Sequence[int] | None = None,
        controller_ports: Sequence[int] | None = None,
        properties: Mapping[str, object] | None = None,
        classpath: Sequence[Path | str] = (),
        heap: str = DEFAULT_HEAP,
        jvm_options: Sequence[str] = (),
        libs_dir: Path | None = None,
        start_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        listener: ListenerSecurity | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be at least 1, got {nodes}")
        self.base_dir = Path(base_dir).resolve()
        self.properties = {key: _property_value(key, value) for key, value in (properties or {}).items()}
        self.classpath = [str(Path(entry).resolve()) for entry in classpath]
        self.heap = heap
        self.jvm_options = list(jvm_options)
        self.libs_dir = libs_dir
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.listener = listener
        broker_ports = _ports_or_free("broker_ports", broker_ports, nodes, avoid=())
        controller_ports = _ports_or_free("controller_ports", controller_ports, nodes, avoid=broker_ports)
        self.nodes = [
            KafkaNode(i, broker_ports[i], controller_ports[i], self.base_dir / f"node-{i}")
            for i in range(nodes)
        ]
        self.cluster_id = self._load_or_new_cluster_id()
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._classpath: str | None = None  # set by _prepare(), once the jars are in place

    # -- addresses and paths ------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """`bootstrap.servers` for clients: every node's broker listener."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def client_config(self) -> dict[str, str]:
        """librdkafka settings for a client of this cluster: the address plus the listener's security."""
        return {"bootstrap.servers": self.bootstrap, **(self.listener.client if self.listener else {})}

    @property
    def node_ids(self) -> list[int]:
        return [node.node_id for node in self.nodes]

    def node(self, node_id: int) -> KafkaNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in this cluster (nodes: {self.node_ids})")

    def log_dir(self, node_id: int) -> Path:
        """The data log directory (`log.dirs`) of one node."""
        return self.node(node_id).log_dir

    def log_file(self, node_id: int) -> Path:
        """The server log of one node, for debugging."""
        return self.node(node_id).log_file

    def pid(self, node_id: int) -> int | None:
        """The PID of a running node, or None."""
        process = self._processes.get(node_id)
        if process is not None and process.poll() is None:
            return process.pid
        return None

    def is_running(self, node_id: int) -> bool:
        return self.pid(node_id) is not None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> KafkaCluster:
        """Format the nodes that need it, start every node, and wait until each serves metadata
        naming all nodes. On failure, stops what it started and raises with the log's tail."""
        self._prepare()
        try:
            for node in self.nodes:
                if not self.is_running(node.node_id):
                    self._launch(node)
            self._wait_ready(self.node_ids)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node: SIGTERM to all at once, then SIGKILL whatever outlives the timeout."""
        running = [node_id for node_id in self._processes if self.is_running(node_id)]
        stop_pids([self._processes[node_id].pid for node_id in running], timeout=self.stop_timeout)
        for node_id in list(self._processes):
            self._forget(node_id)

    def stop_node(self, node_id: int) -> None:
        """Stop one node (SIGTERM, then SIGKILL after the stop timeout)."""
        process = self._processes.get(self.node(node_id).node_id)
        if process is not None:
            stop_pid(process.pid, timeout=self.stop_timeout)
            self._forget(node_id)

    def kill_node(self, node_id: int) -> None:
        """Stop one node abruptly (SIGKILL): no controlled shutdown, as after a crash."""
        process = self._processes.get(self.node(node_id).node_id)
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            stop_pid(process.pid, timeout=10)
            self._forget(node_id)

    def start_node(self, node_id: int) -> None:
        """Start one stopped node and wait until the cluster's metadata lists it again."""
        node = self.node(node_id)
        if self.is_running(node_id):
            return
        if self._classpath is None:
            self._prepare()
        self._format(node)
        self._launch(node)
        self._wait_ready([n for n in self.node_ids if self.is_running(n)])

    def set_properties(self, properties: Mapping[str, object]) -> None:
        """Replace the extra broker properties: each node (re)started from now on runs with them (a rolling change)."""
        self.properties = {key: _property_value(key, value) for key, value in properties.items()}
        for node in self.nodes:
            if node.directory.exists():
                node.config_file.write_text(self._server_properties(node), encoding="utf-8")

    def restart_node(self, node_id: int) -> None:
        """Stop one node and start it again; returns once it serves metadata."""
        self.stop_node(node_id)
        self.start_node(node_id)

    def wipe_log_dir(self, node_id: int) -> None:
        """Empty one stopped node's data log directory, as after losing its disk. The metadata log
        is kept, so the node rejoins the quorum and re-replicates its partitions."""
        node = self.node(node_id)
        if self.is_running(node_id):
            raise RuntimeError(f"node {node_id} is running; stop it before wiping {node.log_dir}")
        shutil.rmtree(node.log_dir, ignore_errors=True)
        node.log_dir.mkdir(parents=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------------------

    def _load_or_new_cluster_id(self) -> str:
        state_file = self.base_dir / "cluster.json"
        if not state_file.exists():
            return new_cluster_id()
        state = json.loads(state_file.read_text(encoding="utf-8"))
        if state.get("nodes") != len(self.nodes):
            raise RuntimeError(
                f"{self.base_dir} holds a Kafka cluster of {state.get('nodes')} nodes, "
                f"not {len(self.nodes)}; use an empty directory or delete it"
            )
        return str(state["cluster_id"])

    def _prepare(self) -> None:
        libs = ensure_kafka_libs(self.libs_dir)
        self._classpath = os.pathsep.join([str(libs / "*"), *self.classpath])
        self.base_dir.mkdir(parents=True, exist_ok=True)
        (self.base_dir / "cluster.json").write_text(
            json.dumps(
                {
                    "cluster_id": self.cluster_id,
                    "nodes": len(self.nodes),
                    "bootstrap": self.bootstrap,
                    "broker_ports": [n.broker_port for n in self.nodes],
                    "controller_ports": [n.controller_port for n in self.nodes],
                },
                indent=2,
            ),
            encoding="utf-8",
        )
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)
            node.log_dir.mkdir(exist_ok=True)
            node.config_file.write_text(self._server_properties(node), encoding="utf-8")
            (node.directory / "log4j2.properties").write_text(_log4j2_properties(node), encoding="utf-8")
        # Formatting is one short JVM per node; run them side by side.
        formatting = [(node, self._format_process(node)) for node in self.nodes if _needs_format(node)]
        for node, process in formatting:
            self._check_format(node, process)

    def _java_classpath(self) -> str:
        if self._classpath is None:
            raise RuntimeError("the cluster was never prepared; call start() first")
        return self._classpath

    def _format(self, node: KafkaNode) -> None:
        if _needs_format(node):
            self._check_format(node, self._format_process(node))

    def _format_process(self, node: KafkaNode) -> subprocess.Popen[bytes]:
        command = [
            java_executable(),
            "-Xmx256m",
            *BASE_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={node.directory / 'log4j2.properties'}",
            "-cp",
            self._java_classpath(),
            STORAGE_TOOL_MAIN,
            "format",
            "--cluster-id",
            self.cluster_id,
            "--config",
            str(node.config_file),
            "--ignore-formatted",
            *(self.listener.format_args if self.listener else ()),
        ]
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def _check_format(self, node: KafkaNode, process: subprocess.Popen[bytes]) -> None:
        output, _ = process.communicate(timeout=120)
        if process.returncode != 0:
            raise RuntimeError(
                f"formatting Kafka node {node.node_id} in {node.directory} failed "
                f"(exit {process.returncode}):\n{output.decode(errors='replace')[-4000:]}"
            )

    def _server_properties(self, node: KafkaNode) -> str:
        count = len(self.nodes)
        protocol = self.listener.protocol if self.listener else "PLAINTEXT"
        voters = ",".join(f"{n.node_id}@{LOOPBACK}:{n.controller_port}" for n in self.nodes)
        settings: dict[str, str] = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"{protocol}://{LOOPBACK}:{node.broker_port},CONTROLLER://{LOOPBACK}:{node.controller_port}",
            "advertised.listeners": f"{protocol}://{LOOPBACK}:{node.broker_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": protocol,
            "listener.security.protocol.map": f"{protocol}:{protocol},CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.log_dir),
            "metadata.log.dir": str(node.metadata_dir),
            # Internal topics sized for a test cluster: replicas no more than nodes, few partitions
            # so the first consumer group or transaction does not create 50 partitions.
            "offsets.topic.replication.factor": str(min(3, count)),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(min(3, count)),
            "transaction.state.log.min.isr": str(min(2, count)),
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(min(3, count)),
            "share.coordinator.state.topic.min.isr": str(min(2, count)),
            "default.replication.factor": "1",
            "num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Fewer threads and a smaller cleaner buffer than the defaults: several brokers share
            # two cores and a 512 MiB heap.
            "num.network.threads": "2",
            "num.io.threads": "4",
            "background.threads": "4",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "controlled.shutdown.enable": "true",
            **(self.listener.broker if self.listener else {}),
        }
        for key, value in self.properties.items():
            settings[key] = value.replace(NODE_ID_PLACEHOLDER, str(node.node_id)).replace(
                NODE_DIR_PLACEHOLDER, str(node.directory)
            )
        return "".join(f"{key}={_escape_property(value)}\n" for key, value in settings.items())

    def _launch(self, node: KafkaNode) -> None:
        busy = [port for port in (node.broker_port, node.controller_port) if not port_is_free(port)]
        if busy:
            raise RuntimeError(
                f"cannot start Kafka node {node.node_id}: loopback ports {busy} are already in use "
                "(another broker?); stop it or choose other ports"
            )
        command = [
            java_executable(),
            f"-Xmx{self.heap}",
            "-Xms64m",
            *BASE_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={node.directory / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={node.directory}",
            *self.jvm_options,
            "-cp",
            self._java_classpath(),
            BROKER_MAIN,
            str(node.config_file),
        ]
        with node.console_file.open("ab") as console:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                cwd=node.directory,
                # Own session: a Ctrl-C aimed at the test runner or dev/services does not reach the
                # broker; it is stopped explicitly, by PID.
                start_new_session=True,
            )
        self._processes[node.node_id] = process
        node.pid_file.write_text(f"{process.pid}\n", encoding="ascii")

    def _forget(self, node_id: int) -> None:
        process = self._processes.pop(node_id, None)
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1)
        with contextlib.suppress(FileNotFoundError):
            self.node(node_id).pid_file.unlink()

    def _wait_ready(self, node_ids: Sequence[int]) -> None:
        expected = set(node_ids)

        def all_ready() -> bool:
            # Liveness of every node first: a dead JVM will not come back, so fail at once.
            for node_id in node_ids:
                process = self._processes.get(node_id)
                if process is None or process.poll() is not None:
                    node = self.node(node_id)
                    code = None if process is None else process.returncode
                    raise NodeDiedError(
                        f"Kafka node {node_id} exited (code {code}) while starting; "
                        f"log {node.log_file}:\n{tail(node.log_file)}\n{tail(node.console_file, 15)}"
                    )
            client = self.listener.client if self.listener else {}
            return all(expected <= set(broker_ids(self.node(n).bootstrap, client=client)) for n in node_ids)

        try:
            wait_until(
                all_ready,
                timeout=self.start_timeout,
                fatal=(NodeDiedError,),
                interval=0.5,
                description=f"Kafka nodes {sorted(expected)} at {self.bootstrap} to serve metadata",
            )
        except TimeoutError as exc:
            logs = "\n".join(
                f"--- {self.node(n).log_file}:\n{tail(self.node(n).log_file, 20)}" for n in node_ids
            )
            raise TimeoutError(f"{exc}\n{logs}") from None


class NodeDiedError(RuntimeError):
    """A Kafka node's JVM exited while the cluster was waiting for it."""


def broker_ids(bootstrap: str, timeout: float = 3.0, client: Mapping[str, str] | None = None) -> list[int]:
    """The ids of the brokers that `bootstrap` reports as alive, via a metadata request."""
    from confluent_kafka.admin import AdminClient

    # log_level 0 keeps librdkafka from printing connection errors while a broker is still starting.
    admin = AdminClient(
        {**(client or {}), "bootstrap.servers": bootstrap, "log_level": 0, "socket.timeout.ms": int(timeout * 1000)}
    )
    metadata = admin.list_topics(timeout=timeout)
    return sorted(metadata.brokers)


def _needs_format(node: KafkaNode) -> bool:
    # A wiped data directory needs its meta.properties again; `format --ignore-formatted` writes
    # it and leaves the already formatted metadata directory alone.
    return not all((d / "meta.properties").exists() for d in (node.metadata_dir, node.log_dir))


def _ports_or_free(name: str, ports: Sequence[int] | None, count: int, *, avoid: Sequence[int]) -> list[int]:
    if ports is None:
        return free_ports(count, avoid=avoid)
    if len(ports) != count:
        raise ValueError(f"{name} needs {count} ports (one per node), got {list(ports)}")
    return list(ports)


def _property_value(key: str, value: object) -> str:
    if not key or any(ch in key for ch in "=: \t\n"):
        raise ValueError(f"invalid broker property name {key!r}: no spaces, '=' or ':' allowed")
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        raise ValueError(f"broker property {key!r} has no value (None)")
    return str(value)


def _escape_property(value: str) -> str:
    # Java properties treat backslash as an escape and a newline as the end of the value.
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _log4j2_properties(node: KafkaNode) -> str:
    return "\n".join(
        [
            "status = warn",
            "appender.file.type = File",
            "appender.file.name = FILE",
            f"appender.file.fileName = {node.log_file}",
            "appender.file.layout.type = PatternLayout",
            "appender.file.layout.pattern = [%d] %p %m (%c)%n",
            "rootLogger.level = INFO",
            "rootLogger.appenderRef.file.ref = FILE",
            # Per-request and per-partition state chatter would drown the interesting lines.
            "logger.request.name = kafka.request.logger",
            "logger.request.level = WARN",
            "logger.statechange.name = state.change.logger",
            "logger.statechange.level = WARN",
            "",
        ]
    )
