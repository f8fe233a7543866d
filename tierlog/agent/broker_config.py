"""Turns the map a broker hands a plugin's configure() into the config of tierlog's rlmm or rsm, and a broker's
server.properties into those maps (for `tierlog agent --config` and `tierlog config --explain`).

Kafka adds keys of its own to both maps (see KAFKA_SEMANTICS.md); this module alone knows them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
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


# In server.properties: the prefixes of the plugins' keys (Kafka's names and defaults), the listener whose address
# and protocol Kafka passes the RLMM, and the plugin class names that say a plugin is tierlog's.
RLMM_IMPL_PREFIX_KEY = "remote.log.metadata.manager.impl.prefix"
RSM_IMPL_PREFIX_KEY = "remote.log.storage.manager.impl.prefix"
DEFAULT_RLMM_IMPL_PREFIX = "rlmm.config."
DEFAULT_RSM_IMPL_PREFIX = "rsm.config."
LISTENER_NAME_KEY = "remote.log.metadata.manager.listener.name"
RLMM_CLASS_KEY = "remote.log.metadata.manager.class.name"
RSM_CLASS_KEY = "remote.log.storage.manager.class.name"
RLMM_CLASS = "dev.tierlog.kafka.TierlogRemoteLogMetadataManager"
RSM_CLASS = "dev.tierlog.kafka.TierlogRemoteStorageManager"
# The JVM adapter's own keys (jvm/.../AgentSettings.java): it reads them and forwards the rest.
ADAPTER_PREFIX = "agent."
# The agent's own flat keys (`python -m tierlog.agent.server --config rlmm.KEY=VALUE`), also accepted in a file.
AGENT_PREFIXES = {"rlmm": "rlmm.", "rsm": "rsm."}
# Kafka's default map of listener names to security protocols (a listener named after a protocol uses it).
SECURITY_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})


@dataclass(frozen=True)
class PluginConfigs:
    """What a broker with a given server.properties hands its two plugins' configure(), adapter keys aside.

    `rlmm` / `rsm` are None for a plugin the file does not configure as tierlog's; `sources` says, for each
    "rlmm.KEY" / "rsm.KEY" of the maps, which server.properties setting it came from.
    """

    rlmm: dict[str, str] | None
    rsm: dict[str, str] | None
    adapter: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def agent_config(self) -> dict[str, str]:
        """The agent's flat config (`rlmm.KEY`, `rsm.KEY`): its components are created from it at start."""
        return {
            f"{AGENT_PREFIXES[name]}{key}": value
            for name, found in (("rlmm", self.rlmm), ("rsm", self.rsm)) if found is not None
            for key, value in found.items()
        }


