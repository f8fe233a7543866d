"""The tierlog agent: one process per broker hosting tierlog's rlmm and rsm, serving the Kafka plugin
classes (jvm/) over gRPC on a Unix domain socket (mode 0600), with an optional Prometheus endpoint.

Entry point for `tierlog agent` and for the JVM adapter (which runs the `tierlog-agent` script of the
environment its jar was installed with, or `agent.python -m tierlog.agent.server`):

    serve(config: dict, socket_path: str, metrics_port: int | None, *, metrics_address: str = "127.0.0.1") -> None

blocks until SIGTERM or SIGINT, then stops taking calls, lets running ones finish (10 s grace), closes the
rlmm and rsm and removes the socket. `config` holds the agent's own component configs, flat, with keys
prefixed `rlmm.` or `rsm.` (e.g. `rlmm.bootstrap.servers`, `rsm.storage.backend`); a component given here
is created at once and a broker's Configure for it is ignored. A component absent here is created when the
broker's plugin configures it (its `rlmm.config.*` / `rsm.config.*`, see agent/broker_config.py).
`metrics_port` serves Prometheus text on `metrics_address` (default 127.0.0.1, loopback only; 0.0.0.0 or a
host address lets a Prometheus server on another host scrape it), 0 picks a free port, None disables it.
Keyword-only extras used by the JVM adapter: `parent_pid` (exit when that process is gone) and
`exit_when_idle` (exit once the broker has closed every component it configured).

An agent hosting both components also archives the metadata partitions its broker leads and writes bootstrap
snapshots (tierlog.agent.archiving: archiving is on unless `rlmm.archive.enable=false`; snapshots need
`rlmm.snapshot.location`).

Logs: `--log-file` is rotated (64 MiB, 5 old files by default); librdkafka's lines go through Python logging,
quiet while the broker's listener is still coming up and rate-limited after that (QuietClientLog).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.handlers
import os
import re
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

from rlmm.errors import ConfigError
from tierlog.agent.archiving import ArchivingComponent
from tierlog.agent.archiving import split_config as split_archiving_config
from tierlog.agent.components import ComponentName, Components, NotConfiguredError
from tierlog.agent.metrics import DEFAULT_METRICS_ADDRESS, AgentMetrics
from tierlog.agent.rlmm_metrics import RlmmCollector, kafka_end_offsets
from tierlog.agent.servicers import build_services
from tierlog.agent.storage_check import StorageCheck
from tierlog.audit.metrics import AuditCollector
from tierlog.migration.node import split_config as split_migration_config
from tierlog.migration.node import wrap as in_migration_mode

log = logging.getLogger("agent")

# librdkafka's own log, routed through Python logging (the rlmm's clients get it as their `logger`).
CLIENT_LOG = "tierlog.rdkafka"
# The agent usually starts before its broker's listener is up: connection failures are expected that long.
CLIENT_STARTUP_QUIET_S = 120.0
# After that, one line per kind of client message per interval, saying how many like it were held back.
CLIENT_REPEAT_INTERVAL_S = 60.0
LOG_MAX_BYTES = 64 * 1024 * 1024
LOG_BACKUPS = 5
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_CONNECTION_FAILURES = ("Connection refused", "Connect to ", "brokers are down", "Broker transport failure")
_DIGITS = re.compile(r"\d+")


class QuietClientLog(logging.Filter):
    """Keeps librdkafka from flooding the agent's log.

    Connection failures during the startup window are counted, not written (the broker is still starting);
    afterwards each kind of line (its text with numbers masked) is written at most once per interval, with the
    count of those held back, so a real, lasting problem still shows as one clear line a minute.
    """

    def __init__(
        self,
        startup_quiet_s: float = CLIENT_STARTUP_QUIET_S,
        interval_s: float = CLIENT_REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._quiet_until = clock() + startup_quiet_s
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        kind = _DIGITS.sub("N", message)
        now = self._clock()
        with self._lock:
            if now < self._quiet_until and any(f in message for f in _CONNECTION_FAILURES):
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            last = self._last.get(kind)
            if last is not None and now - last < self._interval_s:
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            self._last[kind] = now
            held = self._held.pop(kind, 0)
        if held:
            record.msg, record.args = f"{message} ({held} similar lines held back)", None
        return True


def client_logger() -> logging.Logger:
    """The logger the rlmm's Kafka clients write through (quietened once per process)."""
    logger = logging.getLogger(CLIENT_LOG)
    if not any(isinstance(f, QuietClientLog) for f in logger.filters):
        logger.addFilter(QuietClientLog())
    return logger


