"""`tierlog config [--explain]`: the settings every other command would use, and where each came from."""

from __future__ import annotations

import argparse
from typing import Any

from tierlog.cli.common import EXIT_OK, CommandError, Setting, Settings
from tierlog.cli.output import emit, print_table

# Shown as set or not, never printed: the value is a credential.
SECRET_KEYS = frozenset({"s3.secret.access.key"})


def _entry(name: str, found: Setting | None, error: str | None = None) -> dict[str, Any]:
    if found is None:
        return {"setting": name, "value": None, "source": error or "not set"}
    value = "(set)" if name in SECRET_KEYS else found.value
    return {"setting": name, "value": value, "source": found.source}


def _try(name: str, get: Any) -> dict[str, Any]:
    try:
        return _entry(name, get())
    except CommandError as exc:
        return _entry(name, None, f"not set: {exc}")


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    entries = [
        _try("bootstrap.servers", settings.bootstrap_setting),
        _entry("metadata.topic.name", settings.metadata_topic_setting()),
        _entry("state.dir", settings.state_dir_setting()),
        _try("bucket", lambda: settings.bucket_setting(None)),
        _entry("archive.location", settings.lookup("archive.location")),
        *(_entry(name, found) for name, found in settings.s3_settings().items()),
        _entry("development mode", Setting("on", "--dev or TIERLOG_DEV=1") if settings.dev else None),
    ]

    def human() -> None:
        if settings.config_file is not None:
            print(f"config file: {settings.config_file.resolve()}\n")
        print_table(entries, ["setting", "value", "source"] if args.explain else ["setting", "value"])

    emit(args, {"config_file": str(settings.config_file) if settings.config_file else None,
                "settings": entries}, human)
    return EXIT_OK
