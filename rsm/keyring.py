"""Key-encryption keys: the ring of ids an encrypted segment's data key may be wrapped under, one of them active.

Each ring entry is a 256-bit AES key in a file (wrapped with AES-256-GCM) or an AWS KMS key (Encrypt/Decrypt);
either way the wrapped data key is bound to its segment (GCM associated data, KMS encryption context), so a
wrapped key copied onto another segment does not unwrap. The wrapped key lives in a fixed-size slot of the
segment's packed index object (format below) that `tierlog rewrap` rewrites in place under another entry.

Slot format (big-endian, SLOT_SIZE bytes): u8 version (1), u16 key id length, key id (UTF-8), u16 wrapped key
length, wrapped key, zero padding, u32 CRC-32 of everything before it.
"""

from __future__ import annotations

import abc
import base64
import binascii
import os
import re
import struct
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmm.config import ConfigKey, parse_bool, parse_int, parse_str
from rlmm.errors import ConfigError, RemoteStorageError

DATA_KEY_BYTES = 32  # AES-256
SLOT_SIZE = 1024
SLOT_VERSION = 1
MAX_KEY_ID_BYTES = 256
_NONCE_BYTES = 12
_HEAD = struct.Struct(">BH")
_U16 = struct.Struct(">H")
_CRC = struct.Struct(">I")
_WRAP_AAD = b"tierlog data key\x00"
KMS_CONTEXT_KEY = "tierlog.segment"

RING_PREFIX = "encryption.key.pairs."
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_OWNER = "rsm"


def _ids(value: Any) -> tuple[str, ...]:
    ids = tuple(part.strip() for part in parse_str(value).split(",") if part.strip())
    bad = [i for i in ids if not _KEY_ID.fullmatch(i)]
    if bad:
        raise ValueError(f"key ids are 1-64 letters, digits, '_' or '-': {', '.join(map(repr, bad))}")
    if len(set(ids)) != len(ids):
        raise ValueError("a key id is listed twice")
    return ids


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    # New segments get a fresh data key wrapped under encryption.key.pair.id; reading needs only the ring.
    ConfigKey("encryption.enabled", parse_bool, default=False),
    ConfigKey("encryption.key.pair.id", parse_str, default=""),
    ConfigKey("encryption.key.pairs", _ids, default=()),
    ConfigKey("encryption.kms.endpoint.url", parse_str, default=""),
    ConfigKey("encryption.kms.region", parse_str, default="us-east-1"),
    ConfigKey("encryption.kms.access.key.id", parse_str, default="", secret=True),
    ConfigKey("encryption.kms.secret.access.key", parse_str, default="", secret=True),
    ConfigKey("encryption.kms.request.timeout.ms", parse_int, default=10_000,
              check=lambda v: v > 0, requirement="> 0"),
)
# What each ring entry `encryption.key.pairs.<id>.<property>` may set (exactly one of them).
ENTRY_PROPERTIES = ("key.file", "kms.key.id")


class DataKeyError(RemoteStorageError):
    """A segment's data key cannot be had: its wrapped key is damaged or tampered with, was wrapped for another
    segment, or its key-encryption key is not in the ring. Never says anything about the key material."""


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A data key wrapped under ring entry `key_id`."""

    key_id: str
    wrapped: bytes

    def encode(self) -> bytes:
        key_id = self.key_id.encode()
        if len(key_id) > MAX_KEY_ID_BYTES:
            raise ValueError(f"key id of {len(key_id)} bytes, over {MAX_KEY_ID_BYTES}")
        body = _HEAD.pack(SLOT_VERSION, len(key_id)) + key_id + _U16.pack(len(self.wrapped)) + self.wrapped
        if len(body) + _CRC.size > SLOT_SIZE:
            raise DataKeyError(
                f"a wrapped data key of {len(self.wrapped)} bytes does not fit the {SLOT_SIZE}-byte slot"
            )
        body += bytes(SLOT_SIZE - _CRC.size - len(body))
        return body + _CRC.pack(zlib.crc32(body))

    @staticmethod
    def decode(slot: bytes, segment: str) -> WrappedKey:
        damaged = f"the wrapped data key of segment {segment} is damaged"
        if len(slot) != SLOT_SIZE or zlib.crc32(slot[: -_CRC.size]) != _CRC.unpack_from(slot, SLOT_SIZE - 4)[0]:
            raise DataKeyError(f"{damaged}: it fails its checksum; its bytes cannot be decrypted")
        version, id_length = _HEAD.unpack_from(slot, 0)
        if version != SLOT_VERSION:
            raise DataKeyError(f"{damaged} or newer: slot version {version}, this reader knows {SLOT_VERSION}")
        at = _HEAD.size + id_length
        (wrapped_length,) = _U16.unpack_from(slot, at)
        end = at + _U16.size + wrapped_length
        if end > SLOT_SIZE - _CRC.size:
            raise DataKeyError(f"{damaged}: its lengths overrun the slot")
        if any(slot[end : SLOT_SIZE - _CRC.size]):
            raise DataKeyError(f"{damaged}: its padding is not zero")
        try:
            key_id = slot[_HEAD.size : at].decode()
        except UnicodeDecodeError:
            raise DataKeyError(f"{damaged}: its key id is not UTF-8") from None
        return WrappedKey(key_id, slot[at + _U16.size : end])


class KeyEncryptionKey(abc.ABC):
    """One ring entry. Implementations never put key material into messages or repr."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key_id!r})"

    @abc.abstractmethod
    def wrap(self, data_key: bytes, segment: uuid.UUID) -> bytes:
        """The data key encrypted under this key, bound to `segment`."""

    @abc.abstractmethod
    def unwrap(self, wrapped: bytes, segment: uuid.UUID) -> bytes:
        """The data key; raises DataKeyError if `wrapped` is not this key's wrapping of a key for `segment`."""


