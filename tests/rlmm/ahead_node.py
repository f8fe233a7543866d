"""A new node whose backlog's rest never loads, for the crash test of partitions loaded ahead: kill it at any moment.

Usage: ahead_node.py CONFIG_JSON HOSTED_JSON (the hosted partitions as [topic id, topic, partition]). With the
workers loading every group (MetadataApplier._load_in_workers), the rest of the group of metadata partition 1 (after
its hosted partitions, loaded ahead) waits for ever. Prints READY once every hosted partition is ready and metadata
partition 0 is loaded whole.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from typing import Any

from rlmm import RemoteLogMetadataManager, TopicIdPartition, applier, fresh_load
from rlmm.applier import MetadataApplier


def main() -> None:
    config, hosted = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    tps = {TopicIdPartition(uuid.UUID(topic_id), topic, partition) for topic_id, topic, partition in hosted}
    fresh_load.WORKER_MIN_KEPT = 1  # as the tests' backlogs: every one large
    applier.GROUP_WORKERS = 2
    submit, registered = fresh_load.FoldWorker.submit_group, threading.Event()

    def never_the_rest(self: fresh_load.FoldWorker, request: fresh_load.GroupRequest, under: Any) -> bool:
        if request.rest_of is not None and 1 in request.starts:  # taken, never done: no answer comes
            return True
        return submit(self, request, under)

    hosted_of = MetadataApplier._hosted

    def after_registration(self: MetadataApplier, *args: Any) -> dict[int, set[bytes]]:
        registered.wait(60)
        return hosted_of(self, *args)

    fresh_load.FoldWorker.submit_group = never_the_rest  # type: ignore[method-assign]
    MetadataApplier._hosted = after_registration  # type: ignore[method-assign,assignment]
    manager = RemoteLogMetadataManager(config)
    manager.on_partition_leadership_changes(tps, set())
    registered.set()
    deadline = time.monotonic() + 60
    while not all(manager.is_ready(tp) for tp in tps) or 0 not in manager.applied_offsets():
        if time.monotonic() > deadline:
            sys.exit("the hosted partitions did not get ready, or metadata partition 0 not loaded")
        time.sleep(0.01)
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()
