"""What `tierlog --version` and `--help` show a person: the version, and help text for every option.

No services needed.
"""

from __future__ import annotations

import argparse
from importlib.metadata import version

import pytest

from tierlog.cli import main
from tierlog.cli.main import build_parser


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"tierlog {version('tierlog')}"


def _parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found = {"tierlog": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update({f"tierlog {name}": sub for name, sub in action.choices.items()})
    return found


def test_every_option_and_argument_of_every_command_has_help_text() -> None:
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, parser in _parsers(build_parser()).items()
        for action in parser._actions
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert missing == []


def test_every_command_is_described_in_the_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name in _parsers(build_parser()):
        if name != "tierlog":
            assert name.split()[1] in out
