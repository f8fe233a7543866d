"""Fuzz target of rlmm/_digest.c (run by run_fuzz.py): frame() gives the view digest what its Python framing gives for
any run of entries, and refuses anything but a bytes family and two equally long lists of bytes with TypeError."""

from __future__ import annotations

import hashlib
from typing import Any

import atheris

from rlmm import _digest, state


def _python_hexdigest(family: str, keys: list[bytes], values: list[bytes]) -> str:
    saved, state._digest = state._digest, None  # ViewDigest frames in Python without the extension
    try:
        digest = state.ViewDigest()
        digest.add(family, keys, values)
        return digest.hexdigest()
    finally:
        state._digest = saved


class _Bytes(bytes):
    pass


def _not_bytes(data: atheris.FuzzedDataProvider, item: bytes) -> Any:
    return [bytearray(item), memoryview(item), _Bytes(item), item.decode("latin-1"), len(item), None,
            [item]][data.ConsumeIntInRange(0, 6)]


def one_input(raw: bytes) -> None:
    data = atheris.FuzzedDataProvider(raw)
    family = data.ConsumeUnicodeNoSurrogates(data.ConsumeIntInRange(0, 12))
    count = data.ConsumeIntInRange(0, 24)
    keys = [data.ConsumeBytes(data.ConsumeIntInRange(0, 40)) for _ in range(count)]
    values = [data.ConsumeBytes(data.ConsumeIntInRange(0, 200)) for _ in range(count)]
    misuse = data.ConsumeIntInRange(0, 5)
    if misuse == 0:  # well-formed: the same digest either way
        expected = _python_hexdigest(family, keys, values)
        digest = state.ViewDigest()
        digest.add(family, keys, values)  # lists: framed in C
        assert digest.hexdigest() == expected, (family, keys, values)
        assert hashlib.sha256(_digest.frame(family.encode(), keys, values)).hexdigest() == expected
        return
    args: list[Any] = [family.encode(), keys, values]
    if misuse == 1 and count:  # an item that is not exactly bytes
        parts = keys if data.ConsumeBool() else values
        at = data.ConsumeIntInRange(0, count - 1)
        parts[at] = _not_bytes(data, parts[at])
    elif misuse in (1, 2):  # lists of different lengths
        (keys if data.ConsumeBool() else values).append(b"")
    elif misuse == 3:  # another sequence or family type
        at = data.ConsumeIntInRange(0, 2)
        args[at] = tuple(args[at]) if at else _not_bytes(data, args[at])
    elif misuse == 4:  # another number of arguments
        args = args[:data.ConsumeIntInRange(0, 2)] if data.ConsumeBool() else [*args, b""]
    else:
        args[data.ConsumeIntInRange(0, 2)] = None
    try:
        _digest.frame(*args)
    except TypeError:
        return
    raise AssertionError(f"frame accepted misuse {misuse}: {args!r}")
