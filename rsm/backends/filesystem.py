"""The local filesystem backend: objects are files under `filesystem.root`, keys are relative paths.

The embedded default for one machine and the demo; writes go to a temporary file renamed into place.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rlmm.config import ConfigKey, parse_str
from rlmm.errors import InvalidArgumentError, RemoteResourceNotFoundError, RemoteStorageError
from rsm.backend import ObjectInfo, RangeStream, Source, StorageBackend
from rsm.metrics import Metrics

NAME = "filesystem"
CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "filesystem.root", parse_str, required=True, check=bool, requirement="a non-empty directory path"
    ),
)
_TEMP_MARKER = ".tierlog-tmp-"


def create(config: dict[str, Any], metrics: Metrics) -> StorageBackend:
    return FilesystemBackend(Path(config["filesystem.root"]), metrics)


class FilesystemBackend(StorageBackend):
    def __init__(self, root: Path, metrics: Metrics) -> None:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RemoteStorageError(f"cannot create filesystem.root {str(root)!r}: {exc}") from exc
        self._root = root.resolve()
        self._metrics = metrics

    def describe(self, key: str) -> str:
        return f"directory {str(self._root)!r}, key {key!r}"

    def _path(self, key: str) -> Path:
        # Keys come from rsm.keys, but refuse anything that could leave the root regardless.
        parts = key.split("/")
        if any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
            raise InvalidArgumentError(f"object key {key!r} is not a safe relative path")
        return self._root.joinpath(*parts)

    def local_file(self, key: str) -> Path:
        return self._path(key)

    def _error(self, operation: str, key: str, exc: BaseException) -> RemoteStorageError:
        return RemoteStorageError(f"{operation} failed for {self.describe(key)}: {exc}")

    def put(self, key: str, source: Source) -> None:
        path = self._path(key)
        with self._metrics.time("backend.put") as timer:
            temp = path.with_name(f".{path.name}{_TEMP_MARKER}{uuid.uuid4().hex}")
            try:
                out = self._create_temp(temp)
                with out:
                    if isinstance(source, bytes):
                        out.write(source)
                    else:
                        with open(source, "rb") as src:
                            shutil.copyfileobj(src, out, 1 << 20)
                    timer.bytes = out.tell()
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temp, path)
            except OSError as exc:
                temp.unlink(missing_ok=True)
                raise self._error("put", key, exc) from exc

    @staticmethod
    def _create_temp(temp: Path) -> Any:
        # A concurrent delete may prune the (empty) partition directory between mkdir and open.
        for _ in range(3):
            temp.parent.mkdir(parents=True, exist_ok=True)
            try:
                return open(temp, "xb")
            except FileNotFoundError:
                continue
        return open(temp, "xb")

    def get_range(self, key: str, start: int, end: int | None = None) -> RangeStream:
        path = self._path(key)
        with self._metrics.time("backend.get"):
            try:
                handle = open(path, "rb")  # noqa: SIM115 - the RangeStream owns and closes it
            except FileNotFoundError:
                raise RemoteResourceNotFoundError(f"no object at {self.describe(key)}") from None
            except OSError as exc:
                raise self._error("get", key, exc) from exc
            try:
                size = os.fstat(handle.fileno()).st_size
                if start >= size:
                    raise InvalidArgumentError(
                        f"start position {start} is at or past the end of {self.describe(key)} ({size} bytes)"
                    )
                last = size - 1 if end is None else min(end, size - 1)
                handle.seek(start)
            except BaseException:
                handle.close()
                raise
        return RangeStream(
            handle,
            last - start + 1,
            self.describe(key),
            on_bytes=lambda n: self._metrics.add_bytes("backend.get", n),
            on_error=lambda: self._metrics.add_error("backend.get"),
            translate=lambda exc: self._error("read", key, exc),
        )

    def delete(self, keys: Sequence[str]) -> None:
        paths = [self._path(k) for k in keys]
        with self._metrics.time("backend.delete"):
            for key, path in zip(keys, paths, strict=True):
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    raise self._error("delete", key, exc) from exc
            for parent in {p.parent for p in paths}:
                self._prune_empty(parent)

    def _prune_empty(self, directory: Path) -> None:
        # Deleted partitions should not leave empty directories behind; a concurrent put into the same
        # directory makes rmdir fail, which is fine: put recreates what it needs.
        while directory != self._root and self._root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        with self._metrics.time("backend.list"):
            directory, _, _ = prefix.rpartition("/")
            base = self._path(directory) if directory else self._root
            found: list[ObjectInfo] = []
            for dirpath, _dirs, files in os.walk(base):
                for name in files:
                    if _TEMP_MARKER in name:
                        continue
                    full = Path(dirpath, name)
                    key = full.relative_to(self._root).as_posix()
                    if key.startswith(prefix):
                        try:
                            stat = full.stat()
                            found.append(ObjectInfo(key, stat.st_size, stat.st_mtime_ns // 1_000_000))
                        except FileNotFoundError:
                            continue  # deleted while listing
        return iter(sorted(found, key=lambda info: info.key))


__all__ = ["CONFIG_KEYS", "NAME", "FilesystemBackend", "create"]