def setup_logging(log_file: str | Path | None, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS) -> None:
    """The agent's log: rotated at `max_bytes`, keeping `backups` old files, or stderr without a file."""
    handler: logging.Handler
    if log_file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)

GRACE_S = 10.0
WORKERS = 32
# A broker configures both plugins at startup; the rlmm waits this long for the rsm whose bucket holds snapshots.
SNAPSHOT_RSM_WAIT_S = 30.0
PARENT_POLL_S = 1.0
# The broker's messages are small except listed segments; match the JVM adapter's limit.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_PREFIXES = {"rlmm.": ComponentName.REMOTE_LOG_METADATA_MANAGER, "rsm.": ComponentName.REMOTE_STORAGE_MANAGER}


def _create_rlmm(config: Mapping[str, Any], snapshot_source: Any | None = None,
                 migration_config: Mapping[str, Any] | None = None) -> Any:
    from rlmm import RemoteLogMetadataManager

    # Without a logger librdkafka writes straight to stderr, unfiltered and unrotated.
    own = {"kafka.logger": client_logger(), **config}
    # migration.mode=dual-write: the manager wrapped for a live migration from Kafka's built-in manager (issue 26).
    manager = RemoteLogMetadataManager(own, snapshot_source=snapshot_source)
    return in_migration_mode(manager, own, migration_config or {})


def _create_rsm(config: Mapping[str, Any]) -> Any:
    from rsm import RemoteStorageManager

    return RemoteStorageManager(dict(config))


def split_config(config: Mapping[str, Any]) -> dict[ComponentName, dict[str, Any]]:
    """The agent's flat `rlmm.*` / `rsm.*` config, per component (prefix removed)."""
    split: dict[ComponentName, dict[str, Any]] = {}
    for key, value in config.items():
        for prefix, name in _PREFIXES.items():
            if key.startswith(prefix):
                split.setdefault(name, {})[key[len(prefix) :]] = value
                break
        else:
            raise ConfigError(f"agent: config key {key} must start with rlmm. or rsm.")
    return split


