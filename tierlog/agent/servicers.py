"""The agent's gRPC servicers, one class per service of schemas/agent.proto: Agent (lifecycle),
RemoteLogMetadata and RemoteStorage. Each call goes to tierlog's rlmm or rsm; tierlog's errors become status
codes the JVM adapter turns into Kafka's exceptions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from rlmm.errors import (
    InvalidArgumentError,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageNotReadyError,
)
from rsm.failure_log import RepeatedFailureLog
from rsm.manager import IndexAbsentError
from tierlog.agent import messages
from tierlog.agent.components import ComponentName, Components, NotConfiguredError
from tierlog.agent.metrics import ERROR, EXPECTED, OK, AgentMetrics
from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# Streamed chunks: big enough to amortize per-message cost, small enough that the two processes
# together hold a few of them, never a segment.
CHUNK_BYTES = 256 * 1024
# FetchLogSegmentFiles' answer when it has no files to offer.
FILES_UNAVAILABLE = (
    "no files for this range (the rsm has no disk chunk cache, the segment was written before chunk indexes, or "
    "the cache disk is full): read it with FetchLogSegment"
)
# A call without a deadline (a hand-made client) still must not wait forever for a component.
DEFAULT_WAIT_S = 30.0
# ListRemoteLogSegmentsAtOnce answers a partition of at most this many segments (about 200 KB, well within a
# gRPC message), else `stream_instead`.
LIST_AT_ONCE_MAX = 1000
EMPTY = pb.Empty()
RLMM = ComponentName.REMOTE_LOG_METADATA_MANAGER
RSM = ComponentName.REMOTE_STORAGE_MANAGER
# Answers the broker expects on healthy traffic (most segments have no transaction index; a partition or a
# component is not ready while it starts or catches up): outcome "expected", not logged above DEBUG.
_EXPECTED = (IndexAbsentError, RemoteStorageNotReadyError)


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


class Servicer:
    """What the three servicers share: the components they call, metrics, and errors turned into status codes."""

    SERVICE = ""

    def __init__(self, components: Components, metrics: AgentMetrics) -> None:
        self.components = components
        self.metrics = metrics
        # Per method: an internal failure that repeats (a wrong S3 secret fails every copy) is logged once, then
        # counted, not a traceback per call.
        self._failures: dict[str, RepeatedFailureLog] = {}

    def rlmm(self, context: grpc.ServicerContext) -> Any:
        return self.components.get(RLMM, _wait_budget(context))

    def rsm(self, context: grpc.ServicerContext) -> Any:
        return self.components.get(RSM, _wait_budget(context))

    def fail(self, method: str, exc: BaseException, context: grpc.ServicerContext, started: float) -> None:
        code = _status_for(exc)
        expected = isinstance(exc, _EXPECTED)
        if expected:
            log.debug("%s.%s: %s: %s", self.SERVICE, method, code.name, exc)
        elif code is grpc.StatusCode.INTERNAL:
            failures = self._failures.get(method)
            if failures is None:
                failures = self._failures.setdefault(method, RepeatedFailureLog(log, f"{self.SERVICE}.{method}"))
            # tierlog's own errors say what failed; anything else is a bug, whose stack matters.
            failures.failed(exc, traceback=not isinstance(exc, RemoteStorageError))
        else:
            log.info("%s.%s: %s: %s", self.SERVICE, method, code.name, exc)
        self.metrics.observe(self.SERVICE, method, code.name, time.perf_counter() - started,
                             EXPECTED if expected else ERROR)
        context.abort(code, _describe(exc))

    def succeeded(self, method: str, started: float) -> None:
        self.metrics.observe(self.SERVICE, method, "OK", time.perf_counter() - started, OK)
        failures = self._failures.get(method)
        if failures is not None:
            failures.succeeded()


def unary(fn: F) -> F:
    """A unary call: timed, and its exception turned into the matching status code."""
    method = fn.__name__

    @functools.wraps(fn)
    def wrapper(servicer: Servicer, request: Any, context: grpc.ServicerContext) -> Any:
        started = time.perf_counter()
        try:
            response = fn(servicer, request, context)
        except Exception as exc:
            servicer.fail(method, exc, context, started)
            raise  # not reached: abort raises
        servicer.succeeded(method, started)
        return response

    return wrapper  # type: ignore[return-value]


def stream(fn: F) -> F:
    """A server-streaming call: as `unary`, and a stream the broker closes early is not an error."""
    method = fn.__name__

    @functools.wraps(fn)
    def wrapper(servicer: Servicer, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        started = time.perf_counter()
        try:
            yield from fn(servicer, request, context)
        except GeneratorExit:
            # The broker closed the stream early (it read what it needed): not an error.
            servicer.metrics.observe(servicer.SERVICE, method, "CANCELLED", time.perf_counter() - started, EXPECTED)
            raise
        except Exception as exc:
            servicer.fail(method, exc, context, started)
            raise
        servicer.succeeded(method, started)

    return wrapper  # type: ignore[return-value]


def _optional_segment(found: Any) -> Any:
    return pb.OptionalSegment(segment=messages.segment_metadata_msg(found)) if found else pb.OptionalSegment()


def _wait_budget(context: grpc.ServicerContext) -> float:
    remaining = context.time_remaining()
    # Leave a little of the caller's deadline for the answer to travel back.
    return DEFAULT_WAIT_S if remaining is None else max(remaining - 0.2, 0.0)


def _component(value: int) -> ComponentName:
    try:
        return ComponentName(value)
    except ValueError:
        raise InvalidArgumentError(f"unknown component {value}") from None


class AgentServicer(Servicer):
    """Lifecycle: the broker configures and closes each component; health for the adapter's probe."""

    SERVICE = "Agent"

    @unary
    def Configure(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.components.configure(_component(request.component), dict(request.config))
        return EMPTY

    @unary
    def Close(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.components.close(_component(request.component))
        return EMPTY

    @unary
    def Health(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.HealthResponse(
            serving=True, configured=[int(c) for c in self.components.configured()], pid=os.getpid()
        )


class RemoteLogMetadataServicer(Servicer):
    """Kafka's RemoteLogMetadataManager calls, forwarded to tierlog's rlmm."""

    SERVICE = "RemoteLogMetadata"

    @unary
    def AddRemoteLogSegmentMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        segment = messages.segment_metadata(request)
        manager = self.rlmm(context)
        with self.metrics.metadata_write("add_segment"):
            manager.add_remote_log_segment_metadata(segment).result(timeout=_wait_budget(context))
        return EMPTY

    @unary
    def UpdateRemoteLogSegmentMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        update = messages.segment_update(request)
        manager = self.rlmm(context)
        with self.metrics.metadata_write("update_segment"):
            manager.update_remote_log_segment_metadata(update).result(timeout=_wait_budget(context))
        return EMPTY

    @unary
    def PutRemotePartitionDeleteMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        delete = messages.partition_delete(request)
        manager = self.rlmm(context)
        with self.metrics.metadata_write("delete_partition"):
            manager.put_remote_partition_delete_metadata(delete).result(timeout=_wait_budget(context))
        return EMPTY

    @unary
    def GetRemoteLogSegmentMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        tp = messages.topic_id_partition(request.topic_id_partition)
        return _optional_segment(self.rlmm(context).remote_log_segment_metadata(tp, request.epoch, request.offset))

    @unary
    def HighestOffsetForEpoch(self, request: Any, context: grpc.ServicerContext) -> Any:
        tp = messages.topic_id_partition(request.topic_id_partition)
        offset = self.rlmm(context).highest_offset_for_epoch(tp, request.epoch)
        return pb.OptionalOffset() if offset is None else pb.OptionalOffset(offset=offset)

    def _listed(self, request: Any, context: grpc.ServicerContext) -> list[Any]:
        tp = messages.topic_id_partition(request.topic_id_partition)
        epoch = request.epoch if request.HasField("epoch") else None
        return list(self.rlmm(context).list_remote_log_segments(tp, epoch))

    @stream
    def ListRemoteLogSegments(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        for segment in self._listed(request, context):
            yield messages.segment_metadata_msg(segment)

    @unary
    def ListRemoteLogSegmentsAtOnce(self, request: Any, context: grpc.ServicerContext) -> Any:
        segments = self._listed(request, context)
        if len(segments) > LIST_AT_ONCE_MAX:
            return pb.SegmentList(stream_instead=True)
        return pb.SegmentList(segments=[messages.segment_metadata_msg(s) for s in segments])

    @unary
    def OnPartitionLeadershipChanges(self, request: Any, context: grpc.ServicerContext) -> Any:
        leaders = {messages.topic_id_partition(tp) for tp in request.leaders}
        followers = {messages.topic_id_partition(tp) for tp in request.followers}
        # Never blocks the broker: before the rlmm exists the change is queued, as Kafka's manager does.
        self.components.slot(RLMM).when_ready(lambda m: m.on_partition_leadership_changes(leaders, followers))
        return EMPTY

    @unary
    def OnStopPartitions(self, request: Any, context: grpc.ServicerContext) -> Any:
        partitions = {messages.topic_id_partition(tp) for tp in request.partitions}
        self.components.slot(RLMM).when_ready(lambda m: m.on_stop_partitions(partitions))
        return EMPTY

    @unary
    def RemoteLogSize(self, request: Any, context: grpc.ServicerContext) -> Any:
        tp = messages.topic_id_partition(request.topic_id_partition)
        return pb.Size(bytes=self.rlmm(context).remote_log_size(tp, request.epoch))

    @unary
    def NextSegmentWithTxnIndex(self, request: Any, context: grpc.ServicerContext) -> Any:
        tp = messages.topic_id_partition(request.topic_id_partition)
        return _optional_segment(self.rlmm(context).next_segment_with_txn_index(tp, request.epoch, request.offset))

    @unary
    def IsReady(self, request: Any, context: grpc.ServicerContext) -> Any:
        tp = messages.topic_id_partition(request)
        manager = self.components.slot(RLMM).get_if_created()
        return pb.Ready(ready=manager is not None and bool(manager.is_ready(tp)))


class RemoteStorageServicer(Servicer):
    """Kafka's RemoteStorageManager calls, forwarded to tierlog's rsm; fetched bytes stream back in chunks."""

    SERVICE = "RemoteStorage"

    @unary
    def CopyLogSegmentData(self, request: Any, context: grpc.ServicerContext) -> Any:
        metadata = messages.segment_metadata(request.metadata)
        custom = self.rsm(context).copy_log_segment_data(metadata, messages.log_segment_data(request))
        return pb.CopyResponse() if custom is None else pb.CopyResponse(custom_metadata=custom)

    @stream
    def FetchLogSegment(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        metadata = messages.segment_metadata(request.metadata)
        end = request.end_position if request.HasField("end_position") else None
        rsm = self.rsm(context)
        self._hint_next_segment(rsm, metadata, None)
        fetched = rsm.fetch_log_segment(metadata, request.start_position, end)
        yield from self._chunks(fetched, "FetchLogSegment")

    @stream
    def FetchIndex(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        metadata = messages.segment_metadata(request.metadata)
        fetched = self.rsm(context).fetch_index(metadata, messages.index_type(request.index_type))
        yield from self._chunks(fetched, "FetchIndex")

    @stream
    def FetchIndexes(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """Each requested index of one segment in turn, from the rsm's index cache (the first miss loads the
        segment's whole read group in one GET); an index the segment does not have is one `absent` message."""
        metadata = messages.segment_metadata(request.metadata)
        rsm = self.rsm(context)
        for value in request.index_types:
            try:
                fetched = rsm.fetch_index(metadata, messages.index_type(value))
            except IndexAbsentError:
                yield pb.IndexChunk(index_type=value, absent=True)
                continue
            with contextlib.closing(fetched):
                data = fetched.read()
            self.metrics.streamed.labels("FetchIndexes").inc(len(data))
            view = memoryview(data)
            for at in range(0, max(len(data), 1), CHUNK_BYTES):
                yield pb.IndexChunk(index_type=value, data=bytes(view[at : at + CHUNK_BYTES]))

    @unary
    def DeleteLogSegmentData(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.rsm(context).delete_log_segment_data(messages.segment_metadata(request))
        return EMPTY

    @unary
    def FetchLogSegmentFiles(self, request: Any, context: grpc.ServicerContext) -> Any:
        """The range as checked, pinned files of the rsm's disk chunk cache, for the adapter to read itself."""
        metadata = messages.segment_metadata(request.metadata)
        end = request.end_position if request.HasField("end_position") else None
        rsm = self.rsm(context)
        named = messages.segment_metadata(request.next_segment) if request.HasField("next_segment") else None
        self._hint_next_segment(rsm, metadata, named)
        files = rsm.fetch_log_segment_files(metadata, request.start_position, end, request.max_bytes or None)
        if files is None:
            return pb.SegmentFiles(stream_instead=FILES_UNAVAILABLE)
        ranges = [
            pb.SegmentFileRange(path=str(r.path), offset=r.offset, length=r.length, check=None if r.check is None
                                else pb.ChunkCheck(chunk=r.check.chunk, offset=r.check.offset,
                                                   length=r.check.length, crc32c=r.check.crc32c))
            for r in files.ranges
        ]
        self.metrics.streamed.labels("FetchLogSegmentFiles").inc(sum(r.length for r in files.ranges))
        deadline = files.lease_deadline
        lease_ms = 0 if deadline is None else max(int((deadline - time.monotonic()) * 1000), 0)
        return pb.SegmentFiles(
            ranges=ranges, end_position=files.end_position, lease_id=files.lease_id, lease_ms=lease_ms
        )

    @unary
    def ReleaseSegmentFiles(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.rsm(context).release_segment_files(request.lease_id)
        return EMPTY

    def _hint_next_segment(self, rsm: Any, metadata: Any, named: Any | None) -> None:
        """Tell the rsm the segment after `metadata` (the one the request named, else the rlmm's), so a reader
        nearing its end finds the next segment's first chunks prefetched."""
        following = named if named is not None else self._next_segment(metadata)
        if following is not None:
            rsm.hint_next_segment(metadata, following)

    def _next_segment(self, metadata: Any) -> Any | None:
        """The partition's next segment from this agent's rlmm, if it hosts one: the segment holding the offset
        after this one's end in this one's last leader epoch (a next segment of a newer epoch is not found)."""
        try:
            manager = self.components.slot(RLMM).get_nowait()
            if manager is None:
                return None
            epoch = max(metadata.segment_leader_epochs)
            tp = metadata.remote_log_segment_id.topic_id_partition
            return manager.remote_log_segment_metadata(tp, epoch, metadata.end_offset + 1)
        except (RemoteStorageError, ValueError):  # not configured, not ready: the hint is optional
            return None

    def _chunks(self, fetched: Any, method: str) -> Iterator[Any]:
        """Yield a fetched stream in chunks; gRPC pulls the next one only when the broker has room for it."""
        with contextlib.closing(fetched):
            while True:
                data = fetched.read(CHUNK_BYTES)
                if not data:
                    return
                self.metrics.streamed.labels(method).inc(len(data))
                yield pb.Chunk(data=data)


def build_services(components: Components, metrics: AgentMetrics) -> list[tuple[Servicer, Callable[..., None]]]:
    """The three servicers with their registration functions."""
    return [
        (AgentServicer(components, metrics), pb_grpc.add_AgentServicer_to_server),
        (RemoteLogMetadataServicer(components, metrics), pb_grpc.add_RemoteLogMetadataServicer_to_server),
        (RemoteStorageServicer(components, metrics), pb_grpc.add_RemoteStorageServicer_to_server),
    ]
