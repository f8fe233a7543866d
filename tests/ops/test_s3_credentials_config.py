"""An empty or missing S3 secret is refused when the rsm is configured, naming the key (issue 10)."""

from __future__ import annotations

import pytest

from rsm import ConfigError, RemoteStorageManager

S3 = {"storage.backend": "s3", "s3.bucket": "b", "s3.endpoint.url": "http://127.0.0.1:1"}


def test_an_empty_secret_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config key s3\.secret\.access\.key is empty"):
        RemoteStorageManager({**S3, "s3.access.key.id": "AKIA", "s3.secret.access.key": ""})


def test_a_blank_secret_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config key s3\.secret\.access\.key is empty"):
        RemoteStorageManager({**S3, "s3.access.key.id": "AKIA", "s3.secret.access.key": "   "})


def test_a_missing_secret_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config key s3\.secret\.access\.key is missing"):
        RemoteStorageManager({**S3, "s3.access.key.id": "AKIA"})


def test_an_empty_access_key_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config key s3\.access\.key\.id is empty"):
        RemoteStorageManager({**S3, "s3.access.key.id": "", "s3.secret.access.key": "secret"})
