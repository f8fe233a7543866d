"""The image installs tierlog the way an operator does: the wheel into a dedicated virtualenv, with the broker's
plugin path leading to that installation's jar (checked statically: there is no Docker engine here)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"


def _instructions() -> list[str]:
    text = (DOCKER / "Dockerfile").read_text()
    return [line for line in text.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]


def test_the_image_installs_the_wheel_not_a_checkout() -> None:
    runs = " ".join(line for line in _instructions() if line.startswith("RUN "))
    assert "pip install -e" not in runs and "--editable" not in runs
    assert re.search(r"python -m venv (\S+) .*\1/bin/pip install [^&]*tierlog-\*\.whl", runs), runs
    assert "pip wheel" in runs


def test_the_broker_plugin_path_leads_to_the_installed_jar() -> None:
    properties = dict(
        line.split("=", 1) for line in (DOCKER / "server.properties").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    plugin = properties["remote.log.metadata.manager.class.path"]
    assert properties["remote.log.storage.manager.class.path"] == plugin
    # The jar must be the installed one (a link to `tierlog plugin-path`), so the adapter finds its agent.
    assert f'ln -s "$(/opt/tierlog/bin/tierlog plugin-path)" {plugin}' in " ".join(_instructions())
    assert not any(key.endswith("agent.command") for key in properties)


def test_the_build_context_carries_what_the_wheel_build_reads() -> None:
    allowed = {line[1:] for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
               if line.startswith("!")}
    copied = {m for line in _instructions() if line.startswith("COPY ") and "--from" not in line
              for m in line.split()[1:-1]}
    assert copied <= allowed, copied - allowed
    assert {"setup.py", "MANIFEST.in", "tierlog", "rlmm", "rsm", "schemas"} <= allowed
