"""A Java consumer reading a tiered topic from offset 0 through a real broker: tierlog's plugins (agent, rsm on the
filesystem backend with its disk chunk cache, the adapter reading the cache's files) against the same broker config
with Kafka's own TopicBasedRemoteLogMetadataManager and in-JVM LocalTieredStorage (the kafka-storage test-fixtures
jar dev/kafka fetches), over the same records. One broker at a time, the first read cold, then warm ones.

Usage: python bench/broker_tiered_read.py [--mib 128] [--segment-mib 16] [--repeat 3] [--rounds 1] [--split]
[--consumer throughput|perf-test]; prints one JSON document. The brokers run with the full JIT (C2), as in
production; `--split` adds tierlog's rsm beside Kafka's TBRLMM. The reader is bench/broker_read/ConsumerThroughput.java
(assigns the partition, reads from offset 0 to the end offset), or with `--consumer perf-test` Kafka's own
kafka-consumer-perf-test (org.apache.kafka.tools.ConsumerPerformance from the kafka-tools jar, fetched with Maven into
.dev/ once; joins a new group per read, timed by its fetch time, without the group's join).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dev.demo import (  # noqa: E402
    KAFKA_LOCAL_RSM,
    KAFKA_RLMM,
    PluginChoice,
    S3Location,
    broker_properties,
    create_topic,
    ensure_plugin_jar,
    local_segment_offsets,
    produce,
    prometheus_samples,
    tiered_topic_config,
    wait_for,
)
from dev.kafka import KafkaCluster, ensure_kafka_libs, java_executable, kafka_version  # noqa: E402
from dev.process import free_ports  # noqa: E402

MIB = 1 << 20
RECORD_BYTES = 1000
CONSUMER_SOURCE = Path(__file__).resolve().parent / "broker_read" / "ConsumerThroughput.java"
TOPIC = "bench"
FULL_JIT = ("-XX:TieredStopAtLevel=4",)


def _compile_consumer(libs: Path, out: Path) -> str:
    """The consumer's classpath, after compiling it against the broker's own kafka-clients jar."""
    clients = next(libs.glob("kafka-clients-*.jar"))
    subprocess.run(["javac", "-cp", str(clients), "-d", str(out), str(CONSUMER_SOURCE)], check=True)
    return f"{out}:{libs}/*"


def _perf_test_classpath(libs: Path) -> str:
    """kafka-consumer-perf-test's classpath: the kafka-tools jar of the broker's version (fetched with Maven into
    .dev/ the first time) before the broker's own jars."""
    version = kafka_version()
    tools = REPO_ROOT / ".dev" / f"kafka-tools-{version}"
    jar = tools / f"kafka-tools-{version}.jar"
    if not jar.exists():
        # Maven's output goes to stderr: the JSON goes to stdout.
        subprocess.run(
            ["mvn", "-q", "-B", "-Dstyle.color=never", "dependency:copy",
             f"-Dartifact=org.apache.kafka:kafka-tools:{version}", f"-DoutputDirectory={tools}"],
            check=True, stdout=sys.stderr,
        )
    return f"{jar}:{libs}/*"


def _consume(consumer: str, classpath: str, bootstrap: str, records: int) -> dict[str, Any]:
    """One read of the topic from offset 0 to its end: records, bytes (keys and values), seconds, MiB/s."""
    if consumer == "perf-test":
        command = [
            java_executable(), "-cp", classpath, "org.apache.kafka.tools.ConsumerPerformance",
            "--bootstrap-server", bootstrap, "--topic", TOPIC, "--num-records", str(records), "--hide-header",
            "--group", f"bench-{uuid.uuid4()}", "--timeout", "60000",
        ]
    else:
        command = [java_executable(), "-cp", classpath, "ConsumerThroughput", bootstrap, TOPIC, "600"]
    result = subprocess.run(command, check=True, capture_output=True, text=True, timeout=660)
    last = result.stdout.strip().splitlines()[-1]
    read: dict[str, Any]
    if consumer == "perf-test":
        # start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms,
        # fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec (MB = MiB)
        fields = [f.strip() for f in last.split(",")]
        read = {"records": int(fields[4]), "bytes": round(float(fields[2]) * MIB),
                "seconds": int(fields[7]) / 1000, "group_join_ms": int(fields[6])}
    else:
        read = json.loads(last)
    read["mib_per_s"] = round(read["bytes"] / MIB / read["seconds"], 1)
    return read


def _agent_calls(port: int) -> dict[str, tuple[float, float]]:
    """Per agent method: (calls, seconds spent answering them), from the agent's metrics endpoint."""
    samples = prometheus_samples(port)
    calls: dict[str, tuple[float, float]] = {}
    for sample, value in samples.items():
        if sample.startswith("tierlog_agent_call_seconds_count{"):
            method = sample.split('method="', 1)[1].split('"', 1)[0]
            total = samples[sample.replace("_count{", "_sum{", 1)]
            calls[method] = (value, total)
    return calls


