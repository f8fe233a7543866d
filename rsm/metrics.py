"""Counters per operation (requests, bytes, errors by error code, a latency histogram) for the RSM and its storage
backend.

Thread-safe and cheap; `snapshot()` returns plain dicts so the agent can export them as it likes (the agent
turns them into Prometheus counters and histograms; rsm itself depends on no metrics library).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rlmm.errors import RemoteResourceNotFoundError

# Upper bounds in seconds of the latency histogram's buckets (a last, unbounded one follows): from a cached
# index (well under 5 ms) to a large multipart upload (tens of seconds).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)

# Event counter prefix, followed by the IndexType name: fetch_index asked for an index the segment lacks.
ABSENT_INDEX_COUNTER = "fetch_index.absent."

# The codes errors are counted by: S3's error codes an operator acts on, and two for the transport. Any other code
# counts as OTHER, so the metric's label values stay few whatever a server answers.
ERROR_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "NoSuchBucket", "NoSuchKey",
    "NoSuchUpload", "InvalidRange", "PreconditionFailed", "BadDigest", "InvalidDigest", "SlowDown",
    "ServiceUnavailable", "InternalError", "RequestTimeout", "connection", "timeout",
})
OTHER = "other"
# HTTP statuses some calls (HEAD) answer without a code.
_STATUS_CODES = {"403": "AccessDenied", "404": "NoSuchKey", "NotFound": "NoSuchKey", "Forbidden": "AccessDenied",
                 "503": "SlowDown"}
# botocore's transport errors, by class name (rsm.metrics imports no S3 library).
_TRANSPORT_ERRORS = {"EndpointConnectionError": "connection", "ConnectTimeoutError": "connection",
                     "ConnectionClosedError": "connection", "ReadTimeoutError": "timeout"}


def error_code(exc: BaseException) -> str:
    """The code an error is counted by: the S3 error code of the exception or its cause (ERROR_CODES), else OTHER."""
    seen: BaseException | None = exc
    for _ in range(8):  # an exception and a few causes: never a cycle
        if seen is None:
            break
        if isinstance(seen, RemoteResourceNotFoundError):
            return "NoSuchKey"
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            code = _STATUS_CODES.get(code, code)
            return code if code in ERROR_CODES else OTHER
        transport = next((_TRANSPORT_ERRORS[c.__name__] for c in type(seen).__mro__ if c.__name__ in _TRANSPORT_ERRORS),
                         None)
        if transport is not None:
            return transport
        seen = seen.__cause__ or seen.__context__
    return OTHER


@dataclass
class _OperationCounters:
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # error code -> count
    bytes: int = 0
    latency_ms_total: float = 0.0
    latency_ms_max: float = 0.0
    # Requests per bucket of LATENCY_BUCKETS_S (not cumulative); the last entry counts the slower ones.
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))

    def as_dict(self) -> dict[str, Any]:
        cumulative, running = [], 0
        for count in self.latency_counts:
            running += count
            cumulative.append(running)
        return {
            "requests": self.requests,
            "errors": sum(self.errors.values()),
            "error_codes": dict(sorted(self.errors.items())),
            "bytes": self.bytes,
            "latency_ms_total": round(self.latency_ms_total, 3),
            "latency_ms_max": round(self.latency_ms_max, 3),
            # Cumulative counts per upper bound of LATENCY_BUCKETS_S then +Inf, as Prometheus wants them.
            "latency_buckets": cumulative,
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
        """Count one request of `operation`, its latency, and whether it raised (by error_code())."""
        timer = OperationTimer()
        started = time.perf_counter()
        failed: str | None = None
        try:
            yield timer
        except BaseException as exc:
            failed = error_code(exc)
            raise
        finally:
            self.record(operation, time.perf_counter() - started, timer.bytes, failed)

    def record(self, operation: str, seconds: float, nbytes: int = 0, failed: str | None = None) -> None:
        """One request; `failed`: its error code if it failed."""
        millis = seconds * 1000.0
        with self._lock:
            counters = self._operations.setdefault(operation, _OperationCounters())
            counters.requests += 1
            if failed is not None:
                counters.errors[failed] = counters.errors.get(failed, 0) + 1
            counters.bytes += nbytes
            counters.latency_ms_total += millis
            counters.latency_ms_max = max(counters.latency_ms_max, millis)
            counters.latency_counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1

    def add_bytes(self, operation: str, nbytes: int) -> None:
        """Bytes that arrive after the request returned (a streamed body being read)."""
        with self._lock:
            self._operations.setdefault(operation, _OperationCounters()).bytes += nbytes

    def add_error(self, operation: str, code: str = OTHER) -> None:
        """An error that surfaced after the request returned (a stream that broke while being read)."""
        with self._lock:
            errors = self._operations.setdefault(operation, _OperationCounters()).errors
            errors[code] = errors.get(code, 0) + 1

    def increment(self, counter: str, amount: int = 1) -> None:
        with self._lock:
            self._counters[counter] = self._counters.get(counter, 0) + amount

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "operations": {name: c.as_dict() for name, c in sorted(self._operations.items())},
                "counters": dict(sorted(self._counters.items())),
            }


__all__ = [
    "ABSENT_INDEX_COUNTER", "ERROR_CODES", "LATENCY_BUCKETS_S", "OTHER", "Metrics", "OperationTimer", "error_code",
]
