"""The progress bar: drawn with its count, elapsed time and ETA on a terminal, and nothing at all otherwise.

No services needed.
"""

from __future__ import annotations

import io
import os
import pty
import re

import pytest

from tierlog.cli.output import ProgressBar


def test_on_a_terminal_the_bar_shows_count_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    main_fd, terminal_fd = pty.openpty()
    with os.fdopen(terminal_fd, "w") as terminal:
        monkeypatch.setattr("sys.stderr", terminal)
        with ProgressBar("reading topic", 200) as bar:
            bar.update(100)
            bar.finish(200)
    drawn = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the terminal side is closed: all is read
            break
        if not chunk:
            break
        drawn += chunk
    os.close(main_fd)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn.decode())  # drop colours and cursor moves
    assert "reading topic" in text and "200/200" in text
    assert re.search(r"eta \d+:\d\d:\d\d", text)


def test_off_a_terminal_the_bar_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    captured = io.StringIO()
    monkeypatch.setattr("sys.stderr", captured)
    with ProgressBar("reading topic", 200) as bar:
        bar.update(100)
        bar.finish(200)
    assert captured.getvalue() == ""
