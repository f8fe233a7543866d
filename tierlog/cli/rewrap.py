"""`tierlog rewrap`: re-wrap every encrypted segment's data key under the active key-encryption key, without
rewriting segment data; and the count of segments by the key id they are wrapped under (also for `verify bucket`).

Resumable: a segment already under the active key is skipped, so a run that was interrupted is simply run again.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tierlog.cli.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, CommandError, Settings
from tierlog.cli.output import ProgressBar, emit, print_table

log = logging.getLogger(__name__)
DEFAULT_THREADS = 8
# How often a run logs its progress (besides the bar on a terminal).
PROGRESS_INTERVAL_S = 10.0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "rewrap", parents=[common],
        help="re-wrap encrypted segments' data keys under the active key (encryption.key.pair.id)",
        description="Re-wrap the data key of every encrypted segment in the bucket under the active key-encryption "
                    "key (rsm encryption.key.pair.id), rewriting only the key slot of each packed index object: "
                    "segment data is not rewritten. The ring (encryption.key.pairs) must still hold every key the "
                    "segments are wrapped under. Resumable: segments already under the active key are skipped. "
                    "Exit 1 when some segment could not be rewrapped (each is listed).")
    p.add_argument("--bucket", help="s3://BUCKET[/PREFIX] or a directory (default: the rsm config's bucket)")
    p.add_argument("--dry-run", action="store_true",
                   help="rewrap nothing: count the segments by the key id their data key is wrapped under")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help=f"segments handled at once (default {DEFAULT_THREADS})")
    p.set_defaults(run=cmd_rewrap)


def rsm_config(settings: Settings, bucket: str) -> dict[str, Any]:
    """An rsm config for the bucket at `bucket` (s3://BUCKET[/PREFIX] or a directory) with the settings' key ring."""
    from rsm.keyring import CONFIG_KEYS, ENTRY_PROPERTIES, RING_PREFIX

    config: dict[str, Any]
    if bucket.startswith("s3://"):
        name, _, prefix = bucket.removeprefix("s3://").partition("/")
        config = {"storage.backend": "s3", "s3.bucket": name, "s3.prefix": prefix}
        config.update({k: v.value for k, v in settings.s3_settings().items() if v is not None})
    elif "://" in bucket:
        raise CommandError(f"rewrap reads s3:// buckets or directories, got {bucket!r}", EXIT_USAGE)
    else:
        config = {"storage.backend": "filesystem", "filesystem.root": bucket}
    for key in CONFIG_KEYS:
        value = settings.get(key.name)
        if value is not None:
            config[key.name] = value
    for key_id in (config.get("encryption.key.pairs") or "").split(","):
        for prop in ENTRY_PROPERTIES:
            name = f"{RING_PREFIX}{key_id.strip()}.{prop}"
            value = settings.get(name)
            if key_id.strip() and value is not None:
                config[name] = value
    return config


@dataclass
class KeyTally:
    """Segments by the key id their data key is wrapped under, and those that could not be read."""

    active: str | None
    by_key_id: Counter[str] = field(default_factory=Counter)
    unencrypted: int = 0
    failed: list[dict[str, str]] = field(default_factory=list)

    @property
    def retired(self) -> int:
        """Encrypted segments under a key id other than the active one."""
        return sum(n for key_id, n in self.by_key_id.items() if key_id != self.active)

    def as_json(self) -> dict[str, Any]:
        return {"active_key_id": self.active, "by_key_id": dict(sorted(self.by_key_id.items())),
                "retired": self.retired, "unencrypted": self.unencrypted, "failed": self.failed}


def _packed_index_keys(rsm: Any) -> Iterator[str]:
    from rsm.keys import INDEXES_SUFFIX, parse_object_key

    for info in rsm.backend.list(""):
        parsed = parse_object_key(info.key)
        if parsed is not None and parsed.suffix == INDEXES_SUFFIX:
            yield info.key


def tally_data_keys(settings: Settings, bucket: str) -> KeyTally:
    """Count the bucket's segments by the key id their data key is wrapped under (`verify bucket` reports it)."""
    from rlmm.errors import RemoteStorageError
    from rsm.manager import RemoteStorageManager

    config = rsm_config(settings, bucket)
    with RemoteStorageManager(config) as rsm:
        tally = KeyTally(config.get("encryption.key.pair.id") or None)
        for key in _packed_index_keys(rsm):
            try:
                key_id = rsm.data_key_id(key)
            except RemoteStorageError as exc:
                tally.failed.append({"object": key, "error": str(exc)})
                continue
            if key_id is None:
                tally.unencrypted += 1
            else:
                tally.by_key_id[key_id] += 1
    return tally


def data_key_check(settings: Settings, bucket: str) -> dict[str, Any] | None:
    """A `verify bucket` result row: segments under retired key ids; None when no key ring is configured."""
    if not settings.get("encryption.key.pairs"):
        return None
    tally = tally_data_keys(settings, bucket)
    advice = []
    if tally.retired:
        advice.append(f"{tally.retired} segment(s) still have their data key wrapped under a retired key id "
                      f"(not {tally.active!r}): run `tierlog rewrap` before removing those keys from the ring")
    return {
        "check": "segment data keys", "ok": not tally.failed,
        "detail": ", ".join(f"{n} under {key_id!r}" for key_id, n in sorted(tally.by_key_id.items()))
                  + f"{', ' if tally.by_key_id else ''}{tally.unencrypted} unencrypted, {tally.retired} under a "
                  f"retired key id, {len(tally.failed)} unreadable",
        "advice": advice, "keys": tally.as_json(),
    }


def cmd_rewrap(args: argparse.Namespace, settings: Settings) -> int:
    from rlmm.errors import RemoteStorageError
    from rsm.manager import RemoteStorageManager, RewrapOutcome

    if args.threads < 1:
        raise CommandError("--threads must be at least 1", EXIT_USAGE)
    bucket = settings.bucket_location(args.bucket)
    if args.dry_run:
        tally = tally_data_keys(settings, bucket)
        emit(args, tally.as_json(), lambda: _print_tally(tally))
        return EXIT_OK if not tally.failed else EXIT_PROBLEM
    config = rsm_config(settings, bucket)
    if not config.get("encryption.key.pair.id"):
        raise CommandError("rewrap needs the key to wrap under: set encryption.key.pair.id (and the ring, "
                           "encryption.key.pairs)", EXIT_USAGE)
    outcomes: Counter[str] = Counter()
    failed: list[dict[str, str]] = []
    with RemoteStorageManager(config) as rsm:
        keys = list(_packed_index_keys(rsm))

        def rewrap(key: str) -> tuple[str, str | None]:
            try:
                return rsm.rewrap_data_key(key).value, None
            except RemoteStorageError as exc:
                return key, str(exc)

        started = last_report = time.monotonic()
        with ProgressBar("rewrapping data keys", len(keys)) as bar, ThreadPoolExecutor(args.threads) as pool:
            for done, (outcome, error) in enumerate(pool.map(rewrap, keys), start=1):
                if error is None:
                    outcomes[outcome] += 1
                else:
                    failed.append({"object": outcome, "error": error})
                bar.update(done)
                if time.monotonic() - last_report >= PROGRESS_INTERVAL_S:
                    last_report = time.monotonic()
                    log.warning("rewrap: %d of %d segments done (%.0f/s)", done, len(keys),
                                done / (last_report - started))
    payload = {
        "active_key_id": config["encryption.key.pair.id"], "segments": len(keys),
        **{outcome.value: outcomes[outcome.value] for outcome in RewrapOutcome}, "failed": failed,
    }

    def human() -> None:
        print(f"{len(keys)} segments: {outcomes['rewrapped']} rewrapped under {payload['active_key_id']!r}, "
              f"{outcomes['current']} already under it, {outcomes['unencrypted']} unencrypted, "
              f"{outcomes['gone']} deleted meanwhile, {len(failed)} failed")
        if failed:
            print_table(failed, ["object", "error"])
            print("\nfix what the errors say (a key missing from the ring?) and run rewrap again: segments done "
                  "are skipped")

    emit(args, payload, human)
    return EXIT_OK if not failed else EXIT_PROBLEM


def _print_tally(tally: KeyTally) -> None:
    rows = [{"key id": key_id, "segments": n, "active": key_id == tally.active}
            for key_id, n in sorted(tally.by_key_id.items())]
    print_table(rows, ["key id", "segments", "active"])
    print(f"\n{tally.unencrypted} unencrypted segments, {tally.retired} under a retired key id")
    if tally.failed:
        print_table(tally.failed, ["object", "error"])
