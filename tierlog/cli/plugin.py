"""`tierlog plugin-path`: where the Kafka plugin jar of this installation is, for the broker's
`remote.log.metadata.manager.class.path` and `remote.log.storage.manager.class.path`.

A wheel carries the jar as tierlog/jars/tierlog-kafka-plugin.jar (setup.py); an editable install of a
checkout uses what Maven built in jvm/target/ (`make jvm`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tierlog.cli.common import EXIT_OK, EXIT_UNAVAILABLE, CommandError, Settings

JAR_NAME = "tierlog-kafka-plugin.jar"
_PACKAGE = Path(__file__).resolve().parent.parent


def plugin_jar() -> Path:
    """The installed plugin jar; CommandError (exit 3) naming where it looked when there is none."""
    packaged = _PACKAGE / "jars" / JAR_NAME
    if packaged.is_file():
        return packaged
    checkout = _PACKAGE.parent
    if (checkout / "pyproject.toml").is_file():
        built = sorted(p for p in (checkout / "jvm" / "target").glob("tierlog-kafka-plugin-*.jar")
                       if not p.name.startswith("original-"))
        if built:
            return built[-1]
        raise CommandError(f"no plugin jar in {packaged} or {checkout / 'jvm' / 'target'}; build it with "
                           "`make jvm` (a checkout) or install tierlog from its wheel", EXIT_UNAVAILABLE)
    raise CommandError(f"the plugin jar {packaged} is missing from this installation; reinstall tierlog "
                       "from its wheel (make dist)", EXIT_UNAVAILABLE)


def cmd_plugin_path(args: argparse.Namespace, settings: Settings) -> int:
    print(plugin_jar())
    return EXIT_OK
