"""How `tierlog` shows results: tables for people, `--json` for scripts, a progress bar on terminals."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    if not rows:
        print("(none)", file=out)
        return
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(), file=out)
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip(), file=out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{count} B"


def emit(args: argparse.Namespace, payload: Any, human: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))
    else:
        human()


class ProgressBar:
    """A one-line progress bar on stderr; silent when stderr is not a terminal unless forced."""

    def __init__(self, label: str, total: int | None, enabled: bool | None = None) -> None:
        self.label = label
        self.total = total
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self._last_draw = 0.0

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last_draw < 0.2):
            return
        self._last_draw = now
        rate = done / max(now - self.started, 1e-6)
        if self.total:
            fraction = min(done / self.total, 1.0)
            bar = "#" * int(fraction * 30)
            line = f"{self.label} [{bar:<30}] {done}/{self.total} ({fraction:.0%}, {rate:,.0f}/s)"
        else:
            line = f"{self.label} {done} records ({rate:,.0f}/s)"
        print("\r" + line, end="", file=sys.stderr, flush=True)

    def finish(self, done: int) -> None:
        self.update(done, force=True)
        if self.enabled:
            print(file=sys.stderr)
