"""The upload rate limit (`upload.rate.limit.bytes.per.second`): one token bucket every concurrent upload of an rsm
draws from, charged as the segment's bytes are read from disk for the upload, so tiering a backlog cannot take
all of a broker's network and disk.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Aiven's floor for the same key: below 1 MiB/s a segment of a usual size would take hours to tier.
MIN_BYTES_PER_SECOND = 1 << 20
# Metrics counter (tierlog_rsm_events{counter=...}): milliseconds uploads waited for the limit, summed over uploads.
THROTTLED_MS = "upload.throttled_ms"


class UploadRateLimiter:
    """A token bucket of `bytes_per_second`, holding at most one second's worth (the largest burst).

    A caller takes what it needs at once, even more than the bucket holds, and then sleeps off its debt: concurrent
    callers queue behind each other's debts, so together they never exceed the rate over any second after the
    first. Thread-safe.
    """

    def __init__(
        self,
        bytes_per_second: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if bytes_per_second < MIN_BYTES_PER_SECOND:
            raise ValueError(f"an upload rate limit must be >= {MIN_BYTES_PER_SECOND} bytes/s, got {bytes_per_second}")
        self.bytes_per_second = bytes_per_second
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(bytes_per_second)
        self._refilled_at = clock()

    def acquire(self, nbytes: int) -> float:
        """Take `nbytes`, sleeping until the bucket's debt is paid; the seconds slept."""
        with self._lock:
            now = self._clock()
            elapsed = now - self._refilled_at
            self._tokens = min(float(self.bytes_per_second), self._tokens + elapsed * self.bytes_per_second)
            self._refilled_at = now
            self._tokens -= nbytes
            wait = max(0.0, -self._tokens / self.bytes_per_second)
        if wait > 0:
            self._sleep(wait)
        return wait


__all__ = ["MIN_BYTES_PER_SECOND", "THROTTLED_MS", "UploadRateLimiter"]
