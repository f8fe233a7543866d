"""Cold index fetch: latency and wire requests of tierlog's packed `.indexes` against two other layouts.

Layouts, same server, same index bytes, measured in one run: `packed` (tierlog: one ranged GET using the
section table in the custom metadata), `separate` (five objects, as Kafka's LocalTieredStorage stores them),
`ranged_per_type` (one object, one ranged GET per index type, as the best-known open-source plugin does;
its manifest assumed cached). Usage: python bench/rsm_index_fetch.py [--segments N]
"""

from __future__ import annotations

import argparse
import functools
import random
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rsm_common import CountingClient, emit, remove_prefix, rsm_s3_config, services_env, summary_ms, wire_requests

from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from rsm import IndexType, LogSegmentData, RemoteStorageManager

BROKER_SEQUENCE = (IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.TRANSACTION)
ALL_TYPES = tuple(IndexType)
PROFILES: dict[str, dict[IndexType, int]] = {
    # The files of a 1 MiB segment rolled by the real broker in tests/rsm (index.interval.bytes=1).
    "small": {
        IndexType.OFFSET: 88, IndexType.TIMESTAMP: 96, IndexType.TRANSACTION: 68,
        IndexType.LEADER_EPOCH: 8, IndexType.PRODUCER_SNAPSHOT: 56,
    },
    # A busier segment: thousands of index entries, some aborted transactions, many producers.
    "typical": {
        IndexType.OFFSET: 64 << 10, IndexType.TIMESTAMP: 96 << 10, IndexType.TRANSACTION: 2 << 10,
        IndexType.LEADER_EPOCH: 32, IndexType.PRODUCER_SNAPSHOT: 4 << 10,
    },
}


class Segment:
    def __init__(self, rsm: RemoteStorageManager, raw: CountingClient, prefix: str, workdir: Path,
                 sizes: dict[IndexType, int], rng: random.Random) -> None:
        self.indexes = {t: rng.randbytes(n) for t, n in sizes.items()}
        tp = TopicIdPartition(uuid.uuid4(), "bench", 0)
        seg_id = RemoteLogSegmentId.generate(tp)
        files = {}
        for t in (IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.TRANSACTION, IndexType.PRODUCER_SNAPSHOT):
            files[t] = workdir / f"{seg_id.id}.{t.name}"
            files[t].write_bytes(self.indexes[t])
        log = workdir / f"{seg_id.id}.log"
        log.write_bytes(rng.randbytes(1024))
        data = LogSegmentData(log, files[IndexType.OFFSET], files[IndexType.TIMESTAMP],
                              files[IndexType.TRANSACTION], files[IndexType.PRODUCER_SNAPSHOT],
                              self.indexes[IndexType.LEADER_EPOCH])
        base = RemoteLogSegmentMetadata(seg_id, 0, 99, 0, 0, 0, 1024, {0: 0})
        custom = rsm.copy_log_segment_data(base, data)
        self.metadata = RemoteLogSegmentMetadata(seg_id, 0, 99, 0, 0, 0, 1024, {0: 0}, custom_metadata=custom)
        self.without_custom = base
        # The two comparison layouts, written with raw boto3 under the bench prefix.
        self.separate_keys = {t: f"{prefix}/separate/{seg_id.id}/{t.name.lower()}" for t in ALL_TYPES}
        for t, key in self.separate_keys.items():
            raw.client.put_object(Bucket=raw.bucket, Key=key, Body=self.indexes[t])
        self.ranged_key = f"{prefix}/ranged/{seg_id.id}.indexes"
        self.ranges: dict[IndexType, tuple[int, int]] = {}
        position = 0
        for t in ALL_TYPES:
            self.ranges[t] = (position, position + len(self.indexes[t]) - 1)
            position += len(self.indexes[t])
        raw.client.put_object(Bucket=raw.bucket, Key=self.ranged_key,
                              Body=b"".join(self.indexes[t] for t in ALL_TYPES))


def _measure(fetch: Callable[[], dict[IndexType, bytes]], expected: dict[IndexType, bytes]) -> float:
    started = time.perf_counter()
    got = fetch()
    elapsed = time.perf_counter() - started
    if got != expected:
        raise AssertionError("a layout returned different index bytes")
    return elapsed


