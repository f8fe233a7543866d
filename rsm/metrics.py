"""Counters per operation (requests, bytes, errors, latency) for the RSM and its storage backend.

Thread-safe and cheap; `snapshot()` returns plain dicts so the agent can export them as it likes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class _OperationCounters:
    requests: int = 0
    errors: int = 0
    bytes: int = 0
    latency_ms_total: float = 0.0
    latency_ms_max: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "bytes": self.bytes,
            "latency_ms_total": round(self.latency_ms_total, 3),
            "latency_ms_max": round(self.latency_ms_max, 3),
        }


class OperationTimer:
    """Handed out by Metrics.time(); the caller adds the bytes it moved."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._operations: dict[str, _OperationCounters] = {}
        self._counters: dict[str, int] = {}

    @contextmanager
    def time(self, operation: str) -> Iterator[OperationTimer]:
        """Count one request of `operation`, its latency, and whether it raised."""
        timer = OperationTimer()
        started = time.perf_counter()
        failed = False
        try:
            yield timer
        except BaseException:
            failed = True
            raise
        finally:
            self.record(operation, time.perf_counter() - started, timer.bytes, failed)

    def record(self, operation: str, seconds: float, nbytes: int = 0, failed: bool = False) -> None:
        millis = seconds * 1000.0
        with self._lock:
            counters = self._operations.setdefault(operation, _OperationCounters())
            counters.requests += 1
            counters.errors += int(failed)
            counters.bytes += nbytes
            counters.latency_ms_total += millis
            counters.latency_ms_max = max(counters.latency_ms_max, millis)

    def add_bytes(self, operation: str, nbytes: int) -> None:
        """Bytes that arrive after the request returned (a streamed body being read)."""
        with self._lock:
            self._operations.setdefault(operation, _OperationCounters()).bytes += nbytes

    def add_error(self, operation: str) -> None:
        """An error that surfaced after the request returned (a stream that broke while being read)."""
        with self._lock:
            self._operations.setdefault(operation, _OperationCounters()).errors += 1

    def increment(self, counter: str, amount: int = 1) -> None:
        with self._lock:
            self._counters[counter] = self._counters.get(counter, 0) + amount

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "operations": {name: c.as_dict() for name, c in sorted(self._operations.items())},
                "counters": dict(sorted(self._counters.items())),
            }


__all__ = ["Metrics", "OperationTimer"]
