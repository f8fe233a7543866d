"""Types of the optional C extension rlmm/_record_batches.c (Kafka's record batches; rlmm.raw_fetch uses it)."""

from collections.abc import Callable
from typing import Any

def read(data: bytes, start: int, end: int, decompress: Callable[[int, bytes], bytes]
         ) -> tuple[list[tuple[int, bytes | None, bytes | None]], int, bool]: ...

_Only = tuple[frozenset[bytes] | set[bytes], dict[bytes, bytes | None], Callable[[bytes], bytes | None], bool]

def keep(newest: dict[bytes, tuple[Any, ...]], superseded_tombstones: list[tuple[Any, ...]], partition: int,
         records: list[tuple[int, bytes | None, bytes | None]], expected: int, cleaned: bool, tombstone_prefix: bytes,
         only: _Only | None = None) -> tuple[int, bool]: ...

def read_keep(data: bytes, start: int, end: int, decompress: Callable[[int, bytes], bytes],
              newest: dict[bytes, tuple[Any, ...]], superseded_tombstones: list[tuple[Any, ...]], partition: int,
              expected: int, cleaned: bool, tombstone_prefix: bytes, only: _Only | None
              ) -> tuple[int, int, bool, int, bool]: ...
