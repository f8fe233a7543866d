"""What every `tierlog` command shares: exit codes, the error a person can act on, and the settings
(config file, `-o` overrides, the services environment) with the stores and Spark session they open.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

EXIT_OK = 0


EXIT_PROBLEM = 1


EXIT_USAGE = 2


EXIT_UNAVAILABLE = 3


DEFAULT_METADATA_TOPIC = "__tierlog_metadata"


SERVICES_ENV = Path(".dev") / "services.env"


class CommandError(Exception):
    """A failure the user can act on: the message says what is wrong and what to do."""

    def __init__(self, message: str, exit_code: int = EXIT_UNAVAILABLE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def read_properties(path: Path) -> dict[str, str]:
    """A Kafka-style properties file: `key=value` lines, `#` and `!` comments."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CommandError(f"cannot read config file {path}: {exc.strerror}", EXIT_USAGE) from exc
    config: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            raise CommandError(f"{path}:{number}: expected key=value, got {stripped!r}", EXIT_USAGE)
        config[key.strip()] = value.strip()
    return config


def services_env() -> dict[str, str]:
    """KAFKA_BOOTSTRAP / S3_* from the environment, else from .dev/services.env (written by dev/services)."""
    found: dict[str, str] = {}
    if SERVICES_ENV.is_file():
        for line in SERVICES_ENV.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                found[key.strip()] = value.strip()
    found.update({k: v for k, v in os.environ.items() if k.startswith(("KAFKA_", "S3_"))})
    return found


class Settings:
    """Every command's view of the config: the file, `-o` overrides, then the services environment."""

    def __init__(self, config: Mapping[str, str]) -> None:
        self.config = dict(config)
        self.env = services_env()

    def get(self, name: str) -> str | None:
        # A broker-style file may prefix the component: accept rlmm.<name> and rsm.<name> too.
        for key in (name, f"rlmm.{name}", f"rsm.{name}"):
            if self.config.get(key):
                return self.config[key]
        return None

    def bootstrap(self) -> str:
        value = self.get("bootstrap.servers") or self.env.get("KAFKA_BOOTSTRAP")
        if not value:
            raise CommandError(
                "no Kafka to talk to: pass -o bootstrap.servers=HOST:PORT (or a --config file with it), "
                "or set KAFKA_BOOTSTRAP (`dev/services up` writes it to .dev/services.env)",
                EXIT_USAGE,
            )
        return value

    def metadata_topic(self) -> str:
        return self.get("metadata.topic.name") or DEFAULT_METADATA_TOPIC

    def state_dir(self, given: str | None) -> Path:
        value = given or self.get("state.dir")
        if not value:
            raise CommandError("no state dir: pass --state-dir DIR or -o state.dir=DIR", EXIT_USAGE)
        return Path(value)

    def s3(self) -> Any:
        from tierlog.pipeline.session import S3Settings

        return S3Settings(
            endpoint=self.get("s3.endpoint.url") or self.env.get("S3_ENDPOINT"),
            access_key=self.get("s3.access.key.id") or self.env.get("S3_ACCESS_KEY"),
            secret_key=self.get("s3.secret.access.key") or self.env.get("S3_SECRET_KEY"),
            region=self.get("s3.region") or self.env.get("S3_REGION") or "us-east-1",
        )

    def bucket_location(self, given: str | None) -> str:
        """Where segments live: --bucket, else the rsm storage config, else the dev services' bucket."""
        if given:
            return given
        if self.get("storage.backend") == "filesystem" and self.get("filesystem.root"):
            return str(self.get("filesystem.root"))
        bucket = self.get("s3.bucket") or self.env.get("S3_BUCKET")
        if not bucket:
            raise CommandError(
                "no bucket: pass --bucket s3://BUCKET[/PREFIX] (or a directory), or -o s3.bucket=BUCKET",
                EXIT_USAGE,
            )
        prefix = (self.get("s3.prefix") or "").strip("/")
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"

    def archive_location(self, given: str | None) -> str:
        """Where the audit archive lives: --archive, archive.location, else the segments' bucket."""
        return given or self.get("archive.location") or self.bucket_location(None)

    def node_config(self, state_dir: Path) -> dict[str, Any]:
        """An RLMM config for a node working on `state_dir`, from the rlmm keys of the config."""
        config: dict[str, Any] = {
            k.removeprefix("rlmm."): v for k, v in self.config.items()
            if not k.startswith(("rsm.", "archive.", "s3.", "storage.", "filesystem."))
        }
        config.update({"bootstrap.servers": self.bootstrap(), "state.dir": str(state_dir)})
        config.setdefault("broker.id", "-1")
        config.setdefault("metadata.topic.name", self.metadata_topic())
        return config


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
    spark = get_spark("tierlog-cli", master=args.master, s3=settings.s3() if needs_s3 else None)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextmanager
def archive_errors() -> Iterator[None]:
    from tierlog.pipeline.archive import ArchiveNotFoundError

    try:
        yield
    except ArchiveNotFoundError as exc:
        raise CommandError(str(exc)) from exc
