"""Where the development services are: `.dev/services.env` (written by `dev/services up`, or under
$TIERLOG_DEV_DIR), with KAFKA_* and S3_* variables set in the environment taking precedence."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def services_env() -> dict[str, str]:
    """KAFKA_BOOTSTRAP, S3_ENDPOINT, ... of the running dev services; empty when none are known."""
    path = Path(os.environ.get("TIERLOG_DEV_DIR", REPO_ROOT / ".dev")) / "services.env"
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            name, sep, value = line.partition("=")
            if sep and not name.strip().startswith("#"):
                values[name.strip()] = value.strip()
    values.update({k: v for k, v in os.environ.items() if k.startswith(("S3_", "KAFKA_"))})
    return values
