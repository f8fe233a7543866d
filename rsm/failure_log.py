"""Logging of a failure that repeats (a wrong S3 secret fails every copy, every check): the first occurrence in
one line with its cause, then "still failing" with the count at a decaying rate, and one line on recovery.

Also the retry delay that goes with it (doubling up to a ceiling), for callers that retry on their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

# The first repeat is reported this long after the first failure, each later one twice as long after the last,
# but never less often than every REPEAT_MAX_S while the failure lasts.
REPEAT_FIRST_S = 10.0
REPEAT_MAX_S = 300.0
RETRY_MIN_S = 0.5
RETRY_MAX_S = 30.0


class RepeatedFailureLog:
    """One kind of failure (`what`, e.g. "the S3 bucket check"): thread-safe, cheap when nothing fails."""

    def __init__(
        self, logger: logging.Logger, what: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self._what = what
        self._clock = clock
        self._lock = threading.Lock()
        self._count = 0
        self._next_report = 0.0
        self._interval = REPEAT_FIRST_S

    @property
    def failures(self) -> int:
        """Failures since the last success."""
        return self._count

    def failed(self, exc: BaseException, traceback: bool = False) -> None:
        """Count a failure; log it if it is the first, or if a repeat report is due. `traceback`: the first
        one's traceback too (an unexpected error, where the stack says more than the message)."""
        now = self._clock()
        with self._lock:
            self._count += 1
            count = self._count
            if count == 1:
                self._interval, self._next_report = REPEAT_FIRST_S, now + REPEAT_FIRST_S
            elif now >= self._next_report:
                self._interval = min(self._interval * 2, REPEAT_MAX_S)
                self._next_report = now + self._interval
            else:
                return
        if count == 1:
            self._log.warning("%s failed: %s", self._what, _one_line(exc), exc_info=exc if traceback else None)
        else:
            self._log.warning("%s still failing (%d attempts): %s", self._what, count, _one_line(exc))

    def succeeded(self) -> None:
        """Reset; after failures, say once that it works again."""
        if not self._count:  # the common case, without the lock
            return
        with self._lock:
            count, self._count = self._count, 0
        if count:
            self._log.info("%s works again after %d failed attempts", self._what, count)

    @property
    def retry_s(self) -> float:
        """How long to wait before the next attempt: RETRY_MIN_S doubling per failure, at most RETRY_MAX_S."""
        return min(RETRY_MIN_S * 2 ** max(self._count - 1, 0), RETRY_MAX_S)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())  # botocore's messages may span lines
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["RepeatedFailureLog"]