class AgentServer:
    """The gRPC server and its components; `serve()` wraps it with signals, for tests it runs in-process."""

    def __init__(
        self,
        config: Mapping[str, Any],
        socket_path: str | Path,
        metrics_port: int | None = None,
        *,
        exit_when_idle: bool = False,
        metrics_address: str = DEFAULT_METRICS_ADDRESS,
        snapshot_source: Any | None = None,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.stopped = threading.Event()
        self.metrics = AgentMetrics()
        self.components = Components(
            {
                ComponentName.REMOTE_LOG_METADATA_MANAGER: self._create_rlmm,
                ComponentName.REMOTE_STORAGE_MANAGER: self._create_rsm,
            },
            on_idle=self.stopped.set if exit_when_idle else None,
        )
        self._split = split_config(config)
        self.metrics_port = metrics_port
        self.metrics_address = metrics_address
        # Archives the metadata partitions this broker leads, into the rsm's bucket (tierlog.agent.archiving).
        self.archiving = ArchivingComponent(self._rsm_backend, client_logger(), self._rlmm)
        self._snapshot_source = snapshot_source
        self._storage_check: StorageCheck | None = None
        self._end_offsets: Any = None
        self._server: grpc.Server | None = None

    def _create_rlmm(self, config: Mapping[str, Any]) -> Any:
        own, archiving = split_archiving_config(config)
        own, migration = split_migration_config(own)
        manager = _create_rlmm(own, self._snapshot_source or self._bucket_snapshots(own), migration)
        self.archiving.configure(own, archiving)
        return manager

    def _create_rsm(self, config: Mapping[str, Any]) -> Any:
        rsm = _create_rsm(config)
        # Its store is checked now (bad credentials, a missing bucket); the rsm is ready once the check passes.
        previous, self._storage_check = self._storage_check, StorageCheck(rsm)
        if previous is not None:
            previous.close()
        return rsm

    def _rsm_backend(self) -> Any | None:
        """The bucket of this agent's rsm once it exists, else None."""
        try:
            rsm = self.components.slot(ComponentName.REMOTE_STORAGE_MANAGER).get_nowait()
        except NotConfiguredError:
            return None
        return None if rsm is None else rsm.backend

    def _bucket_snapshots(self, config: Mapping[str, Any]) -> Any | None:
        """With `snapshot.location`, a new node bootstraps from snapshots in the bucket its rsm writes to."""
        if not config.get("snapshot.location"):
            return None
        from rsm.snapshot_source import BucketSnapshotSource

        deadline = time.monotonic() + SNAPSHOT_RSM_WAIT_S
        while True:
            try:
                rsm = self.components.get(ComponentName.REMOTE_STORAGE_MANAGER, max(deadline - time.monotonic(), 0))
                return BucketSnapshotSource(rsm.backend)
            except NotConfiguredError as exc:  # the broker configures the rsm next; wait for it a little
                if time.monotonic() >= deadline or self.stopped.wait(0.1):
                    reason: Exception = exc
                    break
            except Exception as exc:  # the rsm failed to start: the node reads the topic instead
                reason = exc
                break
        log.warning("snapshot.location is set but this agent's storage manager is not available (%s); "
                    "the metadata view is built from the topic", reason)
        return None

    def _rsm_snapshot(self) -> dict[str, Any] | None:
        try:
            slot = self.components.slot(ComponentName.REMOTE_STORAGE_MANAGER)
        except NotConfiguredError:
            return None
        rsm = slot.get_nowait()
        return rsm.metrics() if rsm is not None and hasattr(rsm, "metrics") else None

    def _rlmm(self) -> Any | None:
        try:
            slot = self.components.slot(ComponentName.REMOTE_LOG_METADATA_MANAGER)
        except NotConfiguredError:
            return None
        return slot.get_nowait()

    def _rlmm_end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        # One admin client for the agent's life, from the config of the rlmm that exists at the first scrape.
        if self._end_offsets is None:
            self._end_offsets = kafka_end_offsets(
                self.components.slot(ComponentName.REMOTE_LOG_METADATA_MANAGER).config
            )
        return dict(self._end_offsets(topic, partitions))

    def _readiness(self) -> dict[str, bool]:
        ready = {}
        for name in ComponentName:
            with contextlib.suppress(NotConfiguredError):  # not hosted here: exported as absent
                instance = self.components.slot(name).get_nowait()
                ready[name.short] = instance is not None and (
                    name is not ComponentName.REMOTE_STORAGE_MANAGER or self._storage_ready(instance))
        return ready

    def _storage_ready(self, rsm: Any) -> bool:
        check = self._storage_check
        return check is not None and check.rsm is rsm and check.passed

    def _watch(self) -> None:
        metrics = self.metrics
        metrics.watch_rsm(self._rsm_snapshot)
        metrics.watch(RlmmCollector(self._rlmm, self._rlmm_end_offsets))
        metrics.watch_components(self._readiness)
        metrics.watch(AuditCollector(self.archiving.progress))
        metrics.up.set(1)

    def start(self) -> AgentServer:
        _claim_socket_path(self.socket_path)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="agent-rpc"),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        for servicer, register in build_services(self.components, self.metrics):
            register(servicer, server)
        # The socket is the agent's only access control: create it owner-only (umask), then make sure.
        previous = os.umask(0o177)
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
            server.start()
        finally:
            os.umask(previous)
        os.chmod(self.socket_path, stat.S_IRUSR | stat.S_IWUSR)
        self._server = server
        for name, component_config in self._split.items():
            self.components.preset(name, component_config)
        if self.metrics_port is not None:
            self._watch()
            self.metrics_port = self.metrics.serve(self.metrics_port, self.metrics_address)
            log.info("metrics on http://%s:%d/metrics", self.metrics_address, self.metrics_port)
        # Which installation runs matters when a host has several (a wheel, a checkout): say so.
        log.info("tierlog agent (pid %d, from %s) serving on %s", os.getpid(), Path(__file__).resolve().parent,
                 self.socket_path)
        return self

    def stop(self, grace: float = GRACE_S) -> None:
        self.stopped.set()
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        self.archiving.close()
        if self._storage_check is not None:
            self._storage_check.close()
        self.components.close_all()
        self.metrics.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        log.info("tierlog agent stopped")


