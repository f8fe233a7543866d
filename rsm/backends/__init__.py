"""The storage backends, found by name: every module in this package is one backend.

A new store is one more module here defining NAME, CONFIG_KEYS and create(); nothing else. A module whose client
library is an optional extra (gcs, azure) imports it in create(), so that listing the backends never needs it.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from rsm.backend import BackendModule


@cache
def available_backends() -> dict[str, BackendModule]:
    found: dict[str, BackendModule] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if all(hasattr(module, attr) for attr in ("NAME", "CONFIG_KEYS", "create")):
            found[module.NAME] = module
    return found


__all__ = ["available_backends"]