def run(profile: str, segments: int, env: dict[str, str]) -> dict[str, Any]:
    prefix = f"bench/rsm-index-fetch/{uuid.uuid4().hex[:8]}"
    rng = random.Random(3)
    raw = CountingClient(env)
    results: dict[str, Any] = {}
    with RemoteStorageManager(rsm_s3_config(env, prefix)) as rsm, tempfile.TemporaryDirectory() as tmp:
        try:
            sets = {
                scenario: [Segment(rsm, raw, prefix, Path(tmp), PROFILES[profile], rng) for _ in range(segments)]
                for scenario in ("all_five", "broker_sequence")
            }

            def packed_all(s: Segment) -> dict[IndexType, bytes]:
                return {t: f.read() for t, f in rsm.fetch_indexes(s.metadata, ALL_TYPES).items()}

            def packed_all_no_custom_metadata(s: Segment) -> dict[IndexType, bytes]:
                return {t: f.read() for t, f in rsm.fetch_indexes(s.without_custom, ALL_TYPES).items()}

            def packed_broker(s: Segment) -> dict[IndexType, bytes]:
                return {t: rsm.fetch_index(s.metadata, t).read() for t in BROKER_SEQUENCE}

            def separate(types: tuple[IndexType, ...]) -> Callable[[Segment], dict[IndexType, bytes]]:
                return lambda s: {
                    t: raw.client.get_object(Bucket=raw.bucket, Key=s.separate_keys[t])["Body"].read()
                    for t in types
                }

            def ranged(types: tuple[IndexType, ...]) -> Callable[[Segment], dict[IndexType, bytes]]:
                def fetch(s: Segment) -> dict[IndexType, bytes]:
                    out = {}
                    for t in types:
                        lo, hi = s.ranges[t]
                        reply = raw.client.get_object(Bucket=raw.bucket, Key=s.ranged_key, Range=f"bytes={lo}-{hi}")
                        out[t] = reply["Body"].read()
                    return out
                return fetch

            scenarios: dict[str, dict[str, Callable[[Segment], dict[IndexType, bytes]]]] = {
                "all_five": {
                    "packed": packed_all,
                    "packed_without_custom_metadata": packed_all_no_custom_metadata,
                    "separate": separate(ALL_TYPES),
                    "ranged_per_type": ranged(ALL_TYPES),
                },
                "broker_sequence": {
                    "packed": packed_broker,
                    "separate": separate(BROKER_SEQUENCE),
                    "ranged_per_type": ranged(BROKER_SEQUENCE),
                },
            }
            for scenario, layouts in scenarios.items():
                wanted = ALL_TYPES if scenario == "all_five" else BROKER_SEQUENCE
                samples: dict[str, list[float]] = {name: [] for name in layouts}
                requests = dict.fromkeys(layouts, 0)
                # Interleaved per segment, so load on the shared machine affects every layout alike.
                for seg in sets[scenario]:
                    expected = {t: seg.indexes[t] for t in wanted}
                    for name, fetch in layouts.items():
                        before = wire_requests(rsm.metrics()) + raw.total()
                        samples[name].append(_measure(functools.partial(fetch, seg), expected))
                        requests[name] += wire_requests(rsm.metrics()) + raw.total() - before
                results[scenario] = {
                    name: {"requests_per_fetch": requests[name] / segments, **summary_ms(samples[name])}
                    for name in layouts
                }
                packed_p50 = results[scenario]["packed"]["p50_ms"]
                for name in layouts:
                    results[scenario][name]["p50_vs_packed"] = round(results[scenario][name]["p50_ms"] / packed_p50, 2)
        finally:
            remove_prefix(raw, prefix)
    return {"index_bytes": {t.name: n for t, n in PROFILES[profile].items()}, **results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--segments", type=int, default=30, help="cold segments per scenario and layout")
    args = parser.parse_args()
    env = services_env()
    emit({
        "benchmark": "rsm_index_fetch",
        "s3_endpoint": env["S3_ENDPOINT"],
        "segments_per_scenario": args.segments,
        "profiles": {profile: run(profile, args.segments, env) for profile in PROFILES},
    })


if __name__ == "__main__":
    main()
