"""A worker's read of metadata partitions as raw record batches (rlmm.fresh_load): kafka-python's client fetches them
and rlmm/_record_batches.c reads them into (offset, key, value) tuples: about 0.5 µs per record, where librdkafka's
consumer costs 1.2-1.5 µs (one Message object each). Only what the consumer would give is read this way; anything
else is RawFetchUnusable, and the worker reads the group with the consumer instead:

- a client setting it does not carry over to kafka-python (`_KAFKA_PYTHON` names those it does: the broker list,
  the client id, TLS from PEM files, SASL PLAIN and SCRAM), or a value of one it does not take: the consumer keeps
  every setting an operator gave;
- a transactional or control batch (the consumer, reading committed records only, skips aborted transactions);
- an offset no longer on the log, a batch of an older format, a partition error that a fresh look at the cluster's
  leaders does not cure, or no bytes for `idle_s`.
"""

from __future__ import annotations

import logging
import ssl
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, TypeVar

from rlmm import record_batches

log = logging.getLogger(__name__)

_record_batches: ModuleType | None
try:  # built by setup.py where a C compiler is (optional): see rlmm/_record_batches.c
    from rlmm import _record_batches
except ImportError:  # a build without the compiler: the consumer reads every group
    _record_batches = None

# The client settings (librdkafka's names, as rlmm.client_security gives them) this reader carries over, and
# kafka-python's name of each; any other makes it unusable (the consumer reads the group instead).
_KAFKA_PYTHON = {
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.endpoint.identification.algorithm": "ssl_check_hostname",
}
_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
_SASL_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"})
_FETCH_VERSION = 10  # Kafka 2.1 and later; Kafka 4 serves 4 to 17
_FETCH_MAX_BYTES = 64 << 20  # per fetch, over the partitions asked
_PARTITION_MAX_BYTES = 16 << 20
_FETCH_WAIT_MS = 100
# kafka-python reads a socket 4 KiB at a time (its sock_chunk_bytes): a Fetch's megabytes took a read call per 4 KiB,
# a tenth of a worker's CPU in a rebuild. Read in larger chunks, up to 1,000 of them at a time (as kafka-python does).
_SOCKET_CHUNK_BYTES = 256 << 10
_READ_COMMITTED = 1
_REQUEST_TIMEOUT_MS = 30_000
# Partition errors a fresh look at the leaders cures (the partition moved, or its leader is being elected).
_RETRIABLE = frozenset({
    3,   # UNKNOWN_TOPIC_OR_PARTITION
    5,   # LEADER_NOT_AVAILABLE
    6,   # NOT_LEADER_OR_FOLLOWER
    7,   # REQUEST_TIMED_OUT
    56,  # KAFKA_STORAGE_ERROR
    74,  # FENCED_LEADER_EPOCH
    75,  # UNKNOWN_LEADER_EPOCH
})
_OFFSET_OUT_OF_RANGE = 1
_RETRY_BACKOFF_S = 0.1
_CONNECT_WAIT_S = 1.0  # for a connection to a leader, before its partitions' leaders are looked up again

Records = list[tuple[int, bytes | None, bytes | None]]
Taken = TypeVar("Taken")
# What a read does with the bytes a Fetch response holds for one partition: (partition, data, start, end) -> (what it
# took of the records with offsets in [start, end), the offset after the last whole batch or -1, whether it stopped at
# a transactional or control batch); ValueError for bytes that do not frame exactly (rlmm.record_batches.read).
Take = Callable[[int, bytes, int, int], tuple[Taken, int, bool]]


class RawFetchUnusable(Exception):
    """This read cannot give what the consumer would: the message says why."""


def unusable_for(client_config: Mapping[str, Any]) -> str | None:
    """Why these client settings (librdkafka's names) keep this reader from being used, or None."""
    if _record_batches is None:
        return "rlmm._record_batches is not built (no C compiler at install)"
    try:
        kafka_python_settings(client_config)
    except RawFetchUnusable as exc:
        return str(exc)
    return None


