"""The demo's scenario as a test: `python -m dev.demo` tiers a topic to S3 and reads it all back."""

from __future__ import annotations

from pathlib import Path

from dev.demo import run_demo


def test_demo_reads_back_every_produced_record_from_tiered_storage(tmp_path: Path, plugin_jar: Path) -> None:
    records = 30_000
    summary = run_demo(tmp_path, records, 200)

    assert summary["first_local_offset"] >= records // 2  # the first half is only in S3
    assert summary["records_read_back"] == records
    assert summary["records_verified"] is True
    assert summary["segments_tiered"] >= 3
    assert summary["bytes_streamed_to_broker"] > 0
