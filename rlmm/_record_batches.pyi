"""Types of the optional C extension rlmm/_record_batches.c (Kafka's record batches; rlmm.raw_fetch uses it)."""

from collections.abc import Callable

def read(data: bytes, start: int, end: int, decompress: Callable[[int, bytes], bytes]
         ) -> tuple[list[tuple[int, bytes | None, bytes | None]], int, bool]: ...