def listener_client_settings(properties: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """The client settings Kafka passes its RLMM for the listener named in LISTENER_NAME_KEY (advertised address
    first, as Kafka registers it; an empty host means this host): key -> (value, the setting it came from)."""
    name = properties.get(LISTENER_NAME_KEY, "").strip()
    if not name:
        return {}
    for key in ("advertised.listeners", "listeners"):
        for listener in (properties.get(key) or "").split(","):
            listener_name, sep, address = listener.strip().partition("://")
            if not sep or listener_name != name:
                continue
            host, _, port = address.rpartition(":")
            source = f"{key} (the {name} listener of {LISTENER_NAME_KEY})"
            found = {"bootstrap.servers": (f"{host or 'localhost'}:{port}", source)}
            protocol = _security_protocol(properties, name)
            if protocol is not None:
                found["security.protocol"] = protocol
            return {KAFKA_RLMM_CLIENT_PREFIX + k: v for k, v in found.items()}
    return {}


def _security_protocol(properties: Mapping[str, str], listener: str) -> tuple[str, str] | None:
    for entry in (properties.get("listener.security.protocol.map") or "").split(","):
        name, sep, protocol = entry.strip().partition(":")
        if sep and name == listener:
            return protocol.strip(), f"listener.security.protocol.map (the {listener} listener)"
    if listener in SECURITY_PROTOCOLS:
        return listener, f"{LISTENER_NAME_KEY} (a listener named after its protocol)"
    return None


def plugin_configs(properties: Mapping[str, str]) -> PluginConfigs:
    """The configure() maps a broker with these `properties` (its server.properties) hands tierlog's plugins.

    As Kafka 4.x builds them: the plugin's prefixed keys (`rlmm.config.*`, `rsm.config.*`, or the prefixes the
    file sets), prefix removed, over the RLMM's listener settings; then the broker's own `broker.id` / `node.id`
    and, for the RLMM, its first log dir as `log.dir`. The agent's short prefixes (`rlmm.`, `rsm.`) are read
    too, so one file serves the agent run by hand as well. `agent.*` keys go to `adapter`.
    """
    prefixes = {
        "rlmm": properties.get(RLMM_IMPL_PREFIX_KEY) or DEFAULT_RLMM_IMPL_PREFIX,
        "rsm": properties.get(RSM_IMPL_PREFIX_KEY) or DEFAULT_RSM_IMPL_PREFIX,
    }
    maps: dict[str, dict[str, str]] = {"rlmm": {}, "rsm": {}}
    sources: dict[str, str] = {}
    adapter: dict[str, str] = {}
    for key, (value, source) in listener_client_settings(properties).items():
        maps["rlmm"][key] = value
        sources[f"rlmm.{key}"] = source
    configured = {name: False for name in maps}
    for key, value in properties.items():
        for name in maps:
            prefix = next((p for p in (prefixes[name], AGENT_PREFIXES[name]) if key.startswith(p)), None)
            if prefix is None:
                continue
            configured[name] = True
            own = key[len(prefix):]
            if own.startswith(ADAPTER_PREFIX):
                adapter.setdefault(own, value)
            else:
                maps[name][own] = value
                sources[f"{name}.{own}"] = key
            break
    # Kafka's own additions, after the plugin's keys (they win, as in Kafka): the broker's id (KRaft: node.id)
    # to both, its first log dir to the RLMM.
    node_key = next((k for k in ("node.id", "broker.id") if properties.get(k)), None)
    if node_key is not None:
        for name in maps:
            for key in ("broker.id", "node.id"):
                maps[name][key] = properties[node_key]
                sources[f"{name}.{key}"] = node_key
    log_dirs = properties.get("log.dirs") or properties.get("log.dir")
    if log_dirs:
        maps["rlmm"]["log.dir"] = log_dirs.split(",")[0].strip()
        sources["rlmm.log.dir"] = "log.dirs" if properties.get("log.dirs") else "log.dir"
    hosted = {
        "rlmm": configured["rlmm"] or properties.get(RLMM_CLASS_KEY, "").strip() == RLMM_CLASS,
        "rsm": configured["rsm"] or properties.get(RSM_CLASS_KEY, "").strip() == RSM_CLASS,
    }
    return PluginConfigs(
        rlmm=maps["rlmm"] if hosted["rlmm"] else None,
        rsm=maps["rsm"] if hosted["rsm"] else None,
        adapter=adapter,
        sources=sources,
    )


def rlmm_derived_from(key: str) -> str | None:
    """The configure() map key that rlmm_config derived an rlmm key from, when it was not given as such."""
    if key == "bootstrap.servers":
        return KAFKA_RLMM_CLIENT_PREFIX + "bootstrap.servers"
    if key.startswith(RLMM_CLIENT_PREFIX):
        return KAFKA_RLMM_CLIENT_PREFIX + key[len(RLMM_CLIENT_PREFIX):]
    if key == "state.dir":
        return "log.dir"
    return None


def default_socket_path(node: str | None) -> Path:
    """The socket the JVM adapter looks for when agent.socket.path is unset (AgentSettings.stateDir())."""
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    base = Path(state) if state else Path.home() / ".local" / "state"
    return base / "tierlog" / f"agent-{node or '0'}.sock"