def _claim_socket_path(path: Path) -> None:
    """Remove a socket left by a dead agent; refuse to steal one a live agent still answers on."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    if not stat.S_ISSOCK(path.stat().st_mode):
        raise ConfigError(f"agent: {path} exists and is not a socket; choose another socket path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
        return
    finally:
        probe.close()
    raise ConfigError(f"agent: another agent is already serving on {path}")


def _watch_parent(pid: int, stopped: threading.Event) -> None:
    while not stopped.wait(PARENT_POLL_S):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            log.warning("the broker (pid %d) is gone; stopping", pid)
            stopped.set()
            return
        except PermissionError:
            pass


def serve(
    config: dict[str, Any],
    socket_path: str,
    metrics_port: int | None = None,
    *,
    parent_pid: int | None = None,
    exit_when_idle: bool = False,
    metrics_address: str = DEFAULT_METRICS_ADDRESS,
    snapshot_source: Any | None = None,
) -> None:
    """Run the agent until SIGTERM/SIGINT (or its parent's exit / idleness, if asked); see the module doc.

    `snapshot_source`: where the rlmm finds bootstrap snapshots (default: its rsm's bucket)."""
    agent = AgentServer(
        config, socket_path, metrics_port, exit_when_idle=exit_when_idle, metrics_address=metrics_address,
        snapshot_source=snapshot_source,
    ).start()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        agent.stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(parent_pid, agent.stopped), daemon=True).start()
    try:
        # wait() with a timeout keeps the main thread responsive to signals.
        while not agent.stopped.wait(1.0):
            pass
    finally:
        agent.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tierlog.agent.server", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="Unix domain socket path to serve on")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    parser.add_argument("--metrics-address", default=DEFAULT_METRICS_ADDRESS,
                        help="address the metrics port binds to (default 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    parser.add_argument("--exit-when-idle", action="store_true", help="exit once every component is closed")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a component config entry, rlmm.* or rsm.* (repeatable)",
    )
    parser.add_argument("--log-file", help="write the log here, rotated (default: stderr)")
    parser.add_argument("--log-max-bytes", type=int, default=LOG_MAX_BYTES, help="rotate the log at this size")
    parser.add_argument("--log-backups", type=int, default=LOG_BACKUPS, help="rotated log files to keep")
    args = parser.parse_args(argv)
    if args.log_max_bytes <= 0 or args.log_backups < 1:
        parser.error("--log-max-bytes must be positive and --log-backups at least 1")
    setup_logging(args.log_file, args.log_max_bytes, args.log_backups)
    config: dict[str, Any] = {}
    for entry in args.config:
        key, sep, value = entry.partition("=")
        if not sep:
            parser.error(f"--config takes KEY=VALUE, got {entry!r}")
        config[key] = value
    serve(
        config, args.socket, args.metrics_port, parent_pid=args.parent_pid, exit_when_idle=args.exit_when_idle,
        metrics_address=args.metrics_address,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
