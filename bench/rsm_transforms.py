"""Segment transforms: bytes saved, upload and read throughput of plain, compressed, encrypted and both, and what
a 4 KiB read in the middle of a 1 GiB transformed segment fetches (GETs and bytes).

Runs on the filesystem backend (the transforms' CPU cost shows, not a network's), in one process, one run. Two
realistic segments: record batches of JSON values as producers without compression write them, and the same
records in zstd-compressed batches (a producer with compression.type=zstd), each compression.heuristic.enabled.
Usage: python bench/rsm_transforms.py [--size-mib 64] [--large-mib 1024] [--dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import zstandard
from rsm_common import emit

from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from rsm import LogSegmentData, RemoteStorageManager

MIB = 1 << 20
READ_PIECE = MIB
BATCH_RECORDS = 200
UNIQUE_BYTES = 8 * MIB  # records generated once, repeated to the segment's size
COMBINATIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "compressed": {"compression.enabled": True},
    "encrypted": {"encryption.enabled": True},
    "compressed+encrypted": {"compression.enabled": True, "encryption.enabled": True},
}


def _varint(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)  # zigzag, as Kafka's record fields
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _records(rng: random.Random, count: int, first_offset: int) -> bytes:
    out = bytearray()
    for delta in range(count):
        value = json.dumps({
            "order_id": rng.randrange(10**12), "customer": f"customer-{rng.randrange(200_000)}",
            "sku": f"SKU-{rng.randrange(50_000):05d}", "quantity": rng.randrange(1, 9),
            "price": round(rng.random() * 300, 2), "currency": "EUR",
            "status": rng.choice(["CREATED", "PAID", "PACKED", "SHIPPED", "DELIVERED"]),
            "ts": 1_700_000_000_000 + first_offset + delta,
        }).encode()
        body = b"\x00" + _varint(delta) + _varint(delta) + _varint(-1) + _varint(len(value)) + value + _varint(0)
        out += _varint(len(body)) + body
    return bytes(out)


def _batch(codec: int, first_offset: int, records: bytes) -> bytes:
    """A Kafka record batch (magic 2): the header fields a reader sees, then the records (compressed or not)."""
    header = struct.pack(">ibihi", 0, 2, 0, codec, BATCH_RECORDS - 1) + struct.pack(">qqqhii", 0, 0, -1, -1, -1,
                                                                                     BATCH_RECORDS)
    return struct.pack(">qi", first_offset, len(header) + len(records)) + header + records


def make_segment(path: Path, size: int, compressed_batches: bool) -> None:
    """A segment file of `size` bytes: unique batches for UNIQUE_BYTES, then repeated."""
    rng = random.Random(7)
    compressor = zstandard.ZstdCompressor(level=3)
    unique = bytearray()
    offset = 0
    while len(unique) < min(size, UNIQUE_BYTES):
        records = _records(rng, BATCH_RECORDS, offset)
        unique += _batch(4, offset, compressor.compress(records)) if compressed_batches else _batch(0, offset, records)
        offset += BATCH_RECORDS
    with open(path, "wb") as out:
        written = 0
        while written < size:
            piece = bytes(unique[: size - written])
            out.write(piece)
            written += len(piece)


def segment_data(directory: Path, log: Path) -> LogSegmentData:
    for name in ("index", "timeindex", "snapshot"):
        (directory / f"segment.{name}").write_bytes(bytes(4096))
    return LogSegmentData(log, directory / "segment.index", directory / "segment.timeindex", None,
                          directory / "segment.snapshot", b"0\n1\n0 0\n")


def metadata_for(size: int) -> RemoteLogSegmentMetadata:
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    return RemoteLogSegmentMetadata(
        remote_log_segment_id=RemoteLogSegmentId.generate(tp), start_offset=0, end_offset=999,
        max_timestamp_ms=0, broker_id=0, event_timestamp_ms=0, segment_size_in_bytes=size,
        segment_leader_epochs={0: 0},
    )


def stored_log_bytes(rsm: RemoteStorageManager) -> int:
    return sum(o.size for o in rsm.backend.list("") if o.key.endswith(".log"))


def measure(config: dict[str, Any], data: LogSegmentData, size: int) -> dict[str, Any]:
    metadata = metadata_for(size)
    with RemoteStorageManager(config) as rsm:
        started = time.perf_counter()
        custom = rsm.copy_log_segment_data(metadata, data)
        upload_s = time.perf_counter() - started
        stored = stored_log_bytes(rsm)
    metadata = dataclasses.replace(metadata, custom_metadata=custom)
    with RemoteStorageManager(config) as rsm:  # a cold reader: keys unwrapped, chunk index fetched
        started = time.perf_counter()
        total = 0
        with rsm.fetch_log_segment(metadata, 0) as stream:
            while piece := stream.read(READ_PIECE):
                total += len(piece)
        read_s = time.perf_counter() - started
        rsm.delete_log_segment_data(metadata)
    assert total == size
    return {
        "stored_bytes": stored, "stored_ratio": round(stored / size, 4),
        "bytes_saved_pct": round(100 * (1 - stored / size), 1),
        "upload_mib_s": round(size / MIB / upload_s, 1), "read_mib_s": round(size / MIB / read_s, 1),
    }


def ranged_read(config: dict[str, Any], data: LogSegmentData, size: int) -> dict[str, Any]:
    """A 4 KiB read in the middle of the segment by a process that has read nothing of it yet."""
    metadata = metadata_for(size)
    with RemoteStorageManager(config) as rsm:
        started = time.perf_counter()
        metadata = dataclasses.replace(metadata, custom_metadata=rsm.copy_log_segment_data(metadata, data))
        upload_s = time.perf_counter() - started
        stored = stored_log_bytes(rsm)
    middle = size // 2
    with RemoteStorageManager(config) as rsm:
        started = time.perf_counter()
        with rsm.fetch_log_segment(metadata, middle, middle + 4095) as stream:
            assert len(stream.read()) == 4096
        latency_ms = (time.perf_counter() - started) * 1000
        get = rsm.metrics()["operations"]["backend.get"]
        result = {"gets": get["requests"], "bytes_fetched": get["bytes"], "latency_ms": round(latency_ms, 2)}
        rsm.delete_log_segment_data(metadata)
    return {**result, "stored_bytes": stored, "upload_s": round(upload_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=64, help="segment size of the throughput runs")
    parser.add_argument("--large-mib", type=int, default=1024, help="segment size of the ranged read")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tierlog-bench-transforms-", dir=args.dir))
    try:
        key = work / "kek"
        key.write_bytes(os.urandom(32))
        base = {
            "storage.backend": "filesystem", "filesystem.root": str(work / "bucket"),
            "compression.heuristic.enabled": True, "encryption.key.pairs": "kek", "encryption.key.pair.id": "kek",
            "encryption.key.pairs.kek.key.file": str(key),
        }
        size = args.size_mib * MIB
        segments: dict[str, Any] = {}
        for kind, compressed_batches in (("json_batches_uncompressed", False), ("json_batches_zstd", True)):
            directory = work / kind
            directory.mkdir()
            make_segment(directory / "segment.log", size, compressed_batches)
            data = segment_data(directory, directory / "segment.log")
            segments[kind] = {name: measure({**base, **extra}, data, size) for name, extra in COMBINATIONS.items()}
            print(f"{kind}: done", file=sys.stderr)
        large = args.large_mib * MIB
        directory = work / "large"
        directory.mkdir()
        make_segment(directory / "segment.log", large, compressed_batches=False)
        data = segment_data(directory, directory / "segment.log")
        ranged = {name: ranged_read({**base, **COMBINATIONS[name]}, data, large)
                  for name in ("plain", "compressed+encrypted")}
        emit({
            "benchmark": "rsm_transforms", "backend": "filesystem", "segment_mib": args.size_mib,
            "chunk_size": 4 * MIB, "segments": segments,
            "ranged_read_4KiB_middle": {
                "segment_mib": args.large_mib, **ranged,
                "note": "a process that never read the segment: one GET of the packed index's chunk-index range "
                        "(with the wrapped data key), then one of the chunk holding the 4 KiB; a broker has "
                        "fetched the chunk index with its OFFSET/TIMESTAMP index read already, leaving one GET. "
                        "Aiven's layout (as documented): a GET of the segment manifest (cached), then a ranged GET "
                        "of the chunk: the same count",
            },
        })
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
