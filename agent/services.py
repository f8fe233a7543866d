"""The agent's gRPC services: Agent (lifecycle), RemoteLogMetadata and RemoteStorage, each call forwarded
to tierlog's rlmm or rsm, with tierlog's errors mapped to status codes the JVM adapter turns into Kafka's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import grpc

from agent import messages
from agent.broker_config import rlmm_config, rsm_config
from agent.components import CONFIG_ERROR_WAIT_S, ComponentName, ComponentSlot, NotConfiguredError
from agent.metrics import AgentMetrics
from agent.proto import agent_pb2 as pb
from agent.proto import agent_pb2_grpc as pb_grpc
from rlmm.errors import (
    InvalidArgumentError,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageNotReadyError,
)

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# Streamed chunks: big enough to amortize per-message cost, small enough that the two processes
# together hold a few of them, never a segment.
CHUNK_BYTES = 256 * 1024
# A call without a deadline (a hand-made client) still must not wait forever for a component.
DEFAULT_WAIT_S = 30.0
EMPTY = pb.Empty()


def _status_for(exc: BaseException) -> grpc.StatusCode:
    # Order matters: the specific errors subclass RemoteStorageError (and ValueError).
    if isinstance(exc, NotConfiguredError):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, RemoteResourceNotFoundError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, RemoteStorageNotReadyError):
        return grpc.StatusCode.ABORTED
    if isinstance(exc, (InvalidArgumentError, ValueError)):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.INTERNAL


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RemoteStorageError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return f"not done within the caller's deadline ({exc or 'timed out'})"
    return f"{type(exc).__name__}: {exc}"


class Components:
    """The agent's rlmm and rsm slots, created by the broker's Configure calls (or the agent's config)."""

    def __init__(
        self,
        factories: Mapping[ComponentName, Callable[[Mapping[str, Any]], Any]],
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self._factories = dict(factories)
        self._on_idle = on_idle
        self._lock = threading.Lock()
        self._slots: dict[ComponentName, ComponentSlot[Any]] = {}
        self._preset: set[ComponentName] = set()

    @staticmethod
    def translate(name: ComponentName, config: Mapping[str, Any]) -> dict[str, Any]:
        return (
            rlmm_config(config) if name is ComponentName.REMOTE_LOG_METADATA_MANAGER else rsm_config(config)
        )

    def preset(self, name: ComponentName, config: Mapping[str, Any]) -> None:
        """Create a component from the agent's own config; a broker's later Configure leaves it alone."""
        self._install(name, self.translate(name, config))
        self._preset.add(name)

    def configure(self, name: ComponentName, broker_config: Mapping[str, Any]) -> None:
        if name in self._preset:
            log.info(
                "the %s was configured by the agent's own config; the broker's config is not used", name.short
            )
            return
        config = self.translate(name, broker_config)
        with self._lock:
            current = self._slots.get(name)
        if current is not None and current.failed is None:
            if current.config == config:
                return
            raise InvalidArgumentError(
                f"the {name.short} is already configured with a different config; "
                "each broker needs its own agent (agent.socket.path)"
            )
        slot = self._install(name, config)
        error = slot.wait_created(CONFIG_ERROR_WAIT_S)
        if error is not None:
            raise error

    def _install(self, name: ComponentName, config: dict[str, Any]) -> ComponentSlot[Any]:
        slot: ComponentSlot[Any] = ComponentSlot(name, self._factories[name], config)
        with self._lock:
            old, self._slots[name] = self._slots.get(name), slot
        if old is not None:
            old.close()
        return slot

    def slot(self, name: ComponentName) -> ComponentSlot[Any]:
        with self._lock:
            slot = self._slots.get(name)
        if slot is None:
            raise NotConfiguredError(
                f"the {name.short} is not configured in this agent (did the agent restart?)"
            )
        return slot

    def get(self, name: ComponentName, timeout: float) -> Any:
        return self.slot(name).get(timeout)

    def configured(self) -> list[ComponentName]:
        with self._lock:
            return sorted(n for n, s in self._slots.items() if s.failed is None)

    def close(self, name: ComponentName) -> None:
        with self._lock:
            slot = self._slots.pop(name, None)
            idle = not self._slots
        if slot is not None:
            slot.close()
            log.info("the broker closed the %s", name.short)
        if idle and slot is not None and self._on_idle is not None:
            self._on_idle()

    def close_all(self) -> None:
        with self._lock:
            slots = list(self._slots.values())
            self._slots.clear()
        for slot in slots:
            slot.close()


class _Calls:
    """Wraps servicer methods: metrics, and tierlog's exceptions turned into gRPC status codes."""

    def __init__(self, service: str, metrics: AgentMetrics) -> None:
        self.service = service
        self.metrics = metrics

    def _fail(self, method: str, exc: BaseException, context: grpc.ServicerContext) -> None:
        code = _status_for(exc)
        if code is grpc.StatusCode.INTERNAL:
            log.exception("%s.%s failed", self.service, method)
        else:
            log.info("%s.%s: %s: %s", self.service, method, code.name, exc)
        self.metrics.calls.labels(self.service, method, code.name).inc()
        context.abort(code, _describe(exc))

    def unary(self, fn: F) -> F:
        method = fn.__name__

        @functools.wraps(fn)
        def wrapper(servicer: Any, request: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                response = fn(servicer, request, context)
            except Exception as exc:
                self._fail(method, exc, context)
                raise  # not reached: abort raises
            self.metrics.observe(self.service, method, "OK", time.perf_counter() - started)
            return response

        return wrapper  # type: ignore[return-value]

    def stream(self, fn: F) -> F:
        method = fn.__name__

        @functools.wraps(fn)
        def wrapper(servicer: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            started = time.perf_counter()
            try:
                yield from fn(servicer, request, context)
            except GeneratorExit:
                # The broker closed the stream early (it read what it needed): not an error.
                self.metrics.observe(self.service, method, "CANCELLED", time.perf_counter() - started)
                raise
            except Exception as exc:
                self._fail(method, exc, context)
                raise
            self.metrics.observe(self.service, method, "OK", time.perf_counter() - started)

        return wrapper  # type: ignore[return-value]


def _optional_segment(found: Any) -> Any:
    return pb.OptionalSegment(segment=messages.segment_metadata_msg(found)) if found else pb.OptionalSegment()


def _wait_budget(context: grpc.ServicerContext) -> float:
    remaining = context.time_remaining()
    # Leave a little of the caller's deadline for the answer to travel back.
    return DEFAULT_WAIT_S if remaining is None else max(remaining - 0.2, 0.0)


def build_services(components: Components, metrics: AgentMetrics) -> list[tuple[Any, Callable[..., None]]]:
    """The three servicers with their registration functions."""
    lifecycle = _Calls("Agent", metrics)
    metadata = _Calls("RemoteLogMetadata", metrics)
    storage = _Calls("RemoteStorage", metrics)
    rlmm_name = ComponentName.REMOTE_LOG_METADATA_MANAGER
    rsm_name = ComponentName.REMOTE_STORAGE_MANAGER

    def rlmm(context: grpc.ServicerContext) -> Any:
        return components.get(rlmm_name, _wait_budget(context))

    def rsm(context: grpc.ServicerContext) -> Any:
        return components.get(rsm_name, _wait_budget(context))

    def component(value: int) -> ComponentName:
        try:
            return ComponentName(value)
        except ValueError:
            raise InvalidArgumentError(f"unknown component {value}") from None

    class AgentService:
        @lifecycle.unary
        def Configure(self, request: Any, context: grpc.ServicerContext) -> Any:
            components.configure(component(request.component), dict(request.config))
            return EMPTY

        @lifecycle.unary
        def Close(self, request: Any, context: grpc.ServicerContext) -> Any:
            components.close(component(request.component))
            return EMPTY

        @lifecycle.unary
        def Health(self, request: Any, context: grpc.ServicerContext) -> Any:
            return pb.HealthResponse(
                serving=True, configured=[int(c) for c in components.configured()], pid=os.getpid()
            )

    class RemoteLogMetadataService:
        @metadata.unary
        def AddRemoteLogSegmentMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
            segment = messages.segment_metadata(request)
            rlmm(context).add_remote_log_segment_metadata(segment).result(timeout=_wait_budget(context))
            return EMPTY

        @metadata.unary
        def UpdateRemoteLogSegmentMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
            update = messages.segment_update(request)
            rlmm(context).update_remote_log_segment_metadata(update).result(timeout=_wait_budget(context))
            return EMPTY

        @metadata.unary
        def PutRemotePartitionDeleteMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
            delete = messages.partition_delete(request)
            rlmm(context).put_remote_partition_delete_metadata(delete).result(timeout=_wait_budget(context))
            return EMPTY

        @metadata.unary
        def GetRemoteLogSegmentMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
            tp = messages.topic_id_partition(request.topic_id_partition)
            return _optional_segment(rlmm(context).remote_log_segment_metadata(tp, request.epoch, request.offset))

        @metadata.unary
        def HighestOffsetForEpoch(self, request: Any, context: grpc.ServicerContext) -> Any:
            tp = messages.topic_id_partition(request.topic_id_partition)
            offset = rlmm(context).highest_offset_for_epoch(tp, request.epoch)
            return pb.OptionalOffset() if offset is None else pb.OptionalOffset(offset=offset)

        @metadata.stream
        def ListRemoteLogSegments(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            tp = messages.topic_id_partition(request.topic_id_partition)
            epoch = request.epoch if request.HasField("epoch") else None
            for segment in rlmm(context).list_remote_log_segments(tp, epoch):
                yield messages.segment_metadata_msg(segment)

        @metadata.unary
        def OnPartitionLeadershipChanges(self, request: Any, context: grpc.ServicerContext) -> Any:
            leaders = {messages.topic_id_partition(tp) for tp in request.leaders}
            followers = {messages.topic_id_partition(tp) for tp in request.followers}
            # Never blocks the broker: before the rlmm exists the change is queued, as Kafka's manager does.
            components.slot(rlmm_name).when_ready(
                lambda m: m.on_partition_leadership_changes(leaders, followers)
            )
            return EMPTY

        @metadata.unary
        def OnStopPartitions(self, request: Any, context: grpc.ServicerContext) -> Any:
            partitions = {messages.topic_id_partition(tp) for tp in request.partitions}
            components.slot(rlmm_name).when_ready(lambda m: m.on_stop_partitions(partitions))
            return EMPTY

        @metadata.unary
        def RemoteLogSize(self, request: Any, context: grpc.ServicerContext) -> Any:
            tp = messages.topic_id_partition(request.topic_id_partition)
            return pb.Size(bytes=rlmm(context).remote_log_size(tp, request.epoch))

        @metadata.unary
        def NextSegmentWithTxnIndex(self, request: Any, context: grpc.ServicerContext) -> Any:
            tp = messages.topic_id_partition(request.topic_id_partition)
            return _optional_segment(rlmm(context).next_segment_with_txn_index(tp, request.epoch, request.offset))

        @metadata.unary
        def IsReady(self, request: Any, context: grpc.ServicerContext) -> Any:
            tp = messages.topic_id_partition(request)
            manager = components.slot(rlmm_name).get_nowait()
            return pb.Ready(ready=manager is not None and bool(manager.is_ready(tp)))

    class RemoteStorageService:
        @storage.unary
        def CopyLogSegmentData(self, request: Any, context: grpc.ServicerContext) -> Any:
            metadata_ = messages.segment_metadata(request.metadata)
            custom = rsm(context).copy_log_segment_data(metadata_, messages.log_segment_data(request))
            return pb.CopyResponse() if custom is None else pb.CopyResponse(custom_metadata=custom)

        @storage.stream
        def FetchLogSegment(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            metadata_ = messages.segment_metadata(request.metadata)
            end = request.end_position if request.HasField("end_position") else None
            stream = rsm(context).fetch_log_segment(metadata_, request.start_position, end)
            yield from _chunks(stream, metrics, "FetchLogSegment")

        @storage.stream
        def FetchIndex(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            metadata_ = messages.segment_metadata(request.metadata)
            stream = rsm(context).fetch_index(metadata_, messages.index_type(request.index_type))
            yield from _chunks(stream, metrics, "FetchIndex")

        @storage.unary
        def DeleteLogSegmentData(self, request: Any, context: grpc.ServicerContext) -> Any:
            rsm(context).delete_log_segment_data(messages.segment_metadata(request))
            return EMPTY

    return [
        (AgentService(), pb_grpc.add_AgentServicer_to_server),
        (RemoteLogMetadataService(), pb_grpc.add_RemoteLogMetadataServicer_to_server),
        (RemoteStorageService(), pb_grpc.add_RemoteStorageServicer_to_server),
    ]


def _chunks(stream: Any, metrics: AgentMetrics, method: str) -> Iterator[Any]:
    """Yield a fetched stream in chunks; gRPC pulls the next one only when the broker has room for it."""
    with contextlib.closing(stream):
        while True:
            data = stream.read(CHUNK_BYTES)
            if not data:
                return
            metrics.streamed.labels(method).inc(len(data))
            yield pb.Chunk(data=data)
