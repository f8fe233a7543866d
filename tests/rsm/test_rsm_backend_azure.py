"""The Azure Blob Storage backend beyond the contract suite: its requests on the wire (one streamed GET per ranged
read, blocks staged and committed above the block size, retries), a read resumed on the same ETag, and its config
errors.

Runs against Azurite on 127.0.0.1, through the counting proxy where the wire matters.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.s3_proxy import CountingS3Proxy, RecordedRequest

from dev.emulators import AzureEndpoint
from rlmm.config import parse_config
from rlmm.errors import ConfigError, RemoteStorageError
from rsm.backend import StorageBackend
from rsm.backends import azure
from rsm.metrics import Metrics

_KIB = 1 << 10


def backend(
    endpoint: AzureEndpoint, prefix: str, url: str | None = None, metrics: Metrics | None = None,
    options: dict[str, Any] | None = None,
) -> StorageBackend:
    config = endpoint.rsm_config(prefix, **(options or {}))
    del config["storage.backend"]
    if url is not None:
        config["azure.endpoint.url"] = url
    return azure.create(parse_config(config, azure.CONFIG_KEYS, "rsm"), metrics or Metrics())


@pytest.fixture
def proxy(azurite: AzureEndpoint) -> Iterator[CountingS3Proxy]:
    with CountingS3Proxy(azurite.url) as counting:
        yield counting


def via(proxy: CountingS3Proxy, endpoint: AzureEndpoint) -> str:
    return f"{proxy.endpoint_url}/{endpoint.account}"


def test_a_ranged_read_is_one_get_of_exactly_that_range(
    azurite: AzureEndpoint, proxy: CountingS3Proxy, key_prefix: str
) -> None:
    data = bytes(range(256)) * 64
    store = backend(azurite, key_prefix, via(proxy, azurite))
    store.put("obj", data)
    proxy.reset()
    with store.get_range("obj", 1000, 1999) as stream:
        assert stream.read() == data[1000:2000]
    assert [r.method for r in proxy.requests] == ["GET"]
    store.close()


def test_a_file_above_the_block_size_is_staged_in_blocks_and_committed(
    azurite: AzureEndpoint, proxy: CountingS3Proxy, key_prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "segment.log"
    path.write_bytes(b"b" * (2 << 20) + b"tail")
    store = backend(azurite, key_prefix, via(proxy, azurite), options={"azure.upload.block.size": 1 << 20})
    store.put("segment.log", path)
    kinds = [r.query.get("comp") for r in proxy.requests if r.method == "PUT"]
    assert sorted(kinds, key=str) == ["block", "block", "block", "blocklist"]
    with store.get_range("segment.log", 0) as stream:
        assert stream.read() == path.read_bytes()
    store.close()


def test_a_server_error_on_upload_is_retried(
    azurite: AzureEndpoint, proxy: CountingS3Proxy, key_prefix: str
) -> None:
    failed: list[RecordedRequest] = []

    def first_upload(request: RecordedRequest) -> bool:
        if request.method == "PUT" and not failed:
            failed.append(request)
            return True
        return False

    proxy.fail_when(first_upload, status=503)
    metrics = Metrics()
    store = backend(azurite, key_prefix, via(proxy, azurite), metrics)
    store.put("obj", b"after a 503")
    with store.get_range("obj", 0) as stream:
        assert stream.read() == b"after a 503"
    assert len([r for r in proxy.requests if r.method == "PUT"]) == 2
    assert metrics.snapshot()["counters"]["azure.http_attempts.PUT"] == 2
    store.close()


def test_a_read_cut_midway_resumes_on_the_same_etag_where_it_stopped(
    azurite: AzureEndpoint, proxy: CountingS3Proxy, key_prefix: str
) -> None:
    data = bytes(range(256)) * (64 * _KIB)  # 16 MiB: more than the sockets buffer
    store = backend(azurite, key_prefix, via(proxy, azurite))
    store.put("big", data)
    proxy.reset()
    with store.get_range("big", 10) as stream:
        head = stream.read(4096)
        proxy.sever_connections()
        rest = stream.read()
    assert head + rest == data[10:]
    gets = [r for r in proxy.requests if r.method == "GET"]
    assert len(gets) == 2 and gets[1].has_header("If-Match")
    store.close()


def test_a_read_resumed_after_the_blob_was_replaced_fails_naming_it(
    azurite: AzureEndpoint, proxy: CountingS3Proxy, key_prefix: str
) -> None:
    data = bytes(range(256)) * (64 * _KIB)
    store = backend(azurite, key_prefix, via(proxy, azurite))
    store.put("big", data)
    with store.get_range("big", 0) as stream:
        stream.read(4096)
        store.put("big", data[::-1])
        proxy.sever_connections()
        with pytest.raises(RemoteStorageError, match=r"blob '.*big' was replaced or deleted while being read"):
            stream.read()
    store.close()


def test_check_of_a_missing_container_names_it(azurite: AzureEndpoint, key_prefix: str) -> None:
    store = backend(azurite, key_prefix, options={"azure.container.name": "no-such-container"})
    with pytest.raises(RemoteStorageError, match=r"container 'no-such-container' of account .* is not usable"):
        store.check()
    store.close()


# -- config ------------------------------------------------------------------------------------------


def config_error(**extra: Any) -> str:
    config: dict[str, Any] = {"azure.container.name": "c", **extra}
    with pytest.raises(ConfigError) as caught:
        azure.create(parse_config(config, azure.CONFIG_KEYS, "rsm"), Metrics())
    return str(caught.value)


def test_a_connection_string_with_account_keys_is_refused_naming_them() -> None:
    message = config_error(**{"azure.connection.string": "AccountName=a;AccountKey=k", "azure.account.name": "a"})
    assert "azure.connection.string cannot be used together with azure.account.name" in message


def test_an_account_without_a_key_or_sas_token_is_refused() -> None:
    assert "exactly one of the config keys azure.account.key and azure.sas.token" in config_error(
        **{"azure.account.name": "a"}
    )


def test_no_account_at_all_is_refused_naming_the_keys() -> None:
    assert "azure.account.name is required (or azure.connection.string)" in config_error()


def test_a_block_size_below_100_kib_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"azure\.upload\.block\.size must be between 102400"):
        parse_config({"azure.container.name": "c", "azure.upload.block.size": 4096}, azure.CONFIG_KEYS, "rsm")


def test_a_malformed_connection_string_is_refused_without_echoing_it() -> None:
    message = config_error(**{"azure.connection.string": "not-a-connection-string-s3cr3t"})
    assert "cannot create the Azure client" in message and "s3cr3t" not in message


def test_without_the_azure_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "azure.storage.blob", None)  # as if azure-storage-blob were missing
    assert "pip install 'tierlog[azure]'" in config_error()
