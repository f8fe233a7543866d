"""How `tierlog` shows results: tables for people, `--json` for scripts, a progress bar on terminals."""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import uuid
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


def format_id(value: uuid.UUID | str, uuid_format: str) -> str:
    """A topic or segment id as the user asked: Kafka's base64 form (what broker logs print) or hex."""
    from rlmm.types import kafka_uuid_text

    parsed = value if isinstance(value, uuid.UUID) else uuid.UUID(value)
    return str(parsed) if uuid_format == "hex" else kafka_uuid_text(parsed)


class ProgressBar:
    """A progress bar with rate and ETA on stderr, drawn by rich; silent unless stderr is a terminal."""

    def __init__(self, label: str, total: int | None, enabled: bool | None = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress: Progress | None = None
        self._terminal: TextIO | None = None
        if self.enabled:
            # A copy of the terminal's descriptor: while Spark's JVM starts, descriptor 2 points at its log
            # (tierlog.pipeline.session), and the bar keeps drawing on the terminal meanwhile.
            try:
                self._terminal = os.fdopen(os.dup(sys.stderr.fileno()), "w")
            except (AttributeError, OSError, io.UnsupportedOperation):
                self._terminal = None
            console = Console(file=self._terminal or sys.stderr, force_terminal=True)
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"),
                TimeRemainingColumn(), console=console, transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(label, total=total)

    def update(self, done: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done)

    def finish(self, done: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done)
        self._stop()

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._terminal is not None:
            self._terminal.close()
            self._terminal = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *_: object) -> None:
        # A failing command still gives the terminal its cursor back.
        self._stop()
