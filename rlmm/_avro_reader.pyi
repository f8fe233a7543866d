"""Types of the optional C extension rlmm/_avro_reader.c (a rebuild's Avro reader; rlmm.codec compiles programs)."""

from typing import Any

OP_NULL: int
OP_BOOLEAN: int
OP_INT: int
OP_LONG: int
OP_STRING: int
OP_BYTES: int
OP_ENUM: int
OP_UNION: int
OP_ARRAY: int
OP_RECORD: int
OP_TUPLE: int

def check(program: Any) -> bool: ...
def read(program: Any, data: bytes, start: int) -> Any: ...
