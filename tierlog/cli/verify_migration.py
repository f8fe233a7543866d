"""`tierlog verify migration`: for every user partition, what TopicBasedRemoteLogMetadataManager's store answers (its
`__remote_log_metadata` replayed under Kafka's rules) against what tierlog's metadata topic answers.

Compared per partition: the delete state, each listed segment (state, offsets, epochs, size, times, broker, custom
metadata), and per leader epoch the highest offset, the remote log size and the segment each lookup finds.
"""

from __future__ import annotations

import argparse
from typing import Any

from tierlog.cli.common import EXIT_OK, EXIT_PROBLEM, Settings
from tierlog.cli.kafka_metadata import compare_stores, require_source
from tierlog.cli.output import emit

SHOWN_LINES = 50


def cmd_verify_migration(args: argparse.Namespace, settings: Settings) -> int:
    source = require_source(settings, args.source_topic)
    found = compare_stores(settings, source, args.progress)
    differences, problems, read, ok = found.differences, found.problems, found.records, found.ok
    result: dict[str, Any] = {
        "ok": ok, "source_topic": source.name, "tierlog_topic": settings.metadata_topic(), "records": read,
        "partitions": found.partitions, "partitions_differing": len(differences),
        "differences": {str(tp): lines for tp, lines in differences.items()},
        "problems": [p.as_json() for p in problems],
    }

    def human() -> None:
        lines = [f"{tp}: {line}" for tp, found in differences.items() for line in found]
        lines += [f"not comparable: {problem}" for problem in problems]
        for line in lines[:SHOWN_LINES]:
            print(line)
        if len(lines) > SHOWN_LINES:
            print(f"... and {len(lines) - SHOWN_LINES} more (--json lists every one)")
        verdict = "agree" if ok else "DISAGREE"
        print(f"{source.name} ({read} records) and {settings.metadata_topic()} {verdict} on {found.partitions} user "
              f"partitions: {len(differences)} differ, {len(problems)} source records could not be read")

    emit(args, result, human)
    return EXIT_OK if ok else EXIT_PROBLEM


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options `tierlog verify migration` adds to `tierlog verify` (registered by tierlog.cli.main)."""
    from tierlog.cli.kafka_metadata import DEFAULT_SOURCE_TOPIC

    parser.add_argument("--source-topic", default=DEFAULT_SOURCE_TOPIC,
                        help=f"with `migration`: the topic TBRLMM wrote (default {DEFAULT_SOURCE_TOPIC})")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="with `migration`: show progress bars (default: when stderr is a terminal)")
