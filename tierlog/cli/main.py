"""The `tierlog` command's parser and entry point.

Exit codes: 0 success; 1 a check found a problem (verify mismatch, reconcile findings, replay diff);
2 bad usage or configuration; 3 a service, file or resource the command needs is missing or unreachable.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tierlog.cli.archive import cmd_agent, cmd_archive
from tierlog.cli.common import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, CommandError, Settings, read_properties
from tierlog.cli.inspect import cmd_describe, cmd_segments
from tierlog.cli.jobs import cmd_reconcile, cmd_replay, cmd_snapshot, cmd_usage
from tierlog.cli.plugin import cmd_plugin_path
from tierlog.cli.verify import cmd_rebuild, cmd_verify


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tierlog",
        description="Kafka tiered storage: run the agent, inspect and verify metadata, run pipeline jobs.",
        epilog="exit codes: 0 ok, 1 a check found a problem, 2 bad usage or config, 3 something needed "
               "is missing or unreachable. Kafka and S3 default to KAFKA_BOOTSTRAP / S3_* "
               "(or .dev/services.env).",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path,
                        help="properties file (bootstrap.servers, state.dir, s3.bucket, ...)")
    common.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a config entry overriding the file (repeatable)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    spark_opts = argparse.ArgumentParser(add_help=False)
    spark_opts.add_argument("--master", help="Spark master (default local[*], or spark-submit's)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("agent", parents=[common], help="run the agent (rlmm + rsm over gRPC) for a broker")
    p.add_argument("--socket", required=True, help="Unix domain socket path to serve on")
    p.add_argument("--metrics-port", type=int, help="Prometheus port (0 picks one)")
    p.add_argument("--metrics-address", default="127.0.0.1", help="address the metrics port binds to (0.0.0.0: all)")
    p.add_argument("--archive", action="store_true",
                   help="also run the audit archiver (or archive.enable=true)")
    p.set_defaults(run=cmd_agent)

    p = sub.add_parser("describe", parents=[common], help="a topic's or partition's remote segments, states, "
                                                          "epochs and sizes")
    p.add_argument("topic", help="topic name or topic id")
    p.add_argument("partition", nargs="?", type=int, help="one partition (adds its segment list)")
    p.add_argument("--state-dir", help="a node's state.dir (read-only)")
    p.set_defaults(run=cmd_describe)

    p = sub.add_parser("segments", parents=[common], help="list remote segments")
    p.add_argument("--topic")
    p.add_argument("--partition", type=int)
    p.add_argument("--state",
                   choices=["COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED", "DELETE_SEGMENT_STARTED"])
    p.add_argument("--state-dir", help="a node's state.dir (read-only)")
    p.set_defaults(run=cmd_segments)

    p = sub.add_parser("verify", parents=[common, spark_opts],
                       help="check a view against the topic or the bucket")
    p.add_argument("against", choices=["topic", "bucket", "all"], nargs="?", default="topic")
    p.add_argument("--state-dir", help="a node's state.dir (read-only)")
    p.add_argument("--bucket", help="s3://BUCKET[/PREFIX] or a directory (default: the rsm config's)")
    p.add_argument("--hashed-keys", action="store_true", help="objects use storage.hash.prefix=true")
    p.set_defaults(run=cmd_verify)

    p = sub.add_parser("rebuild", parents=[common], help="build a node's view from the topic or a snapshot")
    p.add_argument("--state-dir", help="an empty state dir to build into")
    p.add_argument("--snapshot", help="a snapshot file from `tierlog snapshot` (default: the topic)")
    p.add_argument("--no-catch-up", action="store_true", help="after a snapshot, do not read the topic")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    p.set_defaults(run=cmd_rebuild)

    archive_opt = argparse.ArgumentParser(add_help=False)
    archive_opt.add_argument("--archive", help="archive location: s3://BUCKET[/PREFIX] or a directory "
                                               "(default: archive.location, else the segments' bucket)")

    p = sub.add_parser("replay", parents=[common, spark_opts, archive_opt],
                       help="fold the audit archive; with --state-dir, diff it against that view")
    p.add_argument("--state-dir", help="a node's state.dir to compare with")
    p.add_argument("--partitions", action="store_true", help="also list each user partition's state")
    p.set_defaults(run=cmd_replay)

    p = sub.add_parser("reconcile", parents=[common, spark_opts, archive_opt],
                       help="orphans, missing objects and size mismatches between bucket and metadata")
    p.add_argument("--bucket", help="s3://BUCKET[/PREFIX] or a directory holding the segments")
    p.add_argument("--state-dir", help="take the live metadata from this view instead of the archive")
    p.add_argument("--report-dir", help="write report.json and delete-plan.txt here")
    p.add_argument("--delete", action="store_true", help="delete the orphans (the delete plan)")
    p.add_argument("--hashed-keys", action="store_true", help="objects use storage.hash.prefix=true")
    p.set_defaults(run=cmd_reconcile)

    p = sub.add_parser("usage", parents=[common, spark_opts, archive_opt],
                       help="remote bytes and segments per topic and partition over time")
    p.add_argument("--out", required=True, help="directory for usage.csv and usage.png")
    p.add_argument("--bucket-minutes", type=int, default=60, help="time bucket width (default 60)")
    p.set_defaults(run=cmd_usage)

    p = sub.add_parser("snapshot", parents=[common, spark_opts, archive_opt],
                       help="build a bootstrap snapshot from the audit archive")
    p.add_argument("--out", required=True, help="snapshot file to write")
    p.set_defaults(run=cmd_snapshot)

    p = sub.add_parser("archive", parents=[common, archive_opt],
                       help="copy the metadata topic into the audit archive")
    p.add_argument("--once", action="store_true", help="archive what is there now, then exit")
    p.add_argument("--group", action="store_true",
                   help="share the metadata partitions with other archivers in a consumer group")
    p.add_argument("--instance-id", help="static group membership id (restarts take over at once)")
    p.set_defaults(run=cmd_archive)

    p = sub.add_parser("plugin-path", help="print the Kafka plugin jar's path (for remote.log.*.class.path)")
    p.set_defaults(run=cmd_plugin_path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    try:
        config = read_properties(args.config) if args.config else {}
        for option in args.option:
            key, sep, value = option.partition("=")
            if not sep or not key:
                raise CommandError(f"-o expects KEY=VALUE, got {option!r}", EXIT_USAGE)
            config[key.strip()] = value.strip()
        return int(args.run(args, Settings(config)))
    except CommandError as exc:
        print(f"tierlog {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (head, less) went away; nothing is wrong with the command itself.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        from rlmm.errors import ConfigError, RemoteStorageError

        if isinstance(exc, ConfigError):
            print(f"tierlog {args.command}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(exc, RemoteStorageError):
            print(f"tierlog {args.command}: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        raise


if __name__ == "__main__":
    sys.exit(main())
