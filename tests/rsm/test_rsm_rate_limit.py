"""upload.rate.limit.bytes.per.second: every concurrent upload of an rsm draws from one token bucket holding a
second's worth, so N bytes take at least (N - rate) / rate seconds, transformed or not. Only lower bounds on time
are asserted (a loaded machine is slower, never faster).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rsm_testkit import SegmentFactory

from rlmm.errors import ConfigError
from rsm import RemoteStorageManager
from rsm.rate_limit import MIN_BYTES_PER_SECOND, THROTTLED_MS, UploadRateLimiter

RATE = MIN_BYTES_PER_SECOND


class FakeClock:
    """A clock that moves only when the limiter sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"storage.backend": "filesystem", "filesystem.root": str(tmp_path / "remote"), "chunk.size": 256 << 10,
            "upload.rate.limit.bytes.per.second": RATE, **extra}


def test_the_bucket_lets_one_second_through_then_holds_to_the_rate() -> None:
    clock = FakeClock()
    limiter = UploadRateLimiter(RATE, clock, clock.sleep)
    assert limiter.acquire(RATE) == 0
    assert limiter.acquire(RATE // 2) == pytest.approx(0.5)
    assert limiter.acquire(3 * RATE) == pytest.approx(3.0)
    assert clock.now == pytest.approx(3.5)


def test_callers_queue_behind_each_others_debt() -> None:
    clock = FakeClock()
    limiter = UploadRateLimiter(RATE, clock, lambda _: None)  # neither caller has slept yet
    limiter.acquire(RATE)
    assert limiter.acquire(2 * RATE) == pytest.approx(2.0)
    assert limiter.acquire(RATE) == pytest.approx(3.0)


def test_a_limit_below_one_mib_per_second_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"upload\.rate\.limit\.bytes\.per\.second"):
        RemoteStorageManager(_config(tmp_path, **{"upload.rate.limit.bytes.per.second": RATE - 1}))


def test_concurrent_uploads_share_the_limit(tmp_path: Path, make_segment: SegmentFactory) -> None:
    segments = [make_segment(log_size=3 * RATE // 2, seed=seed) for seed in (1, 2)]
    with RemoteStorageManager(_config(tmp_path)) as rsm:
        threads = [threading.Thread(target=rsm.copy_log_segment_data, args=(s.metadata, s.data)) for s in segments]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        elapsed = time.monotonic() - started
        throttled_ms = rsm.metrics()["counters"][THROTTLED_MS]
        assert all(rsm.fetch_log_segment(s.metadata, 0).read() == s.log_bytes for s in segments)
    # 3 MiB at 1 MiB/s, the first MiB from the full bucket.
    assert elapsed >= 2.0
    assert throttled_ms > 0


def test_a_compressed_upload_is_paced_by_its_original_bytes(tmp_path: Path, make_segment: SegmentFactory) -> None:
    segment = make_segment(log_size=2 * RATE)
    with RemoteStorageManager(_config(tmp_path, **{"compression.enabled": "true"})) as rsm:
        started = time.monotonic()
        rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert time.monotonic() - started >= 1.0
        assert rsm.metrics()["counters"][THROTTLED_MS] > 0
