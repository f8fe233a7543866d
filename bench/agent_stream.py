"""Cost of the agent hop: a segment read straight from an rsm, through the agent's gRPC byte stream, and through
the agent's file-path RPC (FetchLogSegmentFiles: the client reads the chunk cache's files itself, as the JVM
adapter does), cold (nothing cached) and warm; GETs per cold whole-segment read; copy and index-fetch latency.
Filesystem backend by default, so only the hop shows (there the file path answers with the backend's own file, which
the reader checks chunk by chunk as the JVM adapter does; `--no-direct` makes it copy into the cache as on S3);
`--backend s3` uses the dev services' S3 and adds raw boto3 ranged GETs of the same object (one per window, read
sequentially) as the baseline the issue names, alternating with the cold reads through the agent's file path.

With `--curve 1,4,16`: the concurrency curve instead, N readers each reading a different segment at once, cold,
through the agent's file path and its byte stream (each reader a process of its own, as brokers' fetch threads are
not the agent's) and from the rsm called directly (N threads of one process); aggregate MiB/s per N, with the CPU
of the serving process, of the readers and of the whole machine.

Usage: python bench/agent_stream.py [--segment-mib 64] [--repeat 5] [--window-mib 8] [--backend filesystem|s3]
[--reader-process] [--curve 1,4,16]; prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import google_crc32c  # noqa: E402
import grpc  # noqa: E402

from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition  # noqa: E402
from rsm import IndexType, LogSegmentData, RemoteStorageManager  # noqa: E402
from rsm.keys import keys_for  # noqa: E402
from rsm.manager import CORE_CONFIG_KEYS  # noqa: E402
from tierlog.agent import messages  # noqa: E402
from tierlog.agent.components import ComponentName  # noqa: E402
from tierlog.agent.proto import agent_pb2 as pb  # noqa: E402
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc  # noqa: E402
from tierlog.agent.server import AgentServer  # noqa: E402

MIB = 1 << 20
READ_BYTES = 256 * 1024


def _timed(fn: Callable[[], Any], repeat: int, before: Callable[[], Any] | None = None) -> list[float]:
    """Seconds per call of `fn`; `before` runs untimed ahead of each (to make the next read cold)."""
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def _backend_config(backend: str, base: Path, direct: bool) -> dict[str, Any]:
    if backend == "filesystem":
        return {"storage.backend": "filesystem", "filesystem.root": str(base / "remote"), "fetch.files.direct": direct}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rsm_common import rsm_s3_config, services_env

    return rsm_s3_config(services_env(), f"bench/agent-stream/{uuid.uuid4().hex[:8]}")


def _remove_objects(backend: dict[str, Any]) -> None:
    """Delete what the run stored on S3 (the filesystem backend's objects go with the run's temporary directory)."""
    if backend.get("storage.backend") == "s3":
        from rsm_common import CountingClient, remove_prefix, services_env

        remove_prefix(CountingClient(services_env()), backend["s3.prefix"])


def _raw_ranged_gets(config: dict[str, Any], stored: RemoteLogSegmentMetadata, size: int, window: int) -> Callable[
        [], None]:
    """A read of the segment's `.log` object with raw boto3: one ranged GET per window, each body read as it comes."""
    from rsm_common import CountingClient, services_env

    raw = CountingClient(services_env())
    key = f"{config['s3.prefix']}/{keys_for(stored, False).log}"

    def read() -> None:
        received = 0
        for start in range(0, size, window):
            answer = raw.client.get_object(Bucket=raw.bucket, Key=key, Range=f"bytes={start}-{start + window - 1}")
            body = answer["Body"]
            while chunk := body.read(READ_BYTES):
                received += len(chunk)
        assert received == size, received

    return read


def _gets(rsm: Any) -> int:
    return int(rsm.metrics()["operations"].get("backend.get", {}).get("requests", 0))


def _crc32c(fd: int, offset: int, length: int) -> int:
    """CRC32C of `length` bytes at `offset` of an open file, read in pieces as the adapter's check does."""
    crc, end = 0, offset + length
    while offset < end:
        piece = os.pread(fd, min(READ_BYTES, end - offset), offset)
        assert piece, f"the file ends at byte {offset}"
        crc = google_crc32c.extend(crc, piece)
        offset += len(piece)
    return int(crc)


