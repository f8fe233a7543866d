"""How `tierlog` reads its configuration: properties files, -o overrides, and the services environment.

No services needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlog.cli import main
from tierlog.cli.common import EXIT_USAGE, CommandError, Settings, read_properties


def test_a_properties_file_gives_keys_and_values_and_skips_comments(tmp_path: Path) -> None:
    path = tmp_path / "tierlog.properties"
    path.write_text("# a comment\n! another\nbootstrap.servers = 127.0.0.1:9092\n\nstate.dir=/var/tierlog\n")
    assert read_properties(path) == {"bootstrap.servers": "127.0.0.1:9092", "state.dir": "/var/tierlog"}


def test_a_properties_line_without_equals_is_rejected_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("bootstrap.servers=x\nstate.dir\n")
    with pytest.raises(CommandError) as raised:
        read_properties(path)
    assert raised.value.exit_code == EXIT_USAGE
    assert f"{path}:2" in str(raised.value)


def test_broker_style_prefixed_keys_are_found_by_their_plain_name() -> None:
    settings = Settings({"rlmm.bootstrap.servers": "b:1", "rsm.s3.bucket": "segments", "rsm.s3.prefix": "p/"})
    assert settings.bootstrap() == "b:1"
    assert settings.bucket_location(None) == "s3://segments/p"


def test_an_option_without_equals_exits_2_and_says_what_it_expects(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["segments", "--state-dir", "/nowhere", "-o", "state.dir"]) == EXIT_USAGE
    assert "-o expects KEY=VALUE" in capsys.readouterr().err