class FileKey(KeyEncryptionKey):
    """A 256-bit AES key read from a file (32 raw bytes, or their base64); wraps with AES-256-GCM."""

    def __init__(self, key_id: str, path: Path) -> None:
        super().__init__(key_id)
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        name = f"{RING_PREFIX}{key_id}.key.file"
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{_OWNER}: config key {name}: cannot read {path}: {exc.strerror}") from None
        if len(raw) != DATA_KEY_BYTES:
            try:
                raw = base64.b64decode(raw.strip(), validate=True)
            except (binascii.Error, ValueError):
                raw = b""
        if len(raw) != DATA_KEY_BYTES:
            raise ConfigError(
                f"{_OWNER}: config key {name}: {path} must hold a 256-bit key, as 32 raw bytes or their base64 "
                "(for example `head -c 32 /dev/urandom > FILE`)"
            )
        self._aead = AESGCM(raw)

    def _aad(self, segment: uuid.UUID) -> bytes:
        return _WRAP_AAD + segment.bytes + self.key_id.encode()

    def wrap(self, data_key: bytes, segment: uuid.UUID) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data_key, self._aad(segment))

    def unwrap(self, wrapped: bytes, segment: uuid.UUID) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            data_key = self._aead.decrypt(wrapped[:_NONCE_BYTES], wrapped[_NONCE_BYTES:], self._aad(segment))
        except (InvalidTag, ValueError):
            raise DataKeyError(
                f"the data key of segment {segment} does not unwrap under key id {self.key_id!r}: the wrapped key "
                "was tampered with, belongs to another segment, or the key file changed"
            ) from None
        return data_key


class KmsKey(KeyEncryptionKey):
    """An AWS KMS key (id, ARN or alias): data keys are wrapped by KMS Encrypt and unwrapped by Decrypt, with the
    segment id as encryption context."""

    def __init__(self, key_id: str, kms_key_id: str, client: Any) -> None:
        super().__init__(key_id)
        self._kms_key_id = kms_key_id
        self._client = client

    def _context(self, segment: uuid.UUID) -> dict[str, str]:
        return {KMS_CONTEXT_KEY: str(segment)}

    def _failed(self, action: str, segment: uuid.UUID, exc: Exception) -> DataKeyError:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__
        return DataKeyError(
            f"KMS {action} of the data key of segment {segment} under key id {self.key_id!r} (KMS key "
            f"{self._kms_key_id}) failed: {code}"
        )

    def wrap(self, data_key: bytes, segment: uuid.UUID) -> bytes:
        try:
            answer = self._client.encrypt(
                KeyId=self._kms_key_id, Plaintext=data_key, EncryptionContext=self._context(segment)
            )
        except Exception as exc:
            raise self._failed("Encrypt", segment, exc) from None
        return bytes(answer["CiphertextBlob"])

    def unwrap(self, wrapped: bytes, segment: uuid.UUID) -> bytes:
        try:
            answer = self._client.decrypt(
                CiphertextBlob=wrapped, KeyId=self._kms_key_id, EncryptionContext=self._context(segment)
            )
        except Exception as exc:
            raise self._failed("Decrypt", segment, exc) from None
        return bytes(answer["Plaintext"])


