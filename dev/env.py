"""Where the development services are: `.dev/services.env` (written by `dev/services up`, or under
$TIERLOG_DEV_DIR), with KAFKA_* and S3_* variables set in the environment taking precedence."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def state_dir() -> Path:
    """dev/services' state directory: $TIERLOG_DEV_DIR, else <repo>/.dev."""
    override = os.environ.get("TIERLOG_DEV_DIR")
    return Path(override).resolve() if override else REPO_ROOT / ".dev"


def env_file() -> Path:
    return state_dir() / "services.env"


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines, as dev/services writes them; blank lines and # comments ignored."""
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{path}: line {line!r} is not KEY=value")
            values[key.strip()] = value.strip()
    return values


def services_env() -> dict[str, str]:
    """KAFKA_BOOTSTRAP, S3_ENDPOINT, ... of the running dev services; empty when none are known."""
    path = env_file()
    values = read_env_file(path) if path.exists() else {}
    values.update({k: v for k, v in os.environ.items() if k.startswith(("S3_", "KAFKA_"))})
    return values