def _agent_calls_during(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
                        reads: int) -> dict[str, dict[str, float]]:
    """The agent's calls per read of the topic and their mean latency, between two `_agent_calls` snapshots."""
    during = {}
    for method, (count, seconds) in after.items():
        calls = count - before.get(method, (0.0, 0.0))[0]
        if calls > 0:
            spent = seconds - before.get(method, (0.0, 0.0))[1]
            during[method] = {"calls_per_read": round(calls / reads), "mean_ms": round(1000 * spent / calls, 2)}
    return during


def _agent_cpu_s(sockets: Path) -> float:
    """CPU seconds (user and system) the agent serving a socket under `sockets` has used so far; 0.0 if none runs."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
            if b"--socket" in args and args[args.index(b"--socket") + 1].startswith(str(sockets).encode()):
                fields = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            continue  # exited while looked at
    return 0.0


def _wait_all_tiered(log_dir: Path, records: int) -> None:
    """Wait until the broker holds only an empty active segment locally: every record tiered and none left to copy,
    so no copy runs during the reads and every broker reads the same bytes remotely. (With local.retention.ms the
    broker rolls an expired active segment too, so "only the active segment left" alone is a passing state.)"""
    wait_for(lambda: local_segment_offsets(log_dir, TOPIC) == [records], 600,
             f"{TOPIC}-0 to hold only an empty active segment at offset {records} locally")


def _remote_logs(root: Path) -> list[int]:
    """Sizes of the non-empty `.log` objects under a remote storage root (both RSMs store one per segment, named
    `<start offset>-<segment id>.log`), in offset order."""
    logs = sorted(root.rglob("*.log"), key=lambda p: int(p.name.split("-", 1)[0]))
    return [size for p in logs if (size := p.stat().st_size) > 0]


def _run(name: str, choice: PluginChoice, sockets: Path, base: Path, args: argparse.Namespace,
         classpath: str, remote_root: Path) -> dict[str, Any]:
    """Start a broker with `choice`, tier `args.mib` of records, read them `args.repeat` times from offset 0."""
    records = args.mib * MIB // RECORD_BYTES
    properties = broker_properties(choice, sockets, ensure_plugin_jar())
    # The dev cluster's brokers stop the JIT at C1 to start fast in tests; a throughput benchmark runs the broker as
    # production does (C2), the same for both plugins.
    with KafkaCluster(base / name, 1, properties=properties, jvm_options=FULL_JIT) as kafka:
        create_topic(kafka.bootstrap, TOPIC, config=tiered_topic_config(**{
            "segment.bytes": str(args.segment_mib * MIB),
        }))
        started = time.monotonic()
        produce(kafka.bootstrap, TOPIC, 0, records, size=RECORD_BYTES)
        _wait_all_tiered(kafka.log_dir(0), records)
        tiered_s = time.monotonic() - started
        remote_sizes = _remote_logs(remote_root)
        port = choice.metrics_port
        before = {} if port is None else _agent_calls(port)
        cpu = [_agent_cpu_s(sockets)]
        reads = [_consume(args.consumer, classpath, kafka.bootstrap, records)]
        after_cold = {} if port is None else _agent_calls(port)
        cpu.append(_agent_cpu_s(sockets))
        reads += [_consume(args.consumer, classpath, kafka.bootstrap, records) for _ in range(args.repeat - 1)]
        cpu.append(_agent_cpu_s(sockets))
        agent = None if port is None else {
            "cold_read": _agent_calls_during(before, after_cold, 1),
            "warm_reads": _agent_calls_during(after_cold, _agent_calls(port), max(args.repeat - 1, 1)),
            # The agent's own CPU time (user + system) per read: what it takes from the broker and the consumer.
            "agent_cpu_s": {"cold_read": round(cpu[1] - cpu[0], 2),
                            "per_warm_read": round((cpu[2] - cpu[1]) / max(args.repeat - 1, 1), 2)},
        }
    if any(r["records"] != records for r in reads):
        raise AssertionError(f"{name}: a read did not return all {records} records: {reads}")
    return {
        "records": records,
        "remote_segments": len(remote_sizes),
        "remote_segment_mib": [round(size / MIB, 2) for size in remote_sizes],
        "remote_mib_read": round(sum(remote_sizes) / MIB, 1),
        "produce_and_tier_s": round(tiered_s, 1),
        "cold_mib_per_s": reads[0]["mib_per_s"],
        # Seconds from the first poll to the first record, cold read first (the consumer perf-test does not say).
        **({"first_record_s": [r["first_record_s"] for r in reads]} if "first_record_s" in reads[0] else {}),
        "warm_mib_per_s": [r["mib_per_s"] for r in reads[1:]],
        "median_mib_per_s": statistics.median(r["mib_per_s"] for r in reads),
        # Other work on the machine slows a broker's reads: the 1-minute load average right after them.
        "load_average_1m_after_reads": round(os.getloadavg()[0], 2),
        **({} if agent is None else {"agent_calls_during_reads": agent}),
    }


def _round(args: argparse.Namespace, base: Path, sockets: Path, classpath: str, turn: int) -> dict[str, Any]:
    """One broker per plugin choice, each tiering and reading the same records; the order rotates with `turn`, so
    over rounds none is always first (right after the previous broker's shutdown) or last."""
    base.mkdir()
    # broker_properties wants an S3 location for tierlog's rsm; the filesystem backend overrides it.
    unused_s3 = S3Location("http://127.0.0.1:1", "unused", "unused", "unused", "unused")
    rsm = {
        "rsm.config.storage.backend": "filesystem",
        "rsm.config.filesystem.root": str(base / "tierlog-remote"),
        "rsm.config.fetch.chunk.cache.class": "disk",
        "rsm.config.fetch.chunk.cache.path": str(base / "tierlog-cache"),
        **({} if args.files_window_mib is None else {
            "rsm.config.agent.fetch.files.window.bytes": str(args.files_window_mib * MIB),
        }),
    }
    runs = {
        "tierlog": lambda: _run("tierlog", PluginChoice(s3=unused_s3, metrics_port=free_ports(1)[0], extra=rsm),
                                sockets, base, args, classpath, base / "tierlog-remote"),
        "kafka_local_tiered_storage": lambda: _run(
            "kafka", PluginChoice(rlmm=KAFKA_RLMM, rsm=KAFKA_LOCAL_RSM, local_tiered_storage_dir=base / "local-tiered"),
            sockets, base, args, classpath, base / "local-tiered"),
    }
    if args.split:
        runs["tierlog_rsm_with_tbrlmm"] = lambda: _run(
            "tierlog-rsm", PluginChoice(rlmm=KAFKA_RLMM, s3=unused_s3, metrics_port=free_ports(1)[0], extra={
                **rsm, "rsm.config.filesystem.root": str(base / "tierlog-remote-2"),
                "rsm.config.fetch.chunk.cache.path": str(base / "tierlog-cache-2"),
            }), sockets, base, args, classpath, base / "tierlog-remote-2")
    names = list(runs)
    order = names[turn % len(names):] + names[:turn % len(names)]
    done = {name: runs[name]() for name in order}
    results = {name: done[name] for name in names}
    theirs = results["kafka_local_tiered_storage"]
    tiered = {name: (r["remote_segments"], r["remote_mib_read"]) for name, r in results.items()}
    if len(set(tiered.values())) > 1:
        print(f"warning: the brokers tiered different segments (count, MiB): {tiered}", file=sys.stderr)
    return {
        "order": order,
        **results,
        **{f"ratio_{name}_to_kafka": {
            "cold": round(result["cold_mib_per_s"] / theirs["cold_mib_per_s"], 3),
            "median": round(result["median_mib_per_s"] / theirs["median_mib_per_s"], 3),
        } for name, result in results.items() if result is not theirs},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128, help="MiB of records in the topic")
    parser.add_argument("--segment-mib", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="reads per broker (the first one cold)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times the whole comparison runs, each with fresh brokers, in rotating order; a cold "
                             "read is one read per broker, so several rounds show how much its ratio varies")
    parser.add_argument("--files-window-mib", type=int, default=None,
                        help="the adapter's agent.fetch.files.window.bytes in MiB (default: the adapter's, 8)")
    parser.add_argument("--split", action="store_true",
                        help="also tierlog's rsm beside Kafka's TBRLMM: what the rsm's path costs without the rlmm's")
    parser.add_argument("--consumer", choices=("throughput", "perf-test"), default="throughput",
                        help="the reader: bench/broker_read/ConsumerThroughput.java, or kafka-consumer-perf-test")
    args = parser.parse_args()
    libs = ensure_kafka_libs()
    with tempfile.TemporaryDirectory(prefix="tlbr-") as tmp, tempfile.TemporaryDirectory(prefix="tl-") as sockets:
        base = Path(tmp)
        classpath = (_perf_test_classpath(libs) if args.consumer == "perf-test"
                     else _compile_consumer(libs, base / "classes"))
        rounds = [_round(args, base / f"round-{turn}", Path(sockets), classpath, turn) for turn in range(args.rounds)]
    ratios = {key: {kind: [r[key][kind] for r in rounds] for kind in ("cold", "median")}
              for key in rounds[0] if key.startswith("ratio_")}
    print(json.dumps({
        "benchmark": "broker_tiered_read",
        "topic_mib": args.mib,
        "segment_mib": args.segment_mib,
        "consumer": args.consumer,
        "record_bytes": RECORD_BYTES,
        "files_window_mib": args.files_window_mib or "adapter default (8)",
        "waited_for": "each broker holding only an empty active segment locally (every record tiered, no copy "
                      "left) before the first read; remote_segments and remote_mib_read are what it tiered",
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        **(rounds[0] if args.rounds == 1 else {
            "rounds": rounds,
            **{key: {**{f"{kind}_by_round": values for kind, values in by_kind.items()},
                     **{f"{kind}_median": statistics.median(values) for kind, values in by_kind.items()}}
               for key, by_kind in ratios.items()},
        }),
    }, indent=2))


if __name__ == "__main__":
    main()
