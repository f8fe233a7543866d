"""Cost of the agent hop: a segment fetched through the agent's gRPC stream on a Unix socket versus read
straight from the same rsm, plus copy and index-fetch call latency. Filesystem backend, so only the hop shows.

Usage: python bench/agent_stream.py [--segment-mib 64] [--repeat 5]; prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402

from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition  # noqa: E402
from rsm import IndexType, RemoteStorageManager  # noqa: E402
from tierlog.agent import messages  # noqa: E402
from tierlog.agent.proto import agent_pb2 as pb  # noqa: E402
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc  # noqa: E402
from tierlog.agent.server import AgentServer  # noqa: E402


def _timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segment-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    size = args.segment_mib * 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="tlb-") as tmp:
        # Laid out as a broker's log dir: the agent reads segment files only inside one.
        (Path(tmp) / "meta.properties").write_text("version=1\n")
        base = Path(tmp) / "bench-0"
        base.mkdir()
        files = {
            name: base / f"00000000000000000000.{name}" for name in ("log", "index", "timeindex", "snapshot")
        }
        with files["log"].open("wb") as out:
            block = bytes(range(256)) * 4096
            for _ in range(size // len(block)):
                out.write(block)
        files["index"].write_bytes(b"\0" * 8 * 1024)
        files["timeindex"].write_bytes(b"\0" * 12 * 1024)
        files["snapshot"].write_bytes(b"\0" * 256)
        tp = TopicIdPartition(uuid.uuid4(), "bench", 0)
        segment = RemoteLogSegmentMetadata(
            RemoteLogSegmentId(tp, uuid.uuid4()), 0, 999_999, 1, 1, 1, size, {0: 0}
        )
        config = {"storage.backend": "filesystem", "filesystem.root": str(base / "remote")}
        server = AgentServer({}, base / "a.sock").start()
        channel = grpc.insecure_channel(
            f"unix:{base / 'a.sock'}", options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        try:
            agent = pb_grpc.AgentStub(channel)
            storage = pb_grpc.RemoteStorageStub(channel)
            agent.Configure(
                pb.ConfigureRequest(component=pb.REMOTE_STORAGE_MANAGER, config=config), timeout=30
            )
            request = pb.CopyRequest(
                metadata=messages.segment_metadata_msg(segment),
                log_segment=str(files["log"]),
                offset_index=str(files["index"]),
                time_index=str(files["timeindex"]),
                producer_snapshot_index=str(files["snapshot"]),
                leader_epoch_index=b"0\n1\n0 0\n",
            )
            copy_times = _timed(lambda: storage.CopyLogSegmentData(request, timeout=120), args.repeat)
            custom = storage.CopyLogSegmentData(request, timeout=120).custom_metadata
            stored = RemoteLogSegmentMetadata(
                **{**{f: getattr(segment, f) for f in segment.__slots__}, "custom_metadata": custom}
            )
            fetch = pb.FetchSegmentRequest(metadata=messages.segment_metadata_msg(stored), start_position=0)

            def through_agent() -> None:
                received = sum(len(c.data) for c in storage.FetchLogSegment(fetch, timeout=120))
                assert received == size

            with RemoteStorageManager(config) as rsm:

                def direct() -> None:
                    with rsm.fetch_log_segment(stored, 0) as stream:
                        received = 0
                        while chunk := stream.read(256 * 1024):
                            received += len(chunk)
                    assert received == size

                direct_times = _timed(direct, args.repeat)
            agent_times = _timed(through_agent, args.repeat)
            index = pb.FetchIndexRequest(metadata=messages.segment_metadata_msg(stored), index_type=pb.OFFSET)
            index_times = _timed(lambda: list(storage.FetchIndex(index, timeout=30)), max(args.repeat, 20))
        finally:
            channel.close()
            server.stop(grace=1)
    mib = size / (1024 * 1024)
    print(
        json.dumps(
            {
                "benchmark": "agent_stream",
                "segment_mib": args.segment_mib,
                "repeat": args.repeat,
                "fetch_mib_per_s_through_agent": round(mib / statistics.median(agent_times), 1),
                "fetch_mib_per_s_direct_rsm": round(mib / statistics.median(direct_times), 1),
                "copy_call_ms_median": round(1000 * statistics.median(copy_times), 1),
                "fetch_index_call_ms_median": round(1000 * statistics.median(index_times), 2),
                "index_type": IndexType.OFFSET.name,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
