"""What every `tierlog` command shares: exit codes, the error a person can act on, and the settings
(a properties file, a broker's `server.properties` included, `-o` overrides, and in development only the
services environment) with where each came from, and the stores, Kafka clients and Spark session they open.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierlog.agent import broker_config
from tierlog.errors import TierlogError

EXIT_OK = 0


EXIT_PROBLEM = 1


EXIT_USAGE = 2


EXIT_UNAVAILABLE = 3


DEFAULT_METADATA_TOPIC = "__tierlog_metadata"


# How long a command waits on a service that does not answer (a wrong address, a dead broker).
DEFAULT_TIMEOUT_S = 30.0


SERVICES_ENV = Path(".dev") / "services.env"


# Development mode (reading .dev/services.env and KAFKA_*/S3_* variables) is on with --dev or this set to 1.
DEV_ENV_VAR = "TIERLOG_DEV"


# A broker hands its plugins the keys under these prefixes; server.properties may rename them.
RLMM_PREFIX_KEY = broker_config.RLMM_IMPL_PREFIX_KEY
RSM_PREFIX_KEY = broker_config.RSM_IMPL_PREFIX_KEY
DEFAULT_RLMM_PREFIX = broker_config.DEFAULT_RLMM_IMPL_PREFIX
DEFAULT_RSM_PREFIX = broker_config.DEFAULT_RSM_IMPL_PREFIX
# tierlog's own short prefixes, accepted in tierlog properties files.
SHORT_PREFIXES = ("rlmm.", "rsm.")


# librdkafka's own log lines go to this logger: hidden unless -v (main.py sets its level).
KAFKA_LOGGER = "tierlog.librdkafka"


class CommandError(TierlogError):
    """A failure the user can act on: the message says what is wrong and what to do."""

    def __init__(self, message: str, exit_code: int = EXIT_UNAVAILABLE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting's value and where it came from (file and key, `-o`, or a development variable)."""

    value: str
    source: str


def read_properties(path: Path) -> dict[str, str]:
    """A Java properties file, as Kafka reads server.properties (`key=value`, `key: value`, `\\`
    continuations, escapes, `\\uXXXX`, `#` and `!` comments)."""
    import javaproperties

    try:
        with path.open(encoding="latin-1") as handle:  # java.util.Properties.load(InputStream) reads ISO 8859-1
            return dict(javaproperties.load(handle))
    except OSError as exc:
        raise CommandError(f"cannot read config file {path}: {exc.strerror}", EXIT_USAGE) from exc
    except ValueError as exc:  # javaproperties rejects a malformed \\u escape
        raise CommandError(f"config file {path} is not a valid properties file: {exc}", EXIT_USAGE) from exc


def dev_mode(flag: bool) -> bool:
    return flag or os.environ.get(DEV_ENV_VAR) == "1"


def services_env() -> dict[str, Setting]:
    """Development only: KAFKA_BOOTSTRAP / S3_* from the environment, else from .dev/services.env."""
    found: dict[str, Setting] = {}
    if SERVICES_ENV.is_file():
        for line in SERVICES_ENV.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                found[key.strip()] = Setting(value.strip(), f"{SERVICES_ENV.resolve()}: {key.strip()}")
    found.update({k: Setting(v, f"environment: {k}") for k, v in os.environ.items()
                  if k.startswith(("KAFKA_", "S3_"))})
    return found


