"""Turns the map a broker hands a plugin's configure() into the config of tierlog's rlmm or rsm.

Kafka adds keys of its own to both maps (see KAFKA_SEMANTICS.md); this module alone knows them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlmm.errors import ConfigError

log = logging.getLogger(__name__)

# What Kafka 4.x's RemoteLogManager adds to the RLMM's map (besides rlmm.config.*, prefix stripped):
# broker.id, node.id, log.dir, cluster.id and, when remote.log.metadata.manager.listener.name is set,
# the listener's address and protocol under this prefix (meant for Kafka's built-in manager's clients).
KAFKA_RLMM_CLIENT_PREFIX = "remote.log.metadata.common.client."
KAFKA_RLMM_KEYS = frozenset({"node.id", "log.dir", "cluster.id"})
# And to the RSM's map: broker.id and node.id (tierlog's rsm has no use for either).
KAFKA_RSM_KEYS = frozenset({"broker.id", "node.id"})

# The broker settings naming its log directories, most specific first (Kafka's own precedence).
BROKER_LOG_DIR_KEYS = ("log.dirs", "log.dir")

# tierlog's rlmm passes keys with this prefix to its Kafka clients (rlmm/manager.py).
RLMM_CLIENT_PREFIX = "kafka."
STATE_DIR_NAME = "tierlog-rlmm-state"


def rlmm_config(broker: Mapping[str, Any]) -> dict[str, Any]:
    """The rlmm config for a broker's RLMM configure() map.

    - `bootstrap.servers`: rlmm.config.bootstrap.servers if set, else the listener Kafka passes
      (`remote.log.metadata.common.client.bootstrap.servers`, from
      remote.log.metadata.manager.listener.name),
      whose other `remote.log.metadata.common.client.*` settings become `kafka.*` client settings.
    - `broker.id`: Kafka's own.
    - `state.dir`: rlmm.config.state.dir if set, else `tierlog-rlmm-state` beside the broker's log.dir.
      Not inside it: the broker would take any directory in a log dir for a partition.
    """
    config = {
        k: v
        for k, v in broker.items()
        if k not in KAFKA_RLMM_KEYS and not k.startswith(KAFKA_RLMM_CLIENT_PREFIX)
    }
    if "bootstrap.servers" not in config:
        listener = broker.get(KAFKA_RLMM_CLIENT_PREFIX + "bootstrap.servers")
        if listener is None:
            raise ConfigError(
                "rlmm: bootstrap.servers is not set: set rlmm.config.bootstrap.servers, or "
                "remote.log.metadata.manager.listener.name so the broker passes its listener's address"
            )
        config["bootstrap.servers"] = listener
        # The listener's other client settings (security.protocol, ...) become the rlmm's Kafka client
        # settings, unless rlmm.config.kafka.* already sets them.
        for key, value in broker.items():
            if (
                key.startswith(KAFKA_RLMM_CLIENT_PREFIX)
                and key != KAFKA_RLMM_CLIENT_PREFIX + "bootstrap.servers"
            ):
                config.setdefault(RLMM_CLIENT_PREFIX + key[len(KAFKA_RLMM_CLIENT_PREFIX) :], value)
    if "broker.id" not in config:
        raise ConfigError(
            "rlmm: broker.id is not set (a broker always passes it; set it when testing by hand)"
        )
    if "state.dir" not in config:
        log_dir = broker.get("log.dir")
        if not log_dir:
            raise ConfigError("rlmm: state.dir is not set and the broker passed no log.dir to derive it from")
        config["state.dir"] = str(
            Path(str(log_dir)).resolve().parent / f"{STATE_DIR_NAME}-{config['broker.id']}"
        )
        log.info("rlmm state.dir derived from log.dir: %s", config["state.dir"])
    return config


def rsm_config(broker: Mapping[str, Any]) -> dict[str, Any]:
    """The rsm config for a broker's RSM configure() map: rsm.config.* as given, Kafka's additions removed.

    The broker's log directories (`log.dirs`, or `log.dir`, as the adapter forwards them) become the rsm's
    `log.dirs`: the only directories a copy request may read from. Without them (Kafka passes its RSM none),
    the rsm reads only files inside a Kafka log directory (`log.dirs.detect`).
    """
    config = {k: v for k, v in broker.items() if k not in KAFKA_RSM_KEYS and k not in BROKER_LOG_DIR_KEYS}
    log_dirs = next((broker[k] for k in BROKER_LOG_DIR_KEYS if broker.get(k)), None)
    if log_dirs is None:
        # Kafka hands its RSM no log.dirs: read only files inside a Kafka log directory (meta.properties).
        config.setdefault("log.dirs.detect", "true")
    else:
        config["log.dirs"] = log_dirs
    return config
