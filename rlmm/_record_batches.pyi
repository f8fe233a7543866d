"""Types of the optional C extension rlmm/_record_batches.c (Kafka's record batches; rlmm.raw_fetch uses it)."""

from collections.abc import Callable
from typing import Any

def read(data: bytes, start: int, end: int, decompress: Callable[[int, bytes], bytes]
         ) -> tuple[list[tuple[int, bytes | None, bytes | None]], int, bool]: ...

def keep(newest: dict[bytes, tuple[Any, ...]], superseded_tombstones: list[tuple[Any, ...]], partition: int,
         records: list[tuple[int, bytes | None, bytes | None]], expected: int, cleaned: bool, tombstone_prefix: bytes,
         only: tuple[frozenset[bytes] | set[bytes], dict[bytes, bytes | None], Callable[[bytes], bytes | None], bool]
         | None = None) -> tuple[int, bool]: ...
