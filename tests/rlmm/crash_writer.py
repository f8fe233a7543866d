"""A broker's metadata writes in a process of its own, for the crash tests: kill it at any moment.

Usage: crash_writer.py CONFIG_JSON SEED TOPIC_IDS_JSON. Prints READY, then one SENT line before and one ACK
line after each write (JSON), flushed at once, so the parent knows which writes were acknowledged.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import uuid

from rlmm_testkit import ApiWrite, make_tp, register, submit, workload

from rlmm import RemoteLogMetadataManager, RemoteLogSegmentMetadata, RemotePartitionDeleteMetadata

_print_lock = threading.Lock()


def describe(write: ApiWrite) -> dict[str, object]:
    if isinstance(write, RemotePartitionDeleteMetadata):
        return {"kind": "partition", "state": write.state.name}
    segment_id = write.remote_log_segment_id
    kind = "add" if isinstance(write, RemoteLogSegmentMetadata) else "update"
    return {"kind": kind, "partition": segment_id.topic_id_partition.partition, "segment": str(segment_id.id),
            "state": write.state.name}


def report(tag: str, write: ApiWrite) -> None:
    with _print_lock:
        sys.stdout.write(f"{tag} {json.dumps(describe(write))}\n")
        sys.stdout.flush()


def main() -> None:
    config, seed, topic_id = json.loads(sys.argv[1]), int(sys.argv[2]), uuid.UUID(sys.argv[3])
    rng = random.Random(seed)
    tps = [make_tp("crash", p, topic_id=topic_id) for p in range(3)]
    manager = RemoteLogMetadataManager(config)
    register(manager, *tps)
    print("READY", flush=True)

    def run(writes: list[ApiWrite]) -> None:
        for write in writes:
            report("SENT", write)
            submit(manager, write).result(timeout=30)
            report("ACK", write)

    threads = [threading.Thread(target=run, args=(workload(rng, tp, uploads=200),)) for tp in tps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    manager.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
