"""Every config key of every storage backend is in rsm/README's config table, so operators find each one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rsm.backends import available_backends

README = Path(__file__).resolve().parents[2] / "rsm" / "README.md"


def documented_keys() -> set[str]:
    table = README.read_text(encoding="utf-8").split("## Config keys", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return {key for row in rows for key in re.findall(r"`([a-z0-9.]+)`", row)}


@pytest.mark.parametrize("name", sorted(available_backends()))
def test_every_config_key_of_the_backend_is_in_the_readme_table(name: str) -> None:
    keys = {key.name for key in available_backends()[name].CONFIG_KEYS}
    assert keys - documented_keys() == set()
