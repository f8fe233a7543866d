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
from tierlog.cli.bucket import add_bucket_check_options
from tierlog.cli.common import (
    DEFAULT_TIMEOUT_S,
    DEV_ENV_VAR,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    KAFKA_LOGGER,
    CommandError,
    Settings,
    dev_mode,
    read_properties,
)
from tierlog.cli.explain import cmd_config
from tierlog.cli.export import add_parser as add_export_parser
from tierlog.cli.inspect import cmd_describe, cmd_segments
from tierlog.cli.jobs import add_reconcile_options, cmd_reconcile, cmd_replay, cmd_snapshot, cmd_usage
from tierlog.cli.migrate import add_parser as add_migrate_parser
from tierlog.cli.plugin import cmd_plugin_path
from tierlog.cli.restore import add_parser as add_restore_parser
from tierlog.cli.rewrap import add_parser as add_rewrap_parser
from tierlog.cli.verify import cmd_rebuild, cmd_verify
from tierlog.cli.verify_migration import add_options as add_verify_migration_options


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tierlog",
        description="Kafka tiered storage: run the agent, inspect and verify metadata, run pipeline jobs.",
        epilog="exit codes: 0 ok, 1 a check found a problem, 2 bad usage or config, 3 something needed "
               "is missing or unreachable. Settings come from --config (a tierlog properties file or a "
               "broker's server.properties) and -o; `tierlog config --explain` shows where each came from.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, metavar="FILE",
                        help="properties file: tierlog keys (bootstrap.servers, state.dir, s3.bucket, ...) or a "
                             "broker's server.properties (its rlmm.config.* / rsm.config.* keys)")
    common.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a config entry overriding the file (repeatable)")
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument("-v", "--verbose", action="store_true",
                        help="log progress details, Kafka client and Spark logs included")
    common.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"give up on a service that does not answer after this long "
                             f"(default {DEFAULT_TIMEOUT_S:.0f})")
    common.add_argument("--uuid-format", choices=["kafka", "hex"], default="kafka",
                        help="how topic and segment ids are printed: kafka (base64, as broker logs print "
                             "them; the default) or hex; both forms are accepted as input")
    common.add_argument("--dev", action="store_true",
                        help=f"development: also read KAFKA_BOOTSTRAP / S3_* and .dev/services.env "
                             f"(or set {DEV_ENV_VAR}=1)")
    spark_opts = argparse.ArgumentParser(add_help=False)
    spark_opts.add_argument("--master", help="Spark master (default local[*], or spark-submit's)")
    # replay and usage run in-process on a small archive; verify bucket and reconcile have their own --spark.
    spark_choice = argparse.ArgumentParser(add_help=False)
    spark_choice.add_argument("--spark", action="store_true",
                              help="run on Spark even for a small archive (large ones, or --master, always do)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("agent", parents=[common], help="run the agent (rlmm + rsm over gRPC) for a broker",
                       description="Run the agent for a broker. With --config SERVER.PROPERTIES its rlmm and rsm "
                                   "get what the broker would hand its plugins (rlmm.config.*, rsm.config.*, the "
                                   "listener, node.id, log.dirs), as `tierlog config --explain` shows them.")
    p.add_argument("--socket", help="Unix domain socket path to serve on (default: agent.socket.path, else where "
                                    "the broker's adapter looks: $XDG_STATE_HOME/tierlog/agent-<node.id>.sock)")
    p.add_argument("--metrics-port", type=int, help="Prometheus port, 0 picks one (default: agent.metrics.port)")
    p.add_argument("--metrics-address", help="address the metrics port binds to, 0.0.0.0 for all "
                                             "(default: agent.metrics.address, else 127.0.0.1)")
    p.set_defaults(run=cmd_agent)

    p = sub.add_parser("describe", parents=[common], help="a topic's or partition's remote segments, states, "
                                                          "epochs and sizes")
    p.add_argument("topic", help="topic name or topic id")
    p.add_argument("partition", nargs="?", type=int, help="one partition (adds its segment list)")
    p.add_argument("--state-dir", help="a node's state.dir (read-only)")
    p.set_defaults(run=cmd_describe)

    p = sub.add_parser("segments", parents=[common], help="list remote segments")
    p.add_argument("--topic", help="only this topic (name or id, Kafka or hex form)")
    p.add_argument("--partition", type=int, help="only this partition")
    p.add_argument("--state", help="only segments in this state",
                   choices=["COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED", "DELETE_SEGMENT_STARTED"])
    p.add_argument("--state-dir", help="a node's state.dir (read-only)")
    p.set_defaults(run=cmd_segments)

    p = sub.add_parser("verify", parents=[common, spark_opts],
                       help="check a view against the topic or the bucket")
    p.add_argument("against", choices=["topic", "bucket", "all", "migration"], nargs="?", default="topic",
                   help="what to check the view against (default topic); migration: tierlog's metadata topic "
                        "against Kafka's __remote_log_metadata, partition by partition")
    p.add_argument("--state-dir", help="a node's state.dir (read-only)")
    add_bucket_check_options(p)
    add_verify_migration_options(p)
    p.set_defaults(run=cmd_verify)

    p = sub.add_parser("rebuild", parents=[common],
                       help="build a node's view from the metadata topic (needs Kafka) or a snapshot",
                       description="Build a node's view into an empty state dir, with the node stopped. It reads the "
                                   "metadata topic from Kafka (after loading --snapshot, from the snapshot's offsets "
                                   "on); only --snapshot FILE --no-catch-up works without Kafka, and the node then "
                                   "reads the rest of the topic when it starts.")
    p.add_argument("--state-dir", help="an empty state dir to build into")
    p.add_argument("--snapshot", help="a snapshot file from `tierlog snapshot` (default: the topic)")
    p.add_argument("--no-catch-up", action="store_true",
                   help="after a snapshot, do not read the topic (no Kafka needed)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    p.set_defaults(run=cmd_rebuild)

    archive_opt = argparse.ArgumentParser(add_help=False)
    archive_opt.add_argument("--archive", help="archive location: s3://BUCKET[/PREFIX] or a directory "
                                               "(default: archive.location, else the segments' bucket)")

    p = sub.add_parser("replay", parents=[common, spark_opts, spark_choice, archive_opt],
                       help="fold the audit archive; with --state-dir, diff it against that view")
    p.add_argument("--state-dir", help="a node's state.dir to compare with")
    p.add_argument("--partitions", action="store_true", help="also list each user partition's state")
    p.set_defaults(run=cmd_replay)

    p = sub.add_parser("reconcile", parents=[common, spark_opts, archive_opt],
                       help="orphans, missing objects and size mismatches between bucket and metadata")
    p.add_argument("--state-dir", help="take the live metadata from this view (default: the metadata topic)")
    p.add_argument("--report-dir", help="write report.json and delete-plan.txt here")
    add_reconcile_options(p)
    add_bucket_check_options(p)
    p.set_defaults(run=cmd_reconcile)

    p = sub.add_parser("usage", parents=[common, spark_opts, spark_choice, archive_opt],
                       help="remote bytes and segments per topic and partition over time")
    p.add_argument("--out", required=True, help="directory for usage.csv and usage.png")
    p.add_argument("--bucket-minutes", type=int, default=60, help="time bucket width (default 60)")
    p.set_defaults(run=cmd_usage)

    p = sub.add_parser("snapshot", parents=[common, spark_opts, archive_opt],
                       help="build a bootstrap snapshot from the audit archive")
    p.add_argument("--out", required=True, help="snapshot file to write")
    p.set_defaults(run=cmd_snapshot)

    p = sub.add_parser("archive", parents=[common, archive_opt],
                       help="copy the metadata topic into the audit archive (and, with snapshot.location, write "
                            "bootstrap snapshots)")
    p.add_argument("--once", action="store_true", help="archive what is there now, then exit")
    p.add_argument("--metrics-port", type=int,
                   help="serve the archiver's Prometheus metrics on this port (0 picks one)")
    p.add_argument("--metrics-address", default="127.0.0.1", help="address the metrics port binds to (0.0.0.0: all)")
    p.set_defaults(run=cmd_archive)

    p = sub.add_parser("config", parents=[common],
                       help="the settings tierlog would use; with --explain, which file and key each came from")
    p.add_argument("--explain", action="store_true", help="also say where each setting came from")
    p.set_defaults(run=cmd_config)

    add_migrate_parser(sub, common)
    add_export_parser(sub, common)
    add_restore_parser(sub, common)
    add_rewrap_parser(sub, common)

    p = sub.add_parser("plugin-path", help="print the Kafka plugin jar's path (for remote.log.*.class.path)")
    p.set_defaults(run=cmd_plugin_path)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tierlog")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", False)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    # librdkafka retries a refused connection for ever, logging each attempt; the command reports the
    # failure itself in one line, so those lines are shown only with -v.
    logging.getLogger(KAFKA_LOGGER).setLevel(logging.DEBUG if verbose else logging.CRITICAL + 1)
    try:
        config_file = getattr(args, "config", None)
        config = read_properties(config_file) if config_file else {}
        overrides: dict[str, str] = {}
        for option in getattr(args, "option", []):
            key, sep, value = option.partition("=")
            if not sep or not key:
                raise CommandError(f"-o expects KEY=VALUE, got {option!r}", EXIT_USAGE)
            overrides[key.strip()] = value.strip()
        settings = Settings(config, overrides, config_file=config_file, dev=dev_mode(getattr(args, "dev", False)),
                            timeout_s=getattr(args, "timeout", DEFAULT_TIMEOUT_S))
        return int(args.run(args, settings))
    except CommandError as exc:
        print(f"tierlog {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "pyspark":
            raise
        # Only what runs on Spark imports pyspark: small inputs run in this process without it.
        print(f"tierlog {args.command}: this needs Spark, which is not installed: pip install 'tierlog[spark]'",
              file=sys.stderr)
        return EXIT_UNAVAILABLE
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
