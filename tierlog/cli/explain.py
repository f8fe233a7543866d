"""`tierlog config [--explain]`: the settings every other command would use, and where each came from; for a
broker's server.properties, also the config the agent's rlmm and rsm get from it (the one mapping of
tierlog/agent/broker_config.py, which `tierlog agent --config` and the broker's plugins use too)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from tierlog.cli.common import EXIT_OK, CommandError, Setting, Settings
from tierlog.cli.output import emit, print_table

# Shown as set or not, never printed: the value is a credential.
SECRET_KEYS = frozenset({"s3.secret.access.key"})
# The same for the agent's keys: S3 secrets and the Kafka clients' passwords, JAAS lines and private keys.
_SECRET_PARTS = re.compile(r"secret|password|jaas|keystore\.key")


def _entry(name: str, found: Setting | None, error: str | None = None) -> dict[str, Any]:
    if found is None:
        return {"setting": name, "value": None, "source": error or "not set"}
    value = "(set)" if name in SECRET_KEYS else found.value
    return {"setting": name, "value": value, "source": found.source}


def _try(name: str, get: Any) -> dict[str, Any]:
    try:
        return _entry(name, get())
    except CommandError as exc:
        return _entry(name, None, f"not set: {exc}")


def agent_entries(settings: Settings) -> list[dict[str, Any]]:
    """The config of each component the agent would create from this file, key by key, with its origin."""
    from rlmm.errors import ConfigError
    from tierlog.agent.broker_config import plugin_configs, rlmm_config, rlmm_derived_from, rsm_config

    plugins = plugin_configs(settings.config)

    def source(component: str, key: str) -> str:
        origin = plugins.sources.get(f"{component}.{key}")
        derived = None if origin or component != "rlmm" else plugins.sources.get(f"rlmm.{rlmm_derived_from(key)}")
        if origin is None and derived is None:
            return "the agent's default"
        setting = origin or derived
        where = f"-o {setting}" if setting in settings.overrides else f"{settings.config_file}: {setting}"
        return where if origin else f"derived from {where}"

    entries: list[dict[str, Any]] = []
    for component, given, translate in (("rlmm", plugins.rlmm, rlmm_config), ("rsm", plugins.rsm, rsm_config)):
        if given is None:
            continue
        try:
            config = translate(given)
        except ConfigError as exc:
            entries.append({"setting": component, "value": None, "source": f"the agent would refuse it: {exc}"})
            continue
        for key, value in sorted(config.items()):
            shown = "(set)" if _SECRET_PARTS.search(key) else value
            entries.append({"setting": f"{component}.{key}", "value": shown, "source": source(component, key)})
    return entries


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    entries = [
        _try("bootstrap.servers", settings.bootstrap_setting),
        _entry("metadata.topic.name", settings.metadata_topic_setting()),
        _entry("state.dir", settings.state_dir_setting()),
        _try("bucket", lambda: settings.bucket_setting(None)),
        _entry("archive.location", settings.lookup("archive.location")),
        *(_entry(name, found) for name, found in settings.s3_settings().items()),
        _entry("development mode", Setting("on", "--dev or TIERLOG_DEV=1") if settings.dev else None),
    ]
    agent = agent_entries(settings)

    def human() -> None:
        columns = ["setting", "value", "source"] if args.explain else ["setting", "value"]
        if settings.config_file is not None:
            print(f"config file: {settings.config_file.resolve()}\n")
        print_table(entries, columns)
        if agent:
            print("\nthe agent's components (tierlog agent --config; a broker's plugins get the same):")
            print_table(agent, columns)

    emit(args, {"config_file": str(settings.config_file) if settings.config_file else None,
                "settings": entries, "agent": agent}, human)
    return EXIT_OK