def kafka_python_settings(client_config: Mapping[str, Any]) -> dict[str, Any]:
    """kafka-python's settings for the same connection as librdkafka's `client_config`; RawFetchUnusable naming a
    setting it cannot carry over."""
    other = sorted(set(client_config) - {"bootstrap.servers", *_KAFKA_PYTHON})
    if other:
        raise RawFetchUnusable(f"client settings it does not carry over: {', '.join(other)}")
    servers = [server.strip() for server in str(client_config.get("bootstrap.servers", "")).split(",")]
    if not all(servers):
        raise RawFetchUnusable("no bootstrap.servers")
    settings: dict[str, Any] = {"bootstrap_servers": servers, "client_id": "tierlog-fold-worker"}
    for name, value in client_config.items():
        if name in _KAFKA_PYTHON:
            settings[_KAFKA_PYTHON[name]] = str(value)
    protocol = settings["security_protocol"] = settings.get("security_protocol", "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise RawFetchUnusable(f"security.protocol {protocol}")
    if protocol.startswith("SASL"):
        mechanism = settings["sasl_mechanism"] = settings.get("sasl_mechanism", "GSSAPI").upper()
        if mechanism not in _SASL_MECHANISMS:
            raise RawFetchUnusable(f"sasl.mechanism {mechanism}")
    host_check = settings.get("ssl_check_hostname", "https").lower()
    if host_check not in ("https", "none"):
        raise RawFetchUnusable(f"ssl.endpoint.identification.algorithm {host_check}")
    settings["ssl_check_hostname"] = host_check == "https"  # librdkafka checks the host by default, as Java does
    return settings


def _with_tls_context(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` with their TLS files loaded into a context of Python's defaults (a verified certificate chain, TLS
    1.2 or later, the host name checked unless librdkafka's settings turned that off), as librdkafka verifies."""
    tls = {name: settings.pop(name) for name in list(settings) if name.startswith("ssl_")}
    try:
        context = ssl.create_default_context(cafile=tls.get("ssl_cafile"))
        context.check_hostname = tls["ssl_check_hostname"]
        if "ssl_certfile" in tls or "ssl_keyfile" in tls:
            context.load_cert_chain(tls.get("ssl_certfile") or tls["ssl_keyfile"], tls.get("ssl_keyfile"),
                                    tls.get("ssl_password"))
    except (OSError, ssl.SSLError) as exc:
        raise RawFetchUnusable(f"its TLS settings do not load: {exc}") from exc
    return {**settings, "ssl_context": context}


def _import_kafka_python(sasl_mechanism: str | None) -> None:
    """Import kafka-python's client. Its import takes botocore along (half of a fold worker's start, which is on a
    rebuild's way) for one SASL mechanism only, AWS_MSK_IAM: for any other, it is imported without."""
    without = sasl_mechanism != "AWS_MSK_IAM" and "kafka.client_async" not in sys.modules and \
        "botocore.session" not in sys.modules
    if without:
        sys.modules["botocore.session"] = None  # type: ignore[assignment]  # its import raises ImportError
    try:
        import kafka.client_async  # noqa: F401
    finally:
        if without:
            del sys.modules["botocore.session"]


def _records(partition: int, data: bytes, start: int, end: int) -> tuple[Records, int, bool]:
    assert _record_batches is not None, "a RawReader starts only where it is built"
    return _record_batches.read(data, start, end, record_batches.decompress)


class RawReader:
    """Fetches metadata partitions of `topic` whole, as raw batches, from their leaders."""

    def __init__(self, topic: str, client_config: Mapping[str, Any], timeout_s: float) -> None:
        if _record_batches is None:
            raise RawFetchUnusable("rlmm._record_batches is not built (no C compiler at install)")
        settings = kafka_python_settings(client_config)
        if settings["security_protocol"] in ("SSL", "SASL_SSL"):
            settings = _with_tls_context(settings)
        _import_kafka_python(settings.get("sasl_mechanism"))
        from kafka.client_async import KafkaClient
        from kafka.errors import KafkaError

        self.topic = topic
        try:
            self._client = KafkaClient(**settings, request_timeout_ms=_REQUEST_TIMEOUT_MS,
                                       api_version_auto_timeout_ms=int(timeout_s * 1000),
                                       sock_chunk_bytes=_SOCKET_CHUNK_BYTES)
        except KafkaError as exc:
            raise RawFetchUnusable(f"kafka-python's client did not start: {exc!r}") from exc
        try:
            from kafka.protocol.fetch import FetchRequest

            self._request = FetchRequest[_FETCH_VERSION]
            if self._client.api_version(FetchRequest, max_version=_FETCH_VERSION) < _FETCH_VERSION:
                raise RawFetchUnusable(f"the broker serves Fetch below version {_FETCH_VERSION}")
            self._client.set_topics([topic])  # metadata of this topic only
        except KafkaError as exc:
            self.close()
            raise RawFetchUnusable(f"the broker's Fetch versions: {exc!r}") from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._client.close()

    def read(self, starts: Mapping[int, int], ends: Mapping[int, int], idle_s: float
             ) -> Iterator[tuple[int, Records]]:
        """Each partition's records from its start to its end, in order within a partition, as they come: (partition,
        records), records with offsets in [start, end). RawFetchUnusable for anything the consumer would read
        differently, or no bytes for `idle_s`."""
        return self.take(starts, ends, idle_s, _records)

    def take(self, starts: Mapping[int, int], ends: Mapping[int, int], idle_s: float, take: Take[Taken]
             ) -> Iterator[tuple[int, Taken]]:
        """`read`, with what `take` takes of each partition's records (in order within a partition, as they come)
        where read has them: (partition, taken) when it took any."""
        next_offsets = {p: starts[p] for p in starts if ends[p] > starts[p]}
        heard = time.monotonic()
        leaders = self._leaders(next_offsets, heard + idle_s)
        turn = 0
        while next_offsets:
            # A fetch fills its byte limit partition by partition, in the order asked: each fetch begins with the next
            # partition, so that none waits behind the others.
            order = sorted(next_offsets)
            turn += 1
            by_leader: dict[int, list[int]] = {}
            for partition in order[turn % len(order):] + order[:turn % len(order)]:
                by_leader.setdefault(leaders[partition], []).append(partition)
            stale = False
            for node, partitions in by_leader.items():
                answers = self._fetch(node, partitions, next_offsets)
                if answers is None:  # the broker is gone or does not answer: its partitions may have moved
                    stale = True
                    continue
                for partition, error, data in answers:
                    if partition not in next_offsets:  # not asked for (or asked twice): nothing to take from it
                        continue
                    if error in _RETRIABLE:
                        stale = True
                        continue
                    if error == _OFFSET_OUT_OF_RANGE:
                        raise RawFetchUnusable(f"offset {next_offsets[partition]} of metadata partition {partition} "
                                               "is no longer on the log")
                    if error:
                        raise RawFetchUnusable(f"metadata partition {partition}: error code {error}")
                    start, end = next_offsets[partition], ends[partition]
                    try:
                        taken, after, transactional = take(partition, data, start, end)
                    except ValueError as exc:
                        raise RawFetchUnusable(f"metadata partition {partition} at offset {start}: {exc}") from exc
                    if transactional:
                        raise RawFetchUnusable(f"metadata partition {partition} holds a transaction's batches near "
                                               f"offset {start}")
                    if after > start:
                        heard = time.monotonic()
                        if after >= end:
                            del next_offsets[partition]
                        else:
                            next_offsets[partition] = after
                    if taken:
                        yield partition, taken
            if stale:
                time.sleep(_RETRY_BACKOFF_S)
                leaders = self._leaders(next_offsets, heard + idle_s)
            elif time.monotonic() - heard > idle_s:
                raise RawFetchUnusable(f"no record came from metadata partitions {sorted(next_offsets)} for "
                                       f"{idle_s:g} s")

    def _leaders(self, partitions: Mapping[int, int], deadline: float) -> dict[int, int]:
        """The leader of each partition, from metadata asked for now."""
        from kafka.structs import TopicPartition

        client = self._client
        while True:
            future = client.cluster.request_update()
            client.poll(timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)), future=future)
            leaders = {p: client.cluster.leader_for_partition(TopicPartition(self.topic, p)) for p in partitions}
            if all(leader is not None and leader >= 0 for leader in leaders.values()):
                return leaders
            if time.monotonic() > deadline:
                raise RawFetchUnusable(f"no leader known for metadata partitions "
                                       f"{sorted(p for p, leader in leaders.items() if leader is None or leader < 0)}")
            time.sleep(_RETRY_BACKOFF_S)

    def _fetch(self, node: int, partitions: list[int], offsets: Mapping[int, int]
               ) -> list[tuple[int, int, bytes]] | None:
        """One Fetch of `partitions` from `node`: (partition, error code, its batches' bytes) each; None when the
        broker cannot be reached or its connection failed (the caller looks at the leaders again)."""
        client = self._client
        request = self._request(
            -1, _FETCH_WAIT_MS, 1, _FETCH_MAX_BYTES, _READ_COMMITTED, 0, -1,
            [(self.topic, [(p, -1, offsets[p], -1, _PARTITION_MAX_BYTES) for p in partitions])], [])
        connecting = time.monotonic() + _CONNECT_WAIT_S
        while not client.ready(node):
            if time.monotonic() > connecting:
                log.debug("metadata topic %s: no connection to broker %d in %g s", self.topic, node, _CONNECT_WAIT_S)
                return None
            client.poll(timeout_ms=100)
        future = client.send(node, request)
        client.poll(timeout_ms=_REQUEST_TIMEOUT_MS + 1000, future=future)
        if not future.is_done:
            log.debug("metadata topic %s: a fetch from broker %d got no answer", self.topic, node)
            return None
        if future.failed():
            if getattr(future.exception, "retriable", False):
                log.debug("metadata topic %s: a fetch from broker %d failed: %r", self.topic, node, future.exception)
                return None
            raise RawFetchUnusable(f"a fetch from broker {node} failed: {future.exception!r}")
        response = future.value
        if response.error_code:
            raise RawFetchUnusable(f"a fetch from broker {node} failed: error code {response.error_code}")
        found = []
        for topic, answers in response.topics:
            if topic != self.topic:
                continue
            for partition, error, *rest in answers:
                found.append((partition, error, rest[-1] or b""))
        return found
