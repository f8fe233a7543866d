"""The agent's check that its rsm's store answers with the configured credentials and bucket: once at creation,
then, while it fails, in the background with backoff until it passes; the rsm's readiness metric follows it.

A wrong S3 secret or a missing bucket then shows at start (`tierlog_agent_component_ready{component="rsm"} 0` and
one log line with the cause), not at the first copy; the failure repeats as a count, not a line per attempt.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rsm.failure_log import RepeatedFailureLog

log = logging.getLogger(__name__)


class StorageCheck:
    """Runs `rsm.check_storage()` now and, until it passes, again after each backoff; stops when the rsm closes."""

    def __init__(self, rsm: Any) -> None:
        self.rsm = rsm
        self._passed = threading.Event()
        self._stop = threading.Event()
        self._failures = RepeatedFailureLog(log, f"the storage check of the rsm ({rsm.backend!r})")
        if not self._attempt():
            threading.Thread(target=self._retry, name="rsm-storage-check", daemon=True).start()

    @property
    def passed(self) -> bool:
        return self._passed.is_set()

    def _attempt(self) -> bool:
        try:
            self.rsm.check_storage()
        except Exception as exc:
            if self.rsm.closed:
                self._stop.set()
            else:
                self._failures.failed(exc)
            return False
        self._failures.succeeded()
        self._passed.set()
        return True

    def _retry(self) -> None:
        while not self._stop.wait(self._failures.retry_s):
            if self._attempt():
                return

    def close(self) -> None:
        self._stop.set()
