"""`tierlog archive` (the audit loop on its own: every metadata partition, and snapshots) and `tierlog agent` (the
per-broker agent, which archives the metadata partitions its broker leads)."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from tierlog.cli.common import EXIT_OK, EXIT_USAGE, CommandError, Settings, open_location
from tierlog.cli.output import emit


def _audit_settings(settings: Settings) -> tuple[Any, dict[str, Any]]:
    """The audit loop's settings from the config's archive.* and snapshot.* keys (the agent's keys), and the Kafka
    client settings it uses."""
    from rlmm.config import parse_config
    from rlmm.errors import ConfigError
    from tierlog.agent.archiving import CONFIG_KEYS, audit_settings

    raw = {key.name: settings.get(key.name) for key in CONFIG_KEYS if settings.get(key.name)}
    client = {k: v for k, v in settings.kafka_client().items() if k != "bootstrap.servers"}
    try:
        archiving = parse_config(raw, CONFIG_KEYS, "archive")
        return audit_settings(archiving, settings.bootstrap(), settings.metadata_topic(),
                              settings.get("snapshot.location") or "", client), client
    except (ConfigError, ValueError) as exc:
        raise CommandError(f"archive settings: {exc}", EXIT_USAGE) from exc


def cmd_archive(args: argparse.Namespace, settings: Settings) -> int:
    from rlmm.errors import MetadataLogError, RemoteStorageError
    from tierlog.agent.archiving import audit_loop
    from tierlog.audit.archiver import Archiver
    from tierlog.audit.assignment import MetadataTopicDescriber
    from tierlog.audit.snapshots import write_snapshot_now
    from tierlog.cli.verify import require_topic

    location = settings.archive_location(args.archive)
    # The archiver's own client waits longer than --timeout on a wrong address; fail first, in one line.
    require_topic(settings, settings.metadata_topic())
    store = open_location(location, settings)
    audit, client = _audit_settings(settings)
    if args.once:
        try:
            stats = Archiver(store, audit.archiver).run_until_caught_up()
            snapshot = None
            if audit.snapshots is not None:
                topic = MetadataTopicDescriber({"bootstrap.servers": settings.bootstrap(), **client},
                                               settings.metadata_topic(), None)
                snapshot = write_snapshot_now(store, audit.snapshots, topic.assignment().topic_id,
                                              topic_ends=topic.end_offsets)
        except (MetadataLogError, RemoteStorageError) as exc:
            raise CommandError(str(exc)) from exc
        payload = {"archive": location, "files_written": stats.files_written,
                   "records_archived": stats.records_archived, "snapshot": snapshot}
        emit(args, payload, lambda: print(
            f"archived {stats.records_archived} records in {stats.files_written} files to {location}"
            + (f"; wrote snapshot {snapshot}" if snapshot else "")))
        return EXIT_OK
    loop = audit_loop(store, audit, client, broker_id=None)
    stop = threading.Event()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    metrics = _serve_metrics(loop, args.metrics_port, args.metrics_address)
    loop.start()
    print(f"archiving {settings.metadata_topic()} to {location}"
          + ("" if audit.snapshots is None else f", snapshots under {audit.snapshots.location}")
          + ("" if metrics is None else f"; metrics on http://{args.metrics_address}:{metrics.server_port}/metrics")
          + "; Ctrl-C stops", file=sys.stderr, flush=True)
    try:
        stop.wait()
    finally:
        loop.close()
        if metrics is not None:
            metrics.shutdown()
            metrics.server_close()
    return EXIT_OK


def _serve_metrics(loop: Any, port: int | None, address: str) -> Any:
    """The same tierlog_archiver_* metrics the agent serves, on `address`:`port` (0 picks one); None without one."""
    if port is None:
        return None
    from prometheus_client import CollectorRegistry, start_http_server

    from tierlog.audit.metrics import AuditCollector

    registry = CollectorRegistry()
    registry.register(AuditCollector(loop.progress))
    try:
        server, _thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise CommandError(f"cannot serve metrics on {address}:{port}: {exc}", EXIT_USAGE) from exc
    return server


def cmd_agent(args: argparse.Namespace, settings: Settings) -> int:
    import logging

    from tierlog.agent.broker_config import default_socket_path, plugin_configs
    from tierlog.agent.server import serve

    # A server's log: its INFO lines (metrics address, components created) on stderr, not only warnings.
    logging.getLogger().setLevel(logging.INFO)
    # What a broker with this file would hand its plugins (one mapping, also behind `tierlog config --explain`);
    # the adapter's agent.* keys give the socket and metrics flags their defaults, as the broker would.
    plugins = plugin_configs(settings.config)
    adapter = plugins.adapter
    node = (plugins.rlmm or plugins.rsm or {}).get("broker.id")
    socket = args.socket or adapter.get("agent.socket.path") or str(default_socket_path(node))
    port = args.metrics_port if args.metrics_port is not None else adapter.get("agent.metrics.port")
    address = args.metrics_address or adapter.get("agent.metrics.address") or "127.0.0.1"
    serve(plugins.agent_config(), socket, None if port is None else int(port), metrics_address=address)
    return EXIT_OK
