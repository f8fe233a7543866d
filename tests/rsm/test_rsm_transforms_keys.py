"""Key-encryption keys beyond the key file: AWS KMS (moto's server mode, started on 127.0.0.1 by this module), and
`tierlog rewrap` moving every segment's data key to the active key, resumably, without rewriting segment data.
"""

from __future__ import annotations

import json
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from rsm_testkit import SegmentFactory, SegmentFixture
from test_rsm_transforms import json_records, with_log

from rlmm.types import RemoteLogSegmentMetadata
from rsm import RemoteStorageError, RemoteStorageManager
from rsm.keyring import DataKeyError
from rsm.keys import keys_for
from rsm.manager import RewrapOutcome
from tierlog.cli.common import Settings
from tierlog.cli.main import main
from tierlog.cli.rewrap import data_key_check

SEGMENT = 60_000
CHUNK = 16 << 10
KMS_CREDENTIALS = {"encryption.kms.access.key.id": "testing", "encryption.kms.secret.access.key": "testing"}


@pytest.fixture(scope="module")
def kms_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def kms_key(kms_endpoint: str) -> str:
    client = boto3.client("kms", endpoint_url=kms_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    return str(client.create_key(Description="tierlog tests")["KeyMetadata"]["Arn"])


@pytest.fixture
def bucket(tmp_path: Path) -> Path:
    return tmp_path / "bucket"


@pytest.fixture
def files_ring(tmp_path: Path) -> dict[str, str]:
    for key_id in ("k1", "k2"):
        (tmp_path / f"{key_id}.key").write_bytes(os.urandom(32))
    return {
        "encryption.key.pairs": "k1,k2", "encryption.key.pair.id": "k1",
        "encryption.key.pairs.k1.key.file": str(tmp_path / "k1.key"),
        "encryption.key.pairs.k2.key.file": str(tmp_path / "k2.key"),
    }


def _config(bucket: Path, **extra: Any) -> dict[str, Any]:
    return {"storage.backend": "filesystem", "filesystem.root": str(bucket), "chunk.size": CHUNK,
            "compression.enabled": "true", **extra}


def _copy_many(config: dict[str, Any], make_segment: SegmentFactory, count: int, encrypted: bool = True,
               first_seed: int = 0) -> list[tuple[RemoteLogSegmentMetadata, bytes]]:
    out = []
    with RemoteStorageManager({**config, "encryption.enabled": encrypted}) as rsm:
        for seed in range(first_seed, first_seed + count):
            raw = json_records(SEGMENT, seed)
            segment: SegmentFixture = with_log(make_segment(seed=seed), raw)
            out.append((segment.with_custom_metadata(rsm.copy_log_segment_data(segment.metadata, segment.data)), raw))
    return out


def _read_all(config: dict[str, Any], segments: list[tuple[RemoteLogSegmentMetadata, bytes]]) -> None:
    with RemoteStorageManager(config) as rsm:
        for metadata, raw in segments:
            with rsm.fetch_log_segment(metadata, 0) as stream:
                assert stream.read() == raw


# -- AWS KMS ------------------------------------------------------------------------------------------------


def _kms_ring(kms_endpoint: str, kms_key: str, **extra: str) -> dict[str, str]:
    return {"encryption.key.pairs": "kms1", "encryption.key.pair.id": "kms1",
            "encryption.key.pairs.kms1.kms.key.id": kms_key, "encryption.kms.endpoint.url": kms_endpoint,
            **KMS_CREDENTIALS, **extra}


def test_a_kms_wrapped_segment_round_trips_in_a_new_process(
    bucket: Path, make_segment: SegmentFactory, kms_endpoint: str, kms_key: str
) -> None:
    config = _config(bucket, **_kms_ring(kms_endpoint, kms_key))
    segments = _copy_many(config, make_segment, 2)
    _read_all(config, segments)
    with RemoteStorageManager(config) as rsm:
        assert rsm.data_key_id(keys_for(segments[0][0], False).indexes) == "kms1"


def test_a_kms_wrapped_key_moved_onto_another_segment_does_not_unwrap(
    bucket: Path, make_segment: SegmentFactory, kms_endpoint: str, kms_key: str
) -> None:
    # KMS binds the wrapping to the segment through the encryption context.
    config = _config(bucket, **_kms_ring(kms_endpoint, kms_key))
    (victim, _), (donor, _) = _copy_many(config, make_segment, 2)
    with RemoteStorageManager(config) as rsm:
        victim_key, donor_key = keys_for(victim, False).indexes, keys_for(donor, False).indexes
        with rsm.backend.get_range(victim_key, 0) as stream:
            victim_packed = bytearray(stream.read())
        with rsm.backend.get_range(donor_key, 0) as stream:
            donor_packed = stream.read()
        from rsm.packed_index import SegmentSection, parse_header

        slot = parse_header(donor_packed, "t").get(SegmentSection.WRAPPED_KEY)
        assert slot is not None
        victim_packed[slot.position : slot.end] = donor_packed[slot.position : slot.end]
        rsm.backend.put(victim_key, bytes(victim_packed))
    with RemoteStorageManager(config) as rsm, pytest.raises(DataKeyError, match=r"KMS Decrypt .* failed: Invalid"):
        rsm.fetch_log_segment(victim, 0).read()


def test_an_unreachable_kms_is_an_error_naming_the_segment_and_the_key(
    bucket: Path, make_segment: SegmentFactory, kms_endpoint: str, kms_key: str
) -> None:
    config = _config(bucket, **_kms_ring(kms_endpoint, kms_key))
    [(metadata, _)] = _copy_many(config, make_segment, 1)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{unused.getsockname()[1]}"
    broken = {**config, "encryption.kms.endpoint.url": closed, "encryption.kms.request.timeout.ms": 500}
    with RemoteStorageManager(broken) as rsm, pytest.raises(
        DataKeyError, match=f"segment {metadata.remote_log_segment_id.id} under key id 'kms1'"
    ):
        rsm.fetch_log_segment(metadata, 0).read()


# -- tierlog rewrap ----------------------------------------------------------------------------------------


def _rewrap(bucket: Path, ring: dict[str, str], capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[
    int, dict[str, Any]
]:
    options = [arg for key, value in ring.items() for arg in ("-o", f"rsm.config.{key}={value}")]
    code = main(["rewrap", "--bucket", str(bucket), "--json", *options, *extra])
    return code, json.loads(capsys.readouterr().out)


def _objects(bucket: Path, suffix: str) -> dict[str, bytes]:
    return {str(p.relative_to(bucket)): p.read_bytes() for p in sorted(bucket.rglob(f"*{suffix}"))}


def test_rewrap_moves_every_data_key_to_the_active_key_without_rewriting_segment_data(
    bucket: Path, files_ring: dict[str, str], make_segment: SegmentFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    segments = _copy_many(_config(bucket, **files_ring), make_segment, 3)
    segments += _copy_many(_config(bucket, **files_ring), make_segment, 1, encrypted=False, first_seed=3)
    logs_before = _objects(bucket, ".log")
    rotated = {**files_ring, "encryption.key.pair.id": "k2"}
    code, dry = _rewrap(bucket, rotated, capsys, "--dry-run")
    assert code == 0 and dry["by_key_id"] == {"k1": 3} and dry["retired"] == 3 and dry["unencrypted"] == 1
    code, report = _rewrap(bucket, rotated, capsys)
    assert code == 0
    assert (report["rewrapped"], report["current"], report["unencrypted"], report["failed"]) == (3, 0, 1, [])
    assert _objects(bucket, ".log") == logs_before
    # k1 can leave the ring now: every segment reads under k2 alone (custom metadata unchanged).
    only_k2 = {"encryption.key.pairs": "k2", "encryption.key.pair.id": "k2",
               "encryption.key.pairs.k2.key.file": files_ring["encryption.key.pairs.k2.key.file"]}
    _read_all(_config(bucket, **only_k2), segments)
    row = data_key_check(Settings({}, {f"rsm.config.{k}": v for k, v in only_k2.items()}), str(bucket))
    assert row is not None and row["ok"] and row["keys"]["by_key_id"] == {"k2": 3} and row["keys"]["retired"] == 0


def test_rewrap_interrupted_is_resumed_by_running_it_again(
    bucket: Path, files_ring: dict[str, str], make_segment: SegmentFactory, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    segments = _copy_many(_config(bucket, **files_ring), make_segment, 5)
    rotated = {**files_ring, "encryption.key.pair.id": "k2"}
    real = RemoteStorageManager.rewrap_data_key
    calls = []

    def fails_from_the_third(self: RemoteStorageManager, key: str) -> RewrapOutcome:
        calls.append(key)
        if len(calls) >= 3:  # the store goes away mid-run
            raise RemoteStorageError("connection reset by the store")
        return real(self, key)

    monkeypatch.setattr(RemoteStorageManager, "rewrap_data_key", fails_from_the_third)
    code, report = _rewrap(bucket, rotated, capsys, "--threads", "1")
    assert code == 1 and report["rewrapped"] == 2 and len(report["failed"]) == 3
    assert "connection reset" in report["failed"][0]["error"]
    monkeypatch.setattr(RemoteStorageManager, "rewrap_data_key", real)
    code, report = _rewrap(bucket, rotated, capsys)
    assert code == 0 and (report["rewrapped"], report["current"]) == (3, 2)
    code, report = _rewrap(bucket, rotated, capsys)
    assert code == 0 and (report["rewrapped"], report["current"]) == (0, 5)
    _read_all(_config(bucket, **rotated), segments)


def test_rewrap_from_a_key_file_to_kms_and_verify_reports_what_is_left_under_the_retired_key(
    bucket: Path, files_ring: dict[str, str], make_segment: SegmentFactory, capsys: pytest.CaptureFixture[str],
    kms_endpoint: str, kms_key: str,
) -> None:
    segments = _copy_many(_config(bucket, **files_ring), make_segment, 2)
    both = {**files_ring, **_kms_ring(kms_endpoint, kms_key), "encryption.key.pairs": "k1,k2,kms1"}
    settings = Settings({}, {f"rsm.config.{k}": v for k, v in both.items()})
    row = data_key_check(settings, str(bucket))
    assert row is not None and row["keys"]["retired"] == 2 and "tierlog rewrap" in row["advice"][0]
    code, report = _rewrap(bucket, both, capsys)
    assert code == 0 and report["rewrapped"] == 2
    row = data_key_check(settings, str(bucket))
    assert row is not None and row["keys"]["by_key_id"] == {"kms1": 2} and not row["advice"]
    _read_all(_config(bucket, **_kms_ring(kms_endpoint, kms_key)), segments)


def test_rewrap_reports_a_segment_whose_key_left_the_ring_and_rewraps_the_others(
    bucket: Path, files_ring: dict[str, str], make_segment: SegmentFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    _copy_many(_config(bucket, **files_ring), make_segment, 1)
    _copy_many(_config(bucket, **{**files_ring, "encryption.key.pair.id": "k2"}), make_segment, 1, first_seed=1)
    tmp = bucket.parent
    (tmp / "k3.key").write_bytes(random.Random(3).randbytes(32))
    ring = {"encryption.key.pairs": "k2,k3", "encryption.key.pair.id": "k3",
            "encryption.key.pairs.k2.key.file": files_ring["encryption.key.pairs.k2.key.file"],
            "encryption.key.pairs.k3.key.file": str(tmp / "k3.key")}
    code, report = _rewrap(bucket, ring, capsys)
    assert code == 1 and report["rewrapped"] == 1
    (failure,) = report["failed"]
    assert "key id 'k1', which is not in encryption.key.pairs" in failure["error"]
