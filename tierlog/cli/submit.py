"""spark-submit entry point: runs one pipeline command of `tierlog` (replay, reconcile, usage, snapshot).

    spark-submit --master <cluster> --packages "$(python -m tierlog.cli.submit --packages)" \
        --py-files tierlog.zip tierlog/cli/submit.py replay --archive s3://bucket/prefix

The session then takes its master and packages from spark-submit; the job code is the same as local.
"""

from __future__ import annotations

import os
import sys

# Run as a file by spark-submit, Python puts this file's directory first on sys.path, where the CLI's
# modules would shadow the standard library's (tierlog/cli/inspect.py hides `inspect`): take it off, and
# make the repository's packages importable when they are not installed.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != _HERE]
_ROOT = os.path.dirname(os.path.dirname(_HERE))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

PIPELINE_COMMANDS = ("replay", "reconcile", "usage", "snapshot")
# The commands that run in-process on a small input unless given --spark.
SMALL_INPUT_COMMANDS = ("replay", "reconcile", "usage")


def main(argv: list[str]) -> int:
    from tierlog.pipeline.session import spark_packages

    if argv[:1] == ["--packages"]:
        print(",".join(spark_packages(with_s3=True)))
        return 0
    if not argv or argv[0] not in PIPELINE_COMMANDS:
        print(f"usage: spark-submit tierlog/cli/submit.py {{{','.join(PIPELINE_COMMANDS)}}} [options]; "
              "see `tierlog <command> --help`", file=sys.stderr)
        return 2
    from tierlog.cli import main as tierlog

    if argv[0] in SMALL_INPUT_COMMANDS:
        # Submitted to a cluster, the job runs there, whatever the size of its input.
        argv = [argv[0], "--spark", *argv[1:]]
    return tierlog(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
