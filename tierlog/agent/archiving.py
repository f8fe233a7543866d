"""The agent's audit component: the audit loop (tierlog.audit.loop) over the metadata partitions this agent's broker
leads, writing the archive and, where the broker leads metadata partition 0, the bootstrap snapshots into the bucket
of the agent's rsm, with the rlmm's Kafka settings. Its keys arrive with the rlmm's (`rlmm.config.archive.*`,
`rlmm.config.snapshot.interval.ms`); `tierlog archive` reads the same keys.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rlmm.client_security import librdkafka_settings
from rlmm.config import ConfigKey, parse_bool, parse_config, parse_int
from rlmm.manager import CLIENT_PREFIX
from rlmm.manager import CONFIG_KEYS as RLMM_KEYS
from rsm.backend import StorageBackend
from tierlog.audit.archiver import ArchiverSettings
from tierlog.audit.assignment import MetadataTopicDescriber
from tierlog.audit.loop import AuditLoop, AuditProgress, AuditSettings
from tierlog.audit.snapshots import SnapshotSettings

log = logging.getLogger(__name__)


def _positive(value: int) -> bool:
    return value > 0


CONFIG_KEYS = (
    # On by default wherever the agent hosts both the rlmm and the rsm (the archive and snapshots go to its bucket).
    ConfigKey("archive.enable", parse_bool, True),
    # Longest an archived record waits before its file is written: keep it far below min.compaction.lag.ms.
    ConfigKey("archive.max.interval.ms", parse_int, 5_000, check=_positive, requirement="> 0"),
    ConfigKey("archive.max.records.per.file", parse_int, 10_000, check=_positive, requirement="> 0"),
    # How often the agent asks which metadata partitions its broker leads: the longest a leadership move leaves a
    # partition unarchived (or archived by two agents, which is harmless).
    ConfigKey("archive.leadership.check.interval.ms", parse_int, 30_000, check=_positive, requirement="> 0"),
    # Needs snapshot.location (the key nodes read snapshots from).
    ConfigKey("snapshot.interval.ms", parse_int, 3_600_000, check=_positive, requirement="> 0"),
    ConfigKey("snapshot.keep", parse_int, 3, check=_positive, requirement="> 0"),
)
NAMES = frozenset(key.name for key in CONFIG_KEYS)
# How long the agent waits for its component to stop at shutdown.
CLOSE_DEADLINE_S = 10.0


def split_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An rlmm config's own keys, and its archiving keys parsed (ConfigError names a bad one)."""
    own = {k: v for k, v in config.items() if k not in NAMES}
    return own, parse_config({k: v for k, v in config.items() if k in NAMES}, CONFIG_KEYS, "archiving")


def audit_settings(archiving: Mapping[str, Any], bootstrap_servers: str, metadata_topic: str,
                   snapshot_location: str, client: Mapping[str, Any]) -> AuditSettings:
    """The loop's settings from parsed archiving keys; no snapshots without a `snapshot_location`."""
    snapshots = SnapshotSettings(snapshot_location, metadata_topic, archiving["snapshot.interval.ms"] / 1000,
                                 archiving["snapshot.keep"]) if snapshot_location.strip("/") else None
    return AuditSettings(
        ArchiverSettings(bootstrap_servers, metadata_topic, archiving["archive.max.records.per.file"],
                         archiving["archive.max.interval.ms"] / 1000, consumer_overrides=tuple(client.items())),
        snapshots, archiving["archive.leadership.check.interval.ms"] / 1000)


def audit_loop(store: StorageBackend, settings: AuditSettings, client: Mapping[str, Any],
               broker_id: int | None, manager: Callable[[], Any | None] = lambda: None) -> AuditLoop:
    """A loop archiving the metadata partitions `broker_id` leads (None: every partition); snapshots from the view of
    `manager()` when it gives the node's metadata manager."""
    topic = settings.archiver.metadata_topic
    describer = MetadataTopicDescriber({"bootstrap.servers": settings.archiver.bootstrap_servers, **client}, topic,
                                       broker_id)
    return AuditLoop(store, settings, describer.assignment, describer.end_offsets, manager)


class ArchivingComponent:
    """The agent's audit loop: started once the rlmm's config (`configure`) and the rsm's bucket (`store()`, None
    until the rsm exists) are both there, replaced when the rlmm is configured again, closed with a deadline."""

    def __init__(self, store: Callable[[], StorageBackend | None], logger: logging.Logger | None = None,
                 manager: Callable[[], Any | None] = lambda: None) -> None:
        self._store = store
        self._manager = manager  # the agent's metadata manager once created: snapshots are written from its view
        self._logger = logger
        self._lock = threading.Lock()
        self._loop: AuditLoop | None = None
        self._closed = threading.Event()
        self._generation = 0

    def configure(self, rlmm_config: Mapping[str, Any], archiving: Mapping[str, Any]) -> None:
        """Start archiving as the rlmm's config says, once the rsm exists (a thread waits for it)."""
        with self._lock:
            self._generation += 1
            generation, old, self._loop = self._generation, self._loop, None
        if old is not None:
            old.close(CLOSE_DEADLINE_S)
        if not archiving["archive.enable"]:
            log.info("archive.enable is false: this agent keeps no audit archive and writes no snapshots")
            return
        rlmm = parse_config(rlmm_config, RLMM_KEYS, "RemoteLogMetadataManager", ignore_prefixes=(CLIENT_PREFIX,))
        client = librdkafka_settings({k[len(CLIENT_PREFIX):]: v for k, v in rlmm_config.items()
                                      if k.startswith(CLIENT_PREFIX) and k != f"{CLIENT_PREFIX}logger"})
        if self._logger is not None:
            client["logger"] = self._logger
        settings = audit_settings(archiving, rlmm["bootstrap.servers"], rlmm["metadata.topic.name"],
                                  rlmm["snapshot.location"], client)
        broker_id = rlmm["broker.id"]
        threading.Thread(target=self._start_when_stored, args=(generation, settings, client, broker_id),
                         name="tierlog-audit-start", daemon=True).start()

    def _start_when_stored(self, generation: int, settings: AuditSettings, client: Mapping[str, Any],
                           broker_id: int) -> None:
        store = self._store()
        while store is None:
            if self._closed.wait(0.5) or generation != self._generation:
                return
            store = self._store()
        loop = audit_loop(store, settings, client, broker_id, self._manager)
        with self._lock:
            if self._closed.is_set() or generation != self._generation:
                return
            self._loop = loop.start()
        log.info("archiving the metadata partitions broker %d leads into %r%s", broker_id, store,
                 "" if settings.snapshots is None else f", with snapshots under {settings.snapshots.location}")

    def progress(self) -> AuditProgress | None:
        with self._lock:
            loop = self._loop
        return None if loop is None else loop.progress()

    def close(self, timeout_s: float = CLOSE_DEADLINE_S) -> None:
        self._closed.set()
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.close(timeout_s)
