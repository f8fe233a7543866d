"""Consumer throughput through a real broker with tierlog's plugins: records read from tiered storage (S3
through the agent) versus the same amount read from the broker's local log. Starts its own Kafka and S3.

Usage: python bench/agent_broker_read.py [--records 60000] [--size 1000]; prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dev.demo import (  # noqa: E402
    PluginChoice,
    S3Location,
    broker_properties,
    consume,
    create_topic,
    ensure_plugin_jar,
    local_segment_offsets,
    produce,
    wait_until_tiered,
)
from dev.kafka import KafkaCluster  # noqa: E402
from dev.s3 import SeaweedS3  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--size", type=int, default=1000)
    args = parser.parse_args()
    jar = ensure_plugin_jar()
    half = args.records // 2
    with tempfile.TemporaryDirectory(prefix="tierlog-bench-") as tmp, SeaweedS3(Path(tmp) / "s3") as seaweed:
        e = seaweed.endpoint
        s3 = S3Location(e.endpoint, e.access_key, e.secret_key, e.bucket, "bench")
        # Keep the newest half local (by size) so both reads have the same amount of data to serve.
        local_bytes = str(half * args.size)
        with (
            tempfile.TemporaryDirectory(prefix="tl-") as sockets,
            KafkaCluster(
                Path(tmp) / "kafka", 1, properties=broker_properties(PluginChoice(s3=s3), Path(sockets), jar)
            ) as kafka,
        ):
            create_topic(
                kafka.bootstrap,
                "bench",
                config={
                    "remote.storage.enable": "true",
                    "segment.bytes": str(1024 * 1024),
                    "local.retention.bytes": local_bytes,
                    "retention.ms": "-1",
                },
            )
            started = time.perf_counter()
            produce(kafka.bootstrap, "bench", 0, args.records, size=args.size)
            produce_s = time.perf_counter() - started
            local_start = wait_until_tiered(kafka.log_dir(0), "bench", min_local_start=half // 2, timeout=180)
            remote_count = local_start
            started = time.perf_counter()
            remote = consume(kafka.bootstrap, "bench", remote_count, size=args.size)
            remote_s = time.perf_counter() - started
            started = time.perf_counter()
            local = consume(kafka.bootstrap, "bench", remote_count, start_offset=local_start, size=args.size)
            local_s = time.perf_counter() - started
            assert not remote.mismatched and not local.mismatched
            segments_local = len(local_segment_offsets(kafka.log_dir(0), "bench"))
    mib = remote_count * args.size / (1024 * 1024)
    print(
        json.dumps(
            {
                "benchmark": "agent_broker_read",
                "records": args.records,
                "value_bytes": args.size,
                "produce_mib_per_s": round(args.records * args.size / (1024 * 1024) / produce_s, 1),
                "records_per_read": remote_count,
                "remote_read_mib_per_s": round(mib / remote_s, 1),
                "local_read_mib_per_s": round(mib / local_s, 1),
                "remote_read_s": round(remote_s, 2),
                "local_read_s": round(local_s, 2),
                "local_segments_left": segments_local,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
