"""rlmm.record_batches.decompress: a compressed batch's records as each of Kafka's clients writes the codec (snappy
both plain, as librdkafka writes it, and in the framing of Kafka's Java clients); a payload that does not decompress
is a ValueError naming the codec. (The batches themselves: tests/rlmm/test_rlmm_raw_fetch.py on the real broker, and
tests/native/fuzz_record_batches.py against the C reader.)"""

from __future__ import annotations

import gzip
import random
import struct

import cramjam
import pytest

from rlmm import record_batches
from rlmm.record_batches import GZIP, LZ4, SNAPPY, ZSTD, decompress

DATA = random.Random(1).randbytes(3000) * 5


def _xerial(data: bytes, block: int) -> bytes:
    """Snappy in the Java clients' framing: a magic and two versions, then blocks, each its length and its bytes."""
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for at in range(0, len(data), block):
        compressed = bytes(cramjam.snappy.compress_raw(data[at:at + block]))
        out += struct.pack(">i", len(compressed)) + compressed
    return out


@pytest.mark.parametrize(("codec", "payload"), [
    (GZIP, gzip.compress(DATA)),
    (SNAPPY, bytes(cramjam.snappy.compress_raw(DATA))),
    (SNAPPY, _xerial(DATA, 4096)),
    (LZ4, bytes(cramjam.lz4.compress(DATA))),
    (ZSTD, bytes(cramjam.zstd.compress(DATA))),
], ids=["gzip", "snappy", "snappy-java", "lz4", "zstd"])
def test_each_codec_decompresses_as_kafkas_clients_compress(codec: int, payload: bytes) -> None:
    assert decompress(codec, payload) == DATA
    with pytest.raises(ValueError, match=f"a {record_batches.CODEC_NAMES[codec]} batch does not decompress|cut short"):
        decompress(codec, payload[:len(payload) // 2] + b"\xff" * 7)


def test_an_unknown_codec_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown codec 5"):
        decompress(5, b"")