class KeyRing:
    """The ring entries by id; `active` wraps new data keys (None: this node only reads encrypted segments)."""

    def __init__(self, keys: Mapping[str, KeyEncryptionKey], active: str | None) -> None:
        if active is not None and active not in keys:
            raise ConfigError(
                f"{_OWNER}: config key encryption.key.pair.id is {active!r}, which encryption.key.pairs does not "
                f"list ({', '.join(keys) or 'empty'})"
            )
        self._keys = dict(keys)
        self.active = active

    def __repr__(self) -> str:
        return f"KeyRing(ids={list(self._keys)}, active={self.active!r})"

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def new_data_key(self, segment: uuid.UUID) -> tuple[bytes, WrappedKey]:
        """A fresh random data key for `segment` and its wrapping under the active entry."""
        data_key = os.urandom(DATA_KEY_BYTES)
        return data_key, self.wrap(data_key, segment)

    def wrap(self, data_key: bytes, segment: uuid.UUID) -> WrappedKey:
        if self.active is None:
            raise ConfigError(f"{_OWNER}: encryption needs config key encryption.key.pair.id (the active key id)")
        return WrappedKey(self.active, self._keys[self.active].wrap(data_key, segment))

    def unwrap(self, wrapped: WrappedKey, segment: uuid.UUID) -> bytes:
        entry = self._keys.get(wrapped.key_id)
        if entry is None:
            raise DataKeyError(
                f"the data key of segment {segment} is wrapped under key id {wrapped.key_id!r}, which is not in "
                f"encryption.key.pairs ({', '.join(self._keys) or 'empty'}): add that key back to the ring, or "
                "run `tierlog rewrap` on a node that still has it"
            )
        data_key = entry.unwrap(wrapped.wrapped, segment)
        if len(data_key) != DATA_KEY_BYTES:
            raise DataKeyError(f"the data key of segment {segment} unwraps to {len(data_key)} bytes, not 32")
        return data_key


def build_keyring(core: Mapping[str, Any], raw: Mapping[str, Any]) -> KeyRing | None:
    """The ring the config describes (`core`: CONFIG_KEYS parsed; `raw`: the whole config, for the per-entry keys
    under encryption.key.pairs.<id>.), or None if it lists no entry."""
    ids: tuple[str, ...] = core["encryption.key.pairs"]
    entries: dict[str, dict[str, str]] = {key_id: {} for key_id in ids}
    for name, value in raw.items():
        if not name.startswith(RING_PREFIX):
            continue
        key_id, _, prop = name.removeprefix(RING_PREFIX).partition(".")
        if key_id not in entries or prop not in ENTRY_PROPERTIES:
            raise ConfigError(
                f"{_OWNER}: unknown config key {name}: ring entries are {RING_PREFIX}<id>.key.file or "
                f"{RING_PREFIX}<id>.kms.key.id, with <id> listed in encryption.key.pairs ({', '.join(ids) or 'empty'})"
            )
        entries[key_id][prop] = parse_str(value)
    active = core["encryption.key.pair.id"] or None
    if core["encryption.enabled"] and active is None:
        raise ConfigError(f"{_OWNER}: encryption.enabled=true needs config key encryption.key.pair.id (the active "
                          "key id, one of encryption.key.pairs)")
    if not ids:
        if active is not None:
            raise ConfigError(f"{_OWNER}: config key encryption.key.pair.id is set but encryption.key.pairs is empty")
        return None
    keys: dict[str, KeyEncryptionKey] = {}
    kms_client = None
    for key_id, props in entries.items():
        if len(props) != 1:
            raise ConfigError(
                f"{_OWNER}: ring entry {key_id!r} needs exactly one of {RING_PREFIX}{key_id}.key.file and "
                f"{RING_PREFIX}{key_id}.kms.key.id"
            )
        if "key.file" in props:
            keys[key_id] = FileKey(key_id, Path(props["key.file"]))
        else:
            kms_client = kms_client or _kms_client(core)
            keys[key_id] = KmsKey(key_id, props["kms.key.id"], kms_client)
    return KeyRing(keys, active)


def _kms_client(core: Mapping[str, Any]) -> Any:
    import boto3
    from botocore.config import Config

    timeout_s = core["encryption.kms.request.timeout.ms"] / 1000.0
    access, secret = core["encryption.kms.access.key.id"], core["encryption.kms.secret.access.key"]
    if bool(access) != bool(secret):
        raise ConfigError(f"{_OWNER}: set both encryption.kms.access.key.id and encryption.kms.secret.access.key, "
                          "or neither (the default credential chain)")
    return boto3.client(
        "kms",
        region_name=core["encryption.kms.region"],
        endpoint_url=core["encryption.kms.endpoint.url"] or None,
        aws_access_key_id=access or None,
        aws_secret_access_key=secret or None,
        config=Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 3}),
    )


__all__ = [
    "CONFIG_KEYS",
    "DATA_KEY_BYTES",
    "ENTRY_PROPERTIES",
    "RING_PREFIX",
    "SLOT_SIZE",
    "DataKeyError",
    "FileKey",
    "KeyEncryptionKey",
    "KeyRing",
    "KmsKey",
    "WrappedKey",
    "build_keyring",
]
