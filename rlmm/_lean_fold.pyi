"""Types of the optional C extension rlmm/_lean_fold.c (a fold worker's commonest record; rlmm.lean_fold uses it)."""

from collections.abc import Callable
from typing import Any

def finished(lean: dict[Any, Any], named: dict[Any, Any], ruled: set[Any], new: Callable[[Any, Any], Any],
             offset: int, raw_key: bytes, datum: tuple[Any, ...], value: bytes, skipped_before: bool | None
             ) -> tuple[int, int] | None: ...
def rows(key: bytes, segments: dict[bytes, bytes], index: dict[int, list[tuple[int, bytes]]]
         ) -> tuple[list[bytes], list[bytes], list[bytes], list[bytes]]: ...
def fold_run(lean: dict[Any, Any], named: dict[Any, Any], ruled: set[Any], new: Callable[[Any, Any], Any],
             records: list[Any], start: int, stop_at: dict[Any, Any] | set[Any] | frozenset[Any],
             touched: set[Any], header: bytes, read: Callable[[Any, bytes, int], Any], program: Any,
             header_length: int) -> tuple[int, int]: ...