def _read_files(storage: Any, stored_msg: Any, size: int, window: int) -> int:
    """Read a segment as the JVM adapter does: per window, open every file, release the lease if there is one (not
    waiting for the answer), check the chunks the answer says to check, read the ranges."""
    position = received = 0
    releases = []
    while position < size:
        answer = storage.FetchLogSegmentFiles(
            pb.FetchSegmentFilesRequest(metadata=stored_msg, start_position=position, max_bytes=window), timeout=300
        )
        assert not answer.stream_instead, answer.stream_instead
        descriptors = [os.open(r.path, os.O_RDONLY) for r in answer.ranges]
        if answer.lease_id:
            releases.append(storage.ReleaseSegmentFiles.future(pb.SegmentFilesLease(lease_id=answer.lease_id),
                                                               timeout=30))
        for fd, piece in zip(descriptors, answer.ranges, strict=True):
            if piece.HasField("check"):
                check = piece.check
                assert _crc32c(fd, check.offset, check.length) == check.crc32c, f"chunk {check.chunk}"
            offset, end = piece.offset, piece.offset + piece.length
            while offset < end:
                received += len(os.pread(fd, min(READ_BYTES, end - offset), offset))
                offset += READ_BYTES
            os.close(fd)
        position = answer.end_position + 1
    for release in releases:  # a dropped future would cancel its call
        release.result()
    return received


def _files_reader_loop(socket: str, segment: bytes, size: int, window: int, go: Any, done: Any) -> None:
    """A reader process of its own, as the adapter is: reads the segment whole through the file path each time it is
    told to, and reports how many seconds the read took."""
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        storage = pb_grpc.RemoteStorageStub(channel)
        stored_msg = pb.RemoteLogSegmentMetadata.FromString(segment)
        while go.get(timeout=3600):
            started = time.perf_counter()
            received = _read_files(storage, stored_msg, size, window)
            done.put((received, time.perf_counter() - started))


class _FilesReader:
    """The file path's reads made by a process of its own (`--reader-process`)."""

    def __init__(self, socket: Path, stored_msg: Any, size: int, window: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._go, self._done, self._size = context.Queue(), context.Queue(), size
        self._process = context.Process(target=_files_reader_loop, args=(
            str(socket), stored_msg.SerializeToString(), size, window, self._go, self._done,
        ))
        self._process.start()
        self.read_s()  # untimed: the process's interpreter, imports and channel are up before the first timed read

    def read_s(self) -> float:
        self._go.put(True)
        received, seconds = self._done.get(timeout=600)
        assert received == self._size, received
        return float(seconds)

    def close(self) -> None:
        self._go.put(False)
        self._process.join(60)


def _read_stream(storage: Any, stored_msg: Any) -> int:
    fetch = pb.FetchSegmentRequest(metadata=stored_msg, start_position=0)
    return sum(len(c.data) for c in storage.FetchLogSegment(fetch, timeout=300))


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process) since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _curve_reader(
    socket: str, path: str, segment: bytes, size: int, window: int, ready: Any, start: Any, done: Any
) -> None:
    """One reader process: connect, say it is ready, wait for the start, read its segment whole, report when it
    finished."""
    channel = grpc.insecure_channel(f"unix:{socket}", options=[("grpc.max_receive_message_length", 64 << 20)])
    grpc.channel_ready_future(channel).result(timeout=120)
    storage = pb_grpc.RemoteStorageStub(channel)
    stored_msg = pb.RemoteLogSegmentMetadata.FromString(segment)
    ready.put(True)
    start.wait(600)
    cpu = time.process_time()
    received = _read_files(storage, stored_msg, size, window) if path == "files" else _read_stream(storage, stored_msg)
    done.put((received, time.monotonic(), time.process_time() - cpu))
    channel.close()


