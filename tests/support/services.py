"""Finding the shared dev services (dev/services) from tests: the env file, or variables already set.

Tests, the demo and benchmarks all locate Kafka and S3 through the same KAFKA_BOOTSTRAP / S3_* names.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dev.env import REPO_ROOT, env_file, read_env_file, state_dir
from dev.process import port_is_open
from dev.s3 import DEFAULT_REGION, S3Endpoint

SERVICES_SCRIPT = REPO_ROOT / "dev" / "services"
REQUIRED_KEYS = ("KAFKA_BOOTSTRAP", "S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY", "S3_BUCKET")


@dataclass(frozen=True)
class Services:
    """The running dev services as tests see them."""

    kafka_bootstrap: str
    s3: S3Endpoint

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Services:
        missing = [key for key in REQUIRED_KEYS if not env.get(key)]
        if missing:
            raise KeyError(f"dev services settings lack {missing}; run `dev/services up`")
        return cls(
            kafka_bootstrap=env["KAFKA_BOOTSTRAP"],
            s3=S3Endpoint(
                endpoint=env["S3_ENDPOINT"],
                access_key=env["S3_ACCESS_KEY"],
                secret_key=env["S3_SECRET_KEY"],
                bucket=env["S3_BUCKET"],
                region=env.get("S3_REGION") or DEFAULT_REGION,
            ),
        )

    def as_env(self) -> dict[str, str]:
        return {
            "KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "S3_ENDPOINT": self.s3.endpoint,
            "S3_ACCESS_KEY": self.s3.access_key,
            "S3_SECRET_KEY": self.s3.secret_key,
            "S3_BUCKET": self.s3.bucket,
            "S3_REGION": self.s3.region,
        }

    def reachable(self) -> bool:
        """True when the first broker and the S3 port accept connections."""
        host, _, port = self.kafka_bootstrap.split(",")[0].rpartition(":")
        s3_host, _, s3_port = self.s3.endpoint.removeprefix("http://").rstrip("/").rpartition(":")
        return port_is_open(int(port), host) and port_is_open(int(s3_port), s3_host)


def configured_services() -> Services | None:
    """Services named by the environment (all of KAFKA_BOOTSTRAP and S3_* set) or by the env file."""
    if all(os.environ.get(key) for key in REQUIRED_KEYS):
        return Services.from_env(os.environ)
    if env_file().exists():
        return Services.from_env(read_env_file(env_file()))
    return None


def run_services_command(*args: str) -> None:
    """Run `dev/services <args>`, raising with its output when it fails."""
    result = subprocess.run(
        [sys.executable, str(SERVICES_SCRIPT), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"`dev/services {' '.join(args)}` failed (exit {result.returncode}):\n"
            f"{result.stdout}{result.stderr}"
        )


def broker_log_dir(bootstrap: str) -> Path:
    """The first of `log.dirs` of the dev-services broker serving `bootstrap`, read from its server.properties."""
    base = state_dir()
    for properties in sorted(base.glob("kafka/node-*/server.properties")):
        settings = dict(line.split("=", 1) for line in properties.read_text(encoding="utf-8").splitlines()
                        if "=" in line)
        if bootstrap in settings.get("listeners", ""):
            return Path(settings["log.dirs"].split(",")[0])
    raise AssertionError(f"cannot find the log directory of the broker at {bootstrap} under {base}/kafka")
