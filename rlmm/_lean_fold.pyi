"""Types of the optional C extension rlmm/_lean_fold.c (a fold worker's commonest record; rlmm.lean_fold uses it)."""

from collections.abc import Callable
from typing import Any

def finished(lean: dict[Any, Any], named: dict[Any, Any], ruled: set[Any], new: Callable[[Any, Any], Any],
             offset: int, raw_key: bytes, datum: tuple[Any, ...], value: bytes, skipped_before: bool | None
             ) -> tuple[int, int] | None: ...
