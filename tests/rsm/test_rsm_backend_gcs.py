"""The Google Cloud Storage backend beyond the contract suite: its requests on the wire (one GET per ranged read,
resumable uploads in chunk-size pieces, retries), a broken read resumed, and its config errors.

Runs against gcp-storage-emulator on 127.0.0.1, through the counting proxy where the wire matters.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.s3_proxy import CountingS3Proxy, RecordedRequest

from dev.emulators import GcsEndpoint
from rlmm.config import parse_config
from rlmm.errors import ConfigError, RemoteStorageError
from rsm.backend import StorageBackend
from rsm.backends import gcs
from rsm.metrics import Metrics

_KIB = 1 << 10


def backend(
    endpoint: GcsEndpoint, prefix: str, url: str | None = None, metrics: Metrics | None = None,
    options: dict[str, Any] | None = None,
) -> StorageBackend:
    config = endpoint.rsm_config(prefix, **(options or {}))
    del config["storage.backend"]
    if url is not None:
        config["gcs.endpoint.url"] = url
    return gcs.create(parse_config(config, gcs.CONFIG_KEYS, "rsm"), metrics or Metrics())


def downloads(proxy: CountingS3Proxy) -> list[RecordedRequest]:
    """The object reads the proxy saw (the library also reads the bucket's metadata once, in the background)."""
    return [r for r in proxy.requests if r.path.startswith("/download/")]


@pytest.fixture
def proxy(gcs_emulator: GcsEndpoint) -> Iterator[CountingS3Proxy]:
    with CountingS3Proxy(gcs_emulator.url) as counting:
        yield counting


def test_a_ranged_read_is_one_get_of_exactly_that_range(
    gcs_emulator: GcsEndpoint, proxy: CountingS3Proxy, key_prefix: str
) -> None:
    store = backend(gcs_emulator, key_prefix, proxy.endpoint_url)
    store.put("obj", bytes(range(256)) * 64)
    proxy.reset()
    with store.get_range("obj", 1000, 1999) as stream:
        assert stream.read() == (bytes(range(256)) * 64)[1000:2000]
    assert [(r.method, r.range) for r in downloads(proxy)] == [("GET", "bytes=1000-1999")]
    store.close()


def test_a_file_above_8_mib_is_uploaded_resumably_in_chunk_size_pieces(
    gcs_emulator: GcsEndpoint, proxy: CountingS3Proxy, key_prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "segment.log"
    path.write_bytes(b"r" * (9 << 20))
    store = backend(gcs_emulator, key_prefix, proxy.endpoint_url, options={"gcs.resumable.upload.chunk.size": 4 << 20})
    store.put("segment.log", path)
    pieces = [r for r in proxy.requests if r.method == "PUT" and r.query.get("uploadType") == "resumable"]
    assert len(pieces) == 3  # 4 + 4 + 1 MiB
    with store.get_range("segment.log", 0) as stream:
        assert stream.read() == path.read_bytes()
    store.close()


def test_a_server_error_on_upload_or_ranged_read_is_retried(
    gcs_emulator: GcsEndpoint, proxy: CountingS3Proxy, key_prefix: str
) -> None:
    failed: list[str] = []

    def first_of_each_method(request: RecordedRequest) -> bool:
        if request.method in failed or not request.path.startswith(("/upload/", "/download/")):
            return False
        failed.append(request.method)
        return True

    proxy.fail_when(first_of_each_method, status=503)
    metrics = Metrics()
    store = backend(gcs_emulator, key_prefix, proxy.endpoint_url, metrics)
    store.put("obj", b"after a 503")
    with store.get_range("obj", 0) as stream:
        assert stream.read() == b"after a 503"
    objects = [r.method for r in proxy.requests if r.path.startswith(("/upload/", "/download/"))]
    assert objects == ["POST", "POST", "GET", "GET"]
    counters = metrics.snapshot()["counters"]
    assert counters["gcs.http_attempts.POST"] == 2 and counters["gcs.http_attempts.GET"] >= 2
    store.close()


def test_a_read_cut_midway_resumes_where_it_stopped(
    gcs_emulator: GcsEndpoint, proxy: CountingS3Proxy, key_prefix: str
) -> None:
    data = bytes(range(256)) * (64 * _KIB)  # 16 MiB: more than the sockets buffer
    store = backend(gcs_emulator, key_prefix, proxy.endpoint_url)
    store.put("big", data)
    proxy.reset()
    with store.get_range("big", 10) as stream:
        head = stream.read(4096)
        proxy.sever_connections()
        rest = stream.read()
    assert head + rest == data[10:]
    # GCS names the object's generation (x-goog-generation) and the resumed GET asks for it; the emulator names
    # none, so here the resumed GET is the plain rest of the range.
    gets = downloads(proxy)
    assert len(gets) == 2
    assert int(str(gets[1].range).removeprefix("bytes=").split("-")[0]) > 10 + 4096
    store.close()


def test_check_of_a_missing_bucket_names_it(gcs_emulator: GcsEndpoint, key_prefix: str) -> None:
    store = backend(gcs_emulator, key_prefix, options={"gcs.bucket.name": "no-such-bucket"})
    with pytest.raises(RemoteStorageError, match=r"GCS bucket 'no-such-bucket'.* is not usable"):
        store.check()
    store.close()


# -- config ------------------------------------------------------------------------------------------


def config_error(**extra: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        backend(GcsEndpoint("http://127.0.0.1:9", "b"), "p", options=extra)
    return str(caught.value)


def test_two_credential_sources_are_refused_naming_both() -> None:
    message = config_error(**{"gcs.credentials.path": "/k.json", "gcs.credentials.default": "true"})
    assert "gcs.credentials.path and gcs.credentials.default cannot be set together" in message


def test_credentials_json_that_is_not_json_is_refused_without_echoing_it() -> None:
    message = config_error(**{"gcs.credentials.json": "{not json, private_key=secret"})
    assert "gcs.credentials.json is not valid JSON" in message and "secret" not in message


def test_a_credentials_json_of_another_type_is_refused_naming_the_types_taken() -> None:
    message = config_error(**{"gcs.credentials.json": json.dumps({"type": "external_account"})})
    assert "type 'external_account'" in message and "gcs.credentials.default" in message


def test_a_service_account_key_that_cannot_be_loaded_is_refused_without_its_private_key() -> None:
    key = {"type": "service_account", "client_email": "rsm@p.iam.gserviceaccount.com", "token_uri": "https://t",
           "private_key": "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"}
    message = config_error(**{"gcs.credentials.json": json.dumps(key)})
    assert "cannot load GCS credentials from gcs.credentials.json" in message and "bm90IGEga2V5" not in message


def test_a_resumable_chunk_size_off_the_256_kib_grid_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"gcs\.resumable\.upload\.chunk\.size must be a positive multiple of"):
        parse_config({"gcs.bucket.name": "b", "gcs.resumable.upload.chunk.size": 1000 * _KIB}, gcs.CONFIG_KEYS, "rsm")


def test_without_the_gcs_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.cloud.storage", None)  # as if google-cloud-storage were missing
    assert "pip install 'tierlog[gcs]'" in config_error()
