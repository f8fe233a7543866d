"""Object-store emulators on 127.0.0.1 for the rsm backend tests: Azurite (Azure Blob, from npm) and
gcp-storage-emulator (Google Cloud Storage, from PyPI), each one process on a free port, stopped by PID.

Both keep their objects in memory; `make azurite` (run by `make setup`) installs Azurite under .dev/node.
"""

from __future__ import annotations

import abc
import http.client
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from dev.process import LOOPBACK, free_ports, stop_pid, tail, wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
AZURITE_BIN = REPO_ROOT / ".dev" / "node" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's documented development account (a public, well-known key, not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
DEFAULT_BUCKET = "tierlog"


class EmulatorError(RuntimeError):
    """An emulator is missing, exited while starting, or did not answer in time."""


class _Emulator(abc.ABC):
    """One emulator process: started with its log in `base_dir`, ready when it answers HTTP, stopped by PID."""

    NAME = ""

    def __init__(self, base_dir: Path, start_timeout: float = 60.0, stop_timeout: float = 10.0) -> None:
        self.base_dir = base_dir
        self.port = free_ports(1)[0]
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_file(self) -> Path:
        return self.base_dir / f"{self.NAME}.log"

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The emulator's command line, serving on 127.0.0.1:self.port."""

    def start(self) -> Self:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        command = self.command()
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.base_dir,
                start_new_session=True,
            )
        try:
            wait_until(
                self._answers, timeout=self.start_timeout, interval=0.1,
                description=f"{self.NAME} on {LOOPBACK}:{self.port}", fatal=(EmulatorError,),
            )
        except BaseException as exc:
            self.stop()
            if isinstance(exc, TimeoutError):
                raise EmulatorError(f"{exc}\nlog {self.log_file}:\n{tail(self.log_file)}") from None
            raise
        return self

    def _answers(self) -> bool:
        if self._process is None or self._process.poll() is not None:
            code = None if self._process is None else self._process.returncode
            raise EmulatorError(f"{self.NAME} exited (code {code}) while starting; log {self.log_file}:\n"
                                f"{tail(self.log_file)}")
        connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=1.0)
        try:
            connection.request("GET", "/")
            connection.getresponse().read()  # any answer, even an error status, means it serves requests
        finally:
            connection.close()
        return True

    def stop(self) -> None:
        if self._process is not None:
            stop_pid(self._process.pid, timeout=self.stop_timeout)
            self._process = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


@dataclass(frozen=True)
class AzureEndpoint:
    url: str
    account: str
    key: str
    container: str

    def rsm_config(self, prefix: str, **extra: Any) -> dict[str, Any]:
        """An rsm config storing under `prefix` in this emulator's container."""
        return {"storage.backend": "azure", "azure.endpoint.url": self.url, "azure.account.name": self.account,
                "azure.account.key": self.key, "azure.container.name": self.container, "azure.prefix": prefix,
                **extra}


class Azurite(_Emulator):
    """Azurite's Blob service, in memory, with the development account; `container` is created at start."""

    NAME = "azurite"

    def __init__(self, base_dir: Path, container: str = DEFAULT_BUCKET, **kwargs: float) -> None:
        super().__init__(base_dir, **kwargs)
        self.endpoint = AzureEndpoint(f"http://{LOOPBACK}:{self.port}/{AZURITE_ACCOUNT}", AZURITE_ACCOUNT,
                                      AZURITE_KEY, container)

    def command(self) -> list[str]:
        if not AZURITE_BIN.exists():
            raise EmulatorError(f"Azurite is not installed at {AZURITE_BIN}; run `make azurite` (make setup does)")
        return [
            str(AZURITE_BIN), "--blobHost", LOOPBACK, "--blobPort", str(self.port),
            "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent",
        ]

    def start(self) -> Self:
        super().start()
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient(self.endpoint.url, credential={"account_name": AZURITE_ACCOUNT,
                                                              "account_key": AZURITE_KEY}) as service:
            service.create_container(self.endpoint.container)
        return self


@dataclass(frozen=True)
class GcsEndpoint:
    url: str
    bucket: str

    def rsm_config(self, prefix: str, **extra: Any) -> dict[str, Any]:
        """An rsm config storing under `prefix` in this emulator's bucket."""
        return {"storage.backend": "gcs", "gcs.endpoint.url": self.url, "gcs.bucket.name": self.bucket,
                "gcs.prefix": prefix, **extra}


class GcsEmulator(_Emulator):
    """gcp-storage-emulator (JSON API: resumable uploads, ranged reads), in memory, with `bucket` created."""

    NAME = "gcp-storage-emulator"

    def __init__(self, base_dir: Path, bucket: str = DEFAULT_BUCKET, **kwargs: float) -> None:
        super().__init__(base_dir, **kwargs)
        self.endpoint = GcsEndpoint(f"http://{LOOPBACK}:{self.port}", bucket)

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "gcp_storage_emulator", "start", "--host", LOOPBACK, "--port", str(self.port),
            "--in-memory", "--default-bucket", self.endpoint.bucket, "--quiet",
        ]


__all__ = ["AZURITE_ACCOUNT", "AZURITE_KEY", "AzureEndpoint", "Azurite", "EmulatorError", "GcsEmulator",
           "GcsEndpoint"]