def _curve(args: argparse.Namespace, base: Path, caches: Path, backend: dict[str, Any], counts: list[int]
           ) -> dict[str, Any]:
    """Aggregate MiB/s of N concurrent cold whole-segment reads, each of its own segment, for each N."""
    size, window = args.segment_mib * MIB, args.window_mib * MIB
    log_dir = base / "curve-0"
    log_dir.mkdir()
    tp = TopicIdPartition(uuid.uuid4(), "bench", 0)
    stored: list[RemoteLogSegmentMetadata] = []
    with RemoteStorageManager(backend) as writer:
        for _ in range(max(counts)):
            segment = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), 0, 999_999, 1, 1, 1, size, {0: 0})
            log = log_dir / f"{segment.remote_log_segment_id.id}.log"
            log.write_bytes(os.urandom(size))
            index = log_dir / f"{segment.remote_log_segment_id.id}.index"
            index.write_bytes(b"\0" * 8 * 1024)
            data = LogSegmentData(log, index, index, None, index, b"0\n1\n0 0\n")
            custom = writer.copy_log_segment_data(segment, data)
            stored.append(RemoteLogSegmentMetadata(
                **{**{f: getattr(segment, f) for f in segment.__slots__}, "custom_metadata": custom}
            ))
    context = multiprocessing.get_context("spawn")
    names = ("agent_files", "agent_stream", "direct_rsm_uncached", "direct_rsm_disk_cache_cold")
    runs: dict[str, dict[int, list[float]]] = {name: {n: [] for n in counts} for name in names}
    # CPU seconds of this process (the agent, or the direct rsm) per wall second: near 1.0 while it is the only
    # thing running means one interpreter's lock bounds it; well below 1.0, something else (disk, the readers).
    cores: dict[str, dict[int, list[float]]] = {name: {n: [] for n in counts} for name in names}
    # Through the agent: the reader processes' CPU together, and the whole machine's busy cores (every process:
    # the agent, the readers, the S3 server, anything else running), over the same wall time.
    reader_cores: dict[str, dict[int, list[float]]] = {name: {n: [] for n in counts} for name in names[:2]}
    machine: dict[str, dict[int, list[float]]] = {name: {n: [] for n in counts} for name in names[:2]}
    for n in counts * args.repeat:
        segments = stored[:n]
        for name, cache in (("direct_rsm_uncached", None), ("direct_rsm_disk_cache_cold", caches / f"direct-{n}")):
            config = backend if cache is None else {
                **backend, "fetch.chunk.cache.class": "disk", "fetch.chunk.cache.size": 2 * n * size,
                "fetch.chunk.cache.path": str(cache),
            }
            with RemoteStorageManager(config) as direct:
                def read_direct(metadata: RemoteLogSegmentMetadata, rsm: RemoteStorageManager = direct) -> int:
                    received = 0
                    with rsm.fetch_log_segment(metadata, 0) as stream:
                        while chunk := stream.read(READ_BYTES):
                            received += len(chunk)
                    return received

                with ThreadPoolExecutor(n) as pool:
                    started, cpu = time.monotonic(), time.process_time()
                    assert sum(pool.map(read_direct, segments)) == n * size
                    elapsed = time.monotonic() - started
                    runs[name][n].append(n * size / MIB / elapsed)
                    cores[name][n].append((time.process_time() - cpu) / elapsed)
            if cache is not None:
                shutil.rmtree(cache, ignore_errors=True)
        for path in ("files", "stream"):
            # A fresh agent and cache each time: every read is cold (the store's bytes are in the page cache).
            cache = caches / f"curve-cache-{n}-{path}"
            socket = base / f"c{n}{path[0]}.sock"
            server = AgentServer({}, socket).start()
            try:
                config = {**backend, "fetch.chunk.cache.class": "disk", "fetch.chunk.cache.size": 2 * n * size,
                          "fetch.chunk.cache.path": str(cache)}
                with grpc.insecure_channel(f"unix:{socket}") as channel:
                    pb_grpc.AgentStub(channel).Configure(pb.ConfigureRequest(
                        component=pb.REMOTE_STORAGE_MANAGER, config={k: str(v) for k, v in config.items()}
                    ), timeout=30)
                ready, start, done = context.Queue(), context.Event(), context.Queue()
                readers = [
                    context.Process(target=_curve_reader, args=(
                        str(socket), path, messages.segment_metadata_msg(m).SerializeToString(), size, window, ready,
                        start, done,
                    ))
                    for m in segments
                ]
                for reader in readers:
                    reader.start()
                for _ in readers:  # every reader's interpreter is up and connected before the clock starts
                    ready.get(timeout=300)
                started, cpu, busy = time.monotonic(), time.process_time(), _machine_busy_s()
                start.set()
                finished = [done.get(timeout=600) for _ in readers]
                elapsed = max(at for _, at, _ in finished) - started
                machine[f"agent_{path}"][n].append((_machine_busy_s() - busy) / elapsed)
                for reader in readers:
                    reader.join(60)
                assert sum(received for received, _, _ in finished) == n * size
                runs[f"agent_{path}"][n].append(n * size / MIB / elapsed)
                cores[f"agent_{path}"][n].append((time.process_time() - cpu) / elapsed)
                reader_cores[f"agent_{path}"][n].append(sum(used for _, _, used in finished) / elapsed)
            finally:
                server.stop(grace=1)
                shutil.rmtree(cache, ignore_errors=True)
    return {
        "benchmark": "agent_stream_concurrency_curve",
        "backend": args.backend,
        "segment_mib": args.segment_mib,
        "files_window_mib": args.window_mib,
        "cache_dir": str(args.cache_dir or "the run's temporary directory"),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "repeat": args.repeat,
        "aggregate_mib_per_s_by_readers_median": {
            name: {n: round(statistics.median(rates), 1) for n, rates in by_n.items()} for name, by_n in runs.items()
        },
        "aggregate_mib_per_s_by_readers_best": {
            name: {n: round(max(rates), 1) for n, rates in by_n.items()} for name, by_n in runs.items()
        },
        "serving_process_cpu_cores_median": {
            name: {n: round(statistics.median(c), 2) for n, c in by_n.items()} for name, by_n in cores.items()
        },
        "reader_processes_cpu_cores_median": {
            name: {n: round(statistics.median(c), 2) for n, c in by_n.items()} for name, by_n in reader_cores.items()
        },
        "machine_busy_cores_median": {
            name: {n: round(statistics.median(c), 2) for n, c in by_n.items()} for name, by_n in machine.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segment-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--window-mib", type=int, default=8, help="max_bytes of each FetchLogSegmentFiles call")
    parser.add_argument("--backend", choices=("filesystem", "s3"), default="filesystem")
    parser.add_argument("--prefetch-mib", type=int, default=None,
                        help="fetch.chunk.cache.prefetch.max.size in MiB (default: the rsm's)")
    parser.add_argument("--curve", default=None, help="reader counts, e.g. 1,4,16: the concurrency curve only")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where the disk chunk caches go (default: the temporary directory of the run), e.g. a "
                             "tmpfs to see the hop without the cache disk's write speed")
    parser.add_argument("--reader-process", action="store_true",
                        help="the file path's reads are made by a process of its own, as the adapter's are (default: "
                             "by this process, beside the agent)")
    parser.add_argument("--no-direct", action="store_true",
                        help="filesystem backend: the file path copies into the chunk cache (fetch.files.direct=false)")
    args = parser.parse_args()
    if args.curve is not None:
        with (tempfile.TemporaryDirectory(prefix="tlb-") as tmp,
              tempfile.TemporaryDirectory(prefix="tlb-caches-", dir=args.cache_dir) as curve_caches):
            (Path(tmp) / "meta.properties").write_text("version=1\n")
            backend = _backend_config(args.backend, Path(tmp), not args.no_direct)
            try:
                print(json.dumps(_curve(args, Path(tmp), Path(curve_caches), backend,
                                        [int(n) for n in args.curve.split(",")]), indent=2))
            finally:
                _remove_objects(backend)
        return
    size = args.segment_mib * MIB
    window = args.window_mib * MIB
    with (tempfile.TemporaryDirectory(prefix="tlb-") as tmp,
          tempfile.TemporaryDirectory(prefix="tlb-caches-", dir=args.cache_dir) as cache_root):
        caches = Path(cache_root)
        # Laid out as a broker's log dir: the agent reads segment files only inside one.
        (Path(tmp) / "meta.properties").write_text("version=1\n")
        base = Path(tmp) / "bench-0"
        base.mkdir()
        files = {
            name: base / f"00000000000000000000.{name}" for name in ("log", "index", "timeindex", "snapshot")
        }
        with files["log"].open("wb") as out:
            for _ in range(size // MIB):
                out.write(os.urandom(MIB))
        files["index"].write_bytes(b"\0" * 8 * 1024)
        files["timeindex"].write_bytes(b"\0" * 12 * 1024)
        files["snapshot"].write_bytes(b"\0" * 256)
        tp = TopicIdPartition(uuid.uuid4(), "bench", 0)
        segment = RemoteLogSegmentMetadata(
            RemoteLogSegmentId(tp, uuid.uuid4()), 0, 999_999, 1, 1, 1, size, {0: 0}
        )
        backend = _backend_config(args.backend, base, not args.no_direct)
        agent_cache = caches / "agent-cache"
        cached: dict[str, Any] = {"fetch.chunk.cache.class": "disk", "fetch.chunk.cache.size": 4 * size}
        if args.prefetch_mib is not None:
            cached["fetch.chunk.cache.prefetch.max.size"] = args.prefetch_mib * MIB
        agent_config = {**backend, **cached, "fetch.chunk.cache.path": str(agent_cache)}
        server = AgentServer({}, base / "a.sock").start()
        channel = grpc.insecure_channel(
            f"unix:{base / 'a.sock'}", options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        try:
            agent = pb_grpc.AgentStub(channel)
            storage = pb_grpc.RemoteStorageStub(channel)
            agent.Configure(
                pb.ConfigureRequest(
                    component=pb.REMOTE_STORAGE_MANAGER, config={k: str(v) for k, v in agent_config.items()}
                ),
                timeout=30,
            )
            agent_rsm = server.components.get(ComponentName.REMOTE_STORAGE_MANAGER, 30)
            request = pb.CopyRequest(
                metadata=messages.segment_metadata_msg(segment),
                log_segment=str(files["log"]),
                offset_index=str(files["index"]),
                time_index=str(files["timeindex"]),
                producer_snapshot_index=str(files["snapshot"]),
                leader_epoch_index=b"0\n1\n0 0\n",
            )
            copy_times = _timed(lambda: storage.CopyLogSegmentData(request, timeout=300), args.repeat)
            custom = storage.CopyLogSegmentData(request, timeout=300).custom_metadata
            stored = RemoteLogSegmentMetadata(
                **{**{f: getattr(segment, f) for f in segment.__slots__}, "custom_metadata": custom}
            )
            stored_msg = messages.segment_metadata_msg(stored)

            def recopy() -> None:
                """Copying again drops the agent's cached chunks and chunk index: the next read is cold."""
                storage.CopyLogSegmentData(request, timeout=300)

            def stream_through_agent() -> None:
                assert _read_stream(storage, stored_msg) == size

            def files_through_agent(max_bytes: int = window) -> None:
                assert _read_files(storage, stored_msg, size, max_bytes) == size

            def cold_gets(read: Callable[[], None], rsm: Any, before: Callable[[], None]) -> int:
                before()
                gets = _gets(rsm)
                read()
                return _gets(rsm) - gets

            results: dict[str, Any] = {}

            def direct(rsm: RemoteStorageManager) -> Callable[[], None]:
                def read() -> None:
                    received = 0
                    with rsm.fetch_log_segment(stored, 0) as stream:
                        while chunk := stream.read(READ_BYTES):
                            received += len(chunk)
                    assert received == size

                return read

            with RemoteStorageManager(backend) as uncached:
                # The rsm's own read, no cache: every read is as cold as the store.
                results["direct_rsm_uncached"] = _timed(direct(uncached), args.repeat)
                results["gets_per_cold_read_direct_uncached_after_index_fetch"] = cold_gets(
                    direct(uncached), uncached, lambda: uncached.fetch_index(stored, IndexType.OFFSET).close()
                )
            direct_cache = caches / "direct-cache"
            holder: dict[str, RemoteStorageManager] = {}

            def fresh_direct_cached() -> None:
                if "rsm" in holder:
                    holder["rsm"].close()
                shutil.rmtree(direct_cache, ignore_errors=True)
                holder["rsm"] = RemoteStorageManager({**backend, **cached, "fetch.chunk.cache.path": str(direct_cache)})

            def direct_cached() -> None:
                direct(holder["rsm"])()

            results["direct_rsm_cached_cold"] = _timed(direct_cached, args.repeat, before=fresh_direct_cached)
            results["direct_rsm_cached_warm"] = _timed(direct_cached, args.repeat)
            holder["rsm"].close()
            results["agent_stream_cold"] = _timed(stream_through_agent, args.repeat, before=recopy)
            results["agent_stream_warm"] = _timed(stream_through_agent, args.repeat)
            files_reader = _FilesReader(base / "a.sock", stored_msg, size, window) if args.reader_process else None

            def files_read_s() -> float:
                """Seconds of one whole-segment read through the file path, by the reader of this run."""
                return _timed(files_through_agent, 1)[0] if files_reader is None else files_reader.read_s()

            if args.backend == "s3":
                # The baseline and the adapter's path take turns after each copy (which empties the agent's cache),
                # each going first every other time, so both see the same load and the same freshly written object.
                raw_read = _raw_ranged_gets(backend, stored, size, window)
                results["raw_boto3_ranged_gets"], results["agent_files_cold"] = [], []
                for turn in range(args.repeat):
                    recopy()
                    for name in ("raw_boto3_ranged_gets", "agent_files_cold")[:: 1 if turn % 2 else -1]:
                        results[name].append(_timed(raw_read, 1)[0] if name.startswith("raw") else files_read_s())
            else:
                results["agent_files_cold"] = []
                for _ in range(args.repeat):
                    recopy()
                    results["agent_files_cold"].append(files_read_s())
            results["agent_files_warm"] = [files_read_s() for _ in range(args.repeat)]
            if files_reader is not None:
                files_reader.close()
            gets_stream = cold_gets(stream_through_agent, agent_rsm, recopy)
            gets_files = cold_gets(files_through_agent, agent_rsm, recopy)
            # One call for the whole segment (max_bytes 0: the agent's choice, here the whole segment).
            gets_files_one_call = cold_gets(lambda: files_through_agent(0), agent_rsm, recopy)
            prefetched = agent_rsm.metrics()["counters"].get("chunk_cache.prefetched_chunks", 0)
            index = pb.FetchIndexRequest(metadata=stored_msg, index_type=pb.OFFSET)
            index_times = _timed(lambda: list(storage.FetchIndex(index, timeout=30)), max(args.repeat, 20))
        finally:
            channel.close()
            server.stop(grace=1)
            _remove_objects(backend)

    def rate(name: str) -> float:
        return round(size / MIB / statistics.median(results[name]), 1)

    rates = {name: rate(name) for name, value in results.items() if isinstance(value, list)}
    baseline = rates["direct_rsm_uncached"]
    print(
        json.dumps(
            {
                "benchmark": "agent_stream",
                "backend": args.backend,
                "segment_mib": args.segment_mib,
                "chunk_mib": 4,
                "files_window_mib": args.window_mib,
                "prefetch_mib": args.prefetch_mib if args.prefetch_mib is not None else next(
                    key.default for key in CORE_CONFIG_KEYS if key.name == "fetch.chunk.cache.prefetch.max.size"
                ) // MIB,
                "repeat": args.repeat,
                "whole_segment_read_mib_per_s_median": rates,
                "whole_segment_read_mib_per_s_each": {
                    name: [round(size / MIB / t, 1) for t in value] for name, value in results.items()
                    if isinstance(value, list)
                },
                "ratio_to_direct_rsm_uncached": {k: round(v / baseline, 3) for k, v in rates.items()},
                **({"ratio_to_raw_boto3_ranged_gets": {
                    k: round(v / rates["raw_boto3_ranged_gets"], 3) for k, v in rates.items()
                }} if "raw_boto3_ranged_gets" in rates else {}),
                "direct_files": args.backend == "filesystem" and not args.no_direct,
                "files_reader": "a process of its own" if args.reader_process
                else "the bench's process, beside the agent",
                "cache_dir": str(args.cache_dir or "the run's temporary directory"),
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
                "gets_per_cold_segment_read": {
                    # The broker fetches the offset index first; that GET brings the chunk index along.
                    "direct_rsm_after_index_fetch": results["gets_per_cold_read_direct_uncached_after_index_fetch"],
                    "agent_stream_including_chunk_index": gets_stream,
                    f"agent_files_{args.window_mib}mib_windows_including_chunk_index": gets_files,
                    "agent_files_one_call_including_chunk_index": gets_files_one_call,
                },
                "agent_prefetched_chunks_total": prefetched,
                "copy_call_ms_median": round(1000 * statistics.median(copy_times), 1),
                "fetch_index_call_ms_median": round(1000 * statistics.median(index_times), 2),
                "index_type": IndexType.OFFSET.name,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