class Settings:
    """Every command's view of the config: `-o` overrides, then the file (a component's prefixed key before
    the plain one), then, in development only, the services environment."""

    def __init__(
        self,
        config: Mapping[str, str],
        overrides: Mapping[str, str] | None = None,
        config_file: Path | None = None,
        dev: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.file_config = dict(config)
        self.overrides = dict(overrides or {})
        self.config = {**self.file_config, **self.overrides}
        self.config_file = config_file
        self.dev = dev
        self.env = services_env() if dev else {}
        self.timeout_s = timeout_s
        self._defaults: dict[str, Setting] = {}

    def _prefixes(self) -> tuple[str, ...]:
        rlmm = self.config.get(RLMM_PREFIX_KEY) or DEFAULT_RLMM_PREFIX
        rsm = self.config.get(RSM_PREFIX_KEY) or DEFAULT_RSM_PREFIX
        return tuple(dict.fromkeys((rlmm, rsm, *SHORT_PREFIXES)))

    def lookup(self, name: str) -> Setting | None:
        for source, config in (("-o", self.overrides), (str(self.config_file), self.file_config)):
            for key in (*(p + name for p in self._prefixes()), name):
                if config.get(key):
                    return Setting(config[key], f"{source}: {key}" if source != "-o" else f"-o {key}")
        return self._defaults.get(name)

    def get(self, name: str) -> str | None:
        found = self.lookup(name)
        return found.value if found else None

    def set_default(self, name: str, value: str, source: str) -> None:
        """A value found along the way (e.g. a snapshot's topic) that the config may still override."""
        self._defaults[name] = Setting(value, source)

    def _dev(self, variable: str) -> Setting | None:
        return self.env.get(variable)

    def _lookup_or_dev(self, name: str, variable: str) -> Setting | None:
        return self.lookup(name) or self._dev(variable)

    def _listener_address(self) -> Setting | None:
        """A broker's file without rlmm.config.bootstrap.servers: the address of the listener it names in
        remote.log.metadata.manager.listener.name, as the broker hands it to its RLMM (agent/broker_config.py)."""
        found = broker_config.listener_client_settings(self.file_config).get(
            broker_config.KAFKA_RLMM_CLIENT_PREFIX + "bootstrap.servers")
        return None if found is None else Setting(found[0], f"{self.config_file}: {found[1]}")

    def bootstrap_setting(self) -> Setting:
        found = self.lookup("bootstrap.servers") or self._listener_address() or self._dev("KAFKA_BOOTSTRAP")
        if found is None:
            raise CommandError(
                "no Kafka to talk to: pass -o bootstrap.servers=HOST:PORT or --config FILE (a broker's "
                "server.properties with rlmm.config.bootstrap.servers works); in development, --dev "
                "reads KAFKA_BOOTSTRAP (`dev/services up` writes it to .dev/services.env)",
                EXIT_USAGE,
            )
        return found

    def bootstrap(self) -> str:
        return self.bootstrap_setting().value

    def metadata_topic_setting(self) -> Setting:
        return self.lookup("metadata.topic.name") or Setting(DEFAULT_METADATA_TOPIC, "default")

    def metadata_topic(self) -> str:
        return self.metadata_topic_setting().value

    def state_dir_setting(self) -> Setting | None:
        found = self.lookup("state.dir")
        if found is not None:
            return found
        # A broker's server.properties: the agent puts the state beside the broker's first log dir.
        log_dirs = self.file_config.get("log.dirs") or self.file_config.get("log.dir")
        node = self.file_config.get("node.id") or self.file_config.get("broker.id")
        if log_dirs and node:
            first = log_dirs.split(",")[0].strip()
            derived = broker_config.rlmm_config(
                {"bootstrap.servers": "-", "broker.id": node, "log.dir": first})["state.dir"]
            return Setting(derived, f"{self.config_file}: log.dirs and node.id (the agent's default)")
        return None

    def state_dir(self, given: str | None) -> Path:
        if given:
            return Path(given)
        found = self.state_dir_setting()
        if found is None:
            raise CommandError("no state dir: pass --state-dir DIR or -o state.dir=DIR", EXIT_USAGE)
        return Path(found.value)

    def s3_settings(self) -> dict[str, Setting | None]:
        return {
            "s3.endpoint.url": self._lookup_or_dev("s3.endpoint.url", "S3_ENDPOINT"),
            "s3.access.key.id": self._lookup_or_dev("s3.access.key.id", "S3_ACCESS_KEY"),
            "s3.secret.access.key": self._lookup_or_dev("s3.secret.access.key", "S3_SECRET_KEY"),
            "s3.region": self._lookup_or_dev("s3.region", "S3_REGION"),
        }

    def s3(self) -> Any:
        from tierlog.pipeline.session import S3Settings

        found = {k: (v.value if v else None) for k, v in self.s3_settings().items()}
        return S3Settings(
            endpoint=found["s3.endpoint.url"],
            access_key=found["s3.access.key.id"],
            secret_key=found["s3.secret.access.key"],
            region=found["s3.region"] or "us-east-1",
        )

    def bucket_setting(self, given: str | None) -> Setting:
        """Where segments live: --bucket, else the rsm storage config, else (development) the services' bucket."""
        if given:
            return Setting(given, "--bucket")
        backend, root = self.lookup("storage.backend"), self.lookup("filesystem.root")
        if backend and backend.value == "filesystem" and root:
            return root
        bucket = self._lookup_or_dev("s3.bucket", "S3_BUCKET")
        if not bucket:
            raise CommandError(
                "no bucket: pass --bucket s3://BUCKET[/PREFIX] (or a directory), or -o s3.bucket=BUCKET",
                EXIT_USAGE,
            )
        prefix = (self.get("s3.prefix") or "").strip("/")
        return Setting(f"s3://{bucket.value}/{prefix}" if prefix else f"s3://{bucket.value}", bucket.source)

    def bucket_location(self, given: str | None) -> str:
        return self.bucket_setting(given).value

    def archive_location(self, given: str | None) -> str:
        """Where the audit archive lives: --archive, archive.location, else the segments' bucket."""
        return given or self.get("archive.location") or self.bucket_location(None)

    def node_config(self, state_dir: Path) -> dict[str, Any]:
        """An RLMM config for a node working on `state_dir`: the config's rlmm keys, prefixes removed."""
        from rlmm.manager import CLIENT_PREFIX, CONFIG_KEYS

        names = {key.name for key in CONFIG_KEYS}
        rlmm_prefixes = (self.config.get(RLMM_PREFIX_KEY) or DEFAULT_RLMM_PREFIX, "rlmm.")
        rsm_prefixes = (self.config.get(RSM_PREFIX_KEY) or DEFAULT_RSM_PREFIX, "rsm.")
        config: dict[str, Any] = {}
        for source in (self.file_config, self.overrides):
            for key, value in source.items():
                if key.startswith(rsm_prefixes):
                    continue
                name = next((key.removeprefix(p) for p in rlmm_prefixes if key.startswith(p)), key)
                # A broker's file holds many keys of its own; only the rlmm's go to the node.
                if name in names or name.startswith(CLIENT_PREFIX):
                    config[name] = value
        config.update({"bootstrap.servers": self.bootstrap(), "state.dir": str(state_dir)})
        config.setdefault("broker.id", "-1")
        config["metadata.topic.name"] = self.metadata_topic()
        config["kafka.logger"] = logging.getLogger(KAFKA_LOGGER)
        return config

    def kafka_client(self, **extra: Any) -> dict[str, Any]:
        """A confluent_kafka client config: the node's security settings (`kafka.*`, Java names translated as
        the manager translates them), its log lines through KAFKA_LOGGER, its waits bounded."""
        from rlmm.client_security import librdkafka_settings
        from rlmm.errors import ConfigError
        from rlmm.manager import CLIENT_PREFIX

        given = {
            key.removeprefix(CLIENT_PREFIX): value
            for key, value in self.node_config(Path(".")).items()
            if key.startswith(CLIENT_PREFIX) and key != f"{CLIENT_PREFIX}logger"
        }
        try:
            security = librdkafka_settings(given)
        except ConfigError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        timeout_ms = int(self.timeout_s * 1000)
        return {
            **security,
            "bootstrap.servers": self.bootstrap(),
            "logger": logging.getLogger(KAFKA_LOGGER),
            "socket.connection.setup.timeout.ms": timeout_ms,
            **extra,
        }


def open_location(location: str, settings: Settings) -> Any:
    from tierlog.pipeline.locations import open_store

    try:
        return open_store(location, settings.s3())
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc


def spark_session(settings: Settings, args: argparse.Namespace, *locations: str) -> Any:
    """A session for the job; with s3a (and its jars) only when one of `locations` is in S3."""
    from tierlog.pipeline.locations import is_s3
    from tierlog.pipeline.session import get_spark

    needs_s3 = any(is_s3(location) for location in locations)
    try:
        return get_spark("tierlog-cli", master=args.master, s3=settings.s3() if needs_s3 else None,
                         quiet=not args.verbose)
    except FileNotFoundError as exc:  # a configured jars directory lacks a package
        raise CommandError(str(exc), EXIT_USAGE) from exc


@contextmanager
def archive_errors() -> Iterator[None]:
    from tierlog.pipeline.archive_files import ArchiveNotFoundError

    try:
        yield
    except ArchiveNotFoundError as exc:
        raise CommandError(str(exc)) from exc
