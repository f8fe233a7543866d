/*
 * Kafka's RemoteStorageManager, served by the tierlog agent's packed-index object store.
 * Copies pass file paths (the agent runs on the broker's host); fetched segment bytes are read from the files of
 * the agent's chunk cache (FetchLogSegmentFiles, rsm/README.md "Segment bytes as files"), or streamed back with
 * flow control when the agent has no files to offer; indexes are streamed.
 */
package dev.tierlog.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Function;

import com.google.protobuf.ByteString;

import io.grpc.Context;
import io.grpc.Deadline;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;

import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import dev.tierlog.kafka.proto.Chunk;
import dev.tierlog.kafka.proto.Component;
import dev.tierlog.kafka.proto.CopyRequest;
import dev.tierlog.kafka.proto.CopyResponse;
import dev.tierlog.kafka.proto.Empty;
import dev.tierlog.kafka.proto.FetchIndexRequest;
import dev.tierlog.kafka.proto.FetchSegmentFilesRequest;
import dev.tierlog.kafka.proto.FetchSegmentRequest;
import dev.tierlog.kafka.proto.RemoteStorageGrpc;
import dev.tierlog.kafka.proto.SegmentFileRange;
import dev.tierlog.kafka.proto.SegmentFiles;
import dev.tierlog.kafka.proto.SegmentFilesLease;

/**
 * Configure it with {@code remote.log.storage.manager.class.name=dev.tierlog.kafka.TierlogRemoteStorageManager};
 * {@code rsm.config.agent.*} keys configure the adapter, every other {@code rsm.config.*} key goes to tierlog's rsm.
 */
public class TierlogRemoteStorageManager implements RemoteStorageManager {
    private static final Logger LOG = LoggerFactory.getLogger(TierlogRemoteStorageManager.class);
    // At most this many answers are kept open for reuse (each a few chunk files): fetches of this many segments at
    // once each find their last window.
    static final int RECENT_WINDOWS = 64;

    private volatile AgentClient agent;
    // Set once the agent answered FetchLogSegmentFiles UNIMPLEMENTED (an older agent): then only streams.
    private final AtomicBoolean filesUnimplemented = new AtomicBoolean();
    // Recent FetchLogSegmentFiles answers, read again by the next fetches of their segments (agent.fetch.files.reuse.ms).
    private volatile RecentWindows recent = new RecentWindows(0, 0, System::nanoTime);

    @Override
    public void configure(Map<String, ?> configs) {
        AgentSettings settings = AgentSettings.parse(configs);
        agent = new AgentClient(settings, Component.REMOTE_STORAGE_MANAGER, (ch, dl) -> null);
        recent = new RecentWindows(RECENT_WINDOWS, settings.fetchFilesReuseMs, System::nanoTime);
        try {
            agent.start();
        } catch (RemoteStorageException e) {
            throw new org.apache.kafka.common.KafkaException("tierlog RSM could not reach its agent: "
                + e.getMessage(), e);
        }
        LOG.info("tierlog RSM configured, agent at {}", settings.socketPath);
    }

    private AgentClient agent() {
        AgentClient a = agent;
        if (a == null) {
            throw new IllegalStateException("tierlog RSM used before configure()");
        }
        return a;
    }

    @Override
    public Optional<CustomMetadata> copyLogSegmentData(RemoteLogSegmentMetadata metadata, LogSegmentData data)
            throws RemoteStorageException {
        CopyRequest.Builder request = CopyRequest.newBuilder()
            .setMetadata(ProtoMapping.toProto(metadata))
            .setLogSegment(data.logSegment().toAbsolutePath().toString())
            .setOffsetIndex(data.offsetIndex().toAbsolutePath().toString())
            .setTimeIndex(data.timeIndex().toAbsolutePath().toString())
            .setProducerSnapshotIndex(data.producerSnapshotIndex().toAbsolutePath().toString())
            .setLeaderEpochIndex(ByteString.copyFrom(data.leaderEpochIndex().duplicate()));
        data.transactionIndex().ifPresent(p -> request.setTransactionIndex(p.toAbsolutePath().toString()));
        CopyResponse response = agent().call("copyLogSegmentData(" + metadata.remoteLogSegmentId() + ")",
            agent().settings().copyTimeoutMs, (ch, dl) ->
                RemoteStorageGrpc.newBlockingStub(ch).withDeadline(dl).copyLogSegmentData(request.build()));
        return response.hasCustomMetadata()
            ? Optional.of(new CustomMetadata(response.getCustomMetadata().toByteArray())) : Optional.empty();
    }

    /**
     * Starts a streaming call and waits for its first answer, so a missing segment or index is reported
     * here as Kafka expects (RemoteResourceNotFoundException), not on the first read. The broker's fetch
     * waits on that answer, so it has the lookup deadline; the whole stream has agent.fetch.timeout.ms.
     */
    private InputStream stream(String what, Function<RemoteStorageGrpc.RemoteStorageBlockingStub, Iterator<Chunk>> start)
            throws RemoteStorageException {
        AgentClient a = agent();
        long lookupMs = a.settings().lookupTimeoutMs;
        long streamMs = a.settings().fetchTimeoutMs;
        return a.call(what, lookupMs, (ManagedChannel ch, Deadline firstChunk) -> {
            Context.CancellableContext context = Context.current().withCancellation();
            // Whichever comes first, the first chunk (or the call's failure) or the timer, settles the race; a
            // timer that won cancels the call, and the call counts as one that missed its deadline.
            AtomicBoolean settled = new AtomicBoolean();
            ScheduledFuture<?> timer = a.timers().schedule(() -> {
                if (settled.compareAndSet(false, true)) {
                    context.cancel(null);
                }
            }, firstChunk.timeRemaining(TimeUnit.NANOSECONDS), TimeUnit.NANOSECONDS);
            Iterator<Chunk> chunks;
            Context previous = context.attach();
            try {
                chunks = start.apply(RemoteStorageGrpc.newBlockingStub(ch)
                    .withDeadline(Deadline.after(streamMs, TimeUnit.MILLISECONDS)));
                chunks.hasNext();
            } catch (StatusRuntimeException e) {
                boolean timedOut = !settled.compareAndSet(false, true);
                timer.cancel(false);
                context.cancel(e);
                throw timedOut ? firstChunkMissed(what, lookupMs, e) : e;
            } finally {
                context.detach(previous);
            }
            if (!settled.compareAndSet(false, true)) {
                throw firstChunkMissed(what, lookupMs, null); // it came as the timer cancelled the call
            }
            timer.cancel(false);
            return new ChunkInputStream(what, context, chunks);
        });
    }

    private static StatusRuntimeException firstChunkMissed(String what, long lookupMs, Throwable cause) {
        return Status.DEADLINE_EXCEEDED.withDescription(what + ": no first chunk within " + lookupMs + " ms")
            .withCause(cause).asRuntimeException();
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata metadata, int startPosition)
            throws RemoteStorageException {
        return fetchSegment(metadata, startPosition, null);
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata metadata, int startPosition, int endPosition)
            throws RemoteStorageException {
        return fetchSegment(metadata, startPosition, endPosition);
    }

    /**
     * The segment's bytes from {@code start} to {@code end} (inclusive; null: to the end): read from the agent's
     * chunk cache files a window at a time, the next window asked for when the reader gets there; streamed when
     * the file path is off or the agent cannot answer with files.
     */
    private InputStream fetchSegment(RemoteLogSegmentMetadata metadata, int start, Integer end)
            throws RemoteStorageException {
        String what = "fetchLogSegment(" + metadata.remoteLogSegmentId() + ", " + start
            + (end == null ? "" : ", " + end) + ")";
        if (!agent().settings().fetchFiles || filesUnimplemented.get()) {
            return streamSegment(what, metadata, start, end);
        }
        long last = metadata.segmentSizeInBytes() - 1L;
        if (end != null) {
            last = Math.min(last, end);
        }
        long lastPosition = last;
        return new SegmentFilesInputStream(what, window(what, metadata, start, end, lastPosition), last, position -> {
            try {
                return window(what, metadata, position, end, lastPosition);
            } catch (RemoteStorageException e) {
                throw new IOException(what + " failed at position " + position + ": " + e.getMessage(), e);
            }
        });
    }

    private InputStream streamSegment(String what, RemoteLogSegmentMetadata metadata, long start, Integer end)
            throws RemoteStorageException {
        FetchSegmentRequest.Builder request = FetchSegmentRequest.newBuilder()
            .setMetadata(ProtoMapping.toProto(metadata)).setStartPosition(Math.toIntExact(start));
        if (end != null) {
            request.setEndPosition(end);
        }
        return stream(what, stub -> stub.fetchLogSegment(request.build()));
    }

    /** One FetchLogSegmentFiles answer: its files, opened, or why the range must be streamed instead. */
    private record FilesAnswer(RecentWindows.Shared files, String streamInstead, IOException unopened) {
    }

    /**
     * The window from {@code position}: a recent answer's files that hold it, else the files of one
     * FetchLogSegmentFiles answer, opened and their lease released; a file that cannot be opened (its lease ran out)
     * gets the call once more. Otherwise, and when the agent says so, a stream of the rest of the range.
     */
    private SegmentFilesInputStream.Window window(String what, RemoteLogSegmentMetadata metadata, long position,
            Integer end, long last) throws RemoteStorageException {
        Uuid segment = metadata.remoteLogSegmentId().id();
        try {
            SegmentFilesInputStream.Files reused = recent.reuse(segment, position, last);
            if (reused != null) {
                return reused;
            }
        } catch (IOException e) {
            LOG.warn("{}: closing expired chunk cache files failed: {}", what, e.toString());
        }
        FetchSegmentFilesRequest.Builder request = FetchSegmentFilesRequest.newBuilder()
            .setMetadata(ProtoMapping.toProto(metadata)).setStartPosition(Math.toIntExact(position))
            .setMaxBytes(agent().settings().fetchFilesWindowBytes);
        if (end != null) {
            request.setEndPosition(end);
        }
        String call = what + " files from " + position;
        for (int attempt = 1; attempt <= 2; attempt++) {
            FilesAnswer answer = agent().call(call, agent().settings().lookupTimeoutMs,
                (ch, dl) -> openFiles(ch, dl, request.build(), what, segment, position));
            if (answer.files() != null) {
                try {
                    recent.keep(answer.files());
                } catch (IOException e) {
                    LOG.warn("{}: closing older chunk cache files failed: {}", what, e.toString());
                }
                return answer.files().files(position, last);
            }
            if (answer.streamInstead() != null) {
                LOG.debug("{}: streamed, the agent has no files ({})", call, answer.streamInstead());
                break;
            }
            if (attempt == 2) {
                LOG.warn("{}: a chunk cache file could not be opened twice ({}); streaming the range instead", call,
                    answer.unopened().toString());
            }
        }
        return new SegmentFilesInputStream.Streamed(streamSegment(what, metadata, position, end));
    }

    /** Asks for the files of a range, opens them all, then releases their lease (open files stay readable). */
    private FilesAnswer openFiles(ManagedChannel ch, Deadline deadline, FetchSegmentFilesRequest request,
            String what, Uuid segment, long position) {
        SegmentFiles answer;
        long checked = System.nanoTime(); // the agent checks the files after this
        try {
            answer = RemoteStorageGrpc.newBlockingStub(ch).withDeadline(deadline).fetchLogSegmentFiles(request);
        } catch (StatusRuntimeException e) {
            if (e.getStatus().getCode() != Status.Code.UNIMPLEMENTED) {
                throw e;
            }
            if (filesUnimplemented.compareAndSet(false, true)) {
                LOG.info("The tierlog agent at {} does not serve segment files (an older agent); fetched segments "
                    + "are streamed", agent().settings().socketPath);
            }
            return new FilesAnswer(null, "the agent does not implement FetchLogSegmentFiles", null);
        }
        if (!answer.getStreamInstead().isEmpty()) {
            return new FilesAnswer(null, answer.getStreamInstead(), null);
        }
        List<SegmentFilesInputStream.OpenRange> opened = new ArrayList<>();
        try {
            long covered = 0;
            for (SegmentFileRange range : answer.getRangesList()) {
                covered += range.getLength();
            }
            if (answer.getEndPosition() < position || covered != answer.getEndPosition() - position + 1) {
                throw Status.INTERNAL.withDescription("FetchLogSegmentFiles answered ranges of " + covered
                    + " bytes for positions " + position + ".." + answer.getEndPosition()).asRuntimeException();
            }
            for (SegmentFileRange range : answer.getRangesList()) {
                opened.add(new SegmentFilesInputStream.OpenRange(
                    FileChannel.open(Path.of(range.getPath()), StandardOpenOption.READ), range.getPath(),
                    range.getOffset(), range.getLength()));
            }
            return new FilesAnswer(new RecentWindows.Shared(what, segment, position, answer.getEndPosition(), opened,
                checked), null, null);
        } catch (IOException | RuntimeException e) {
            for (SegmentFilesInputStream.OpenRange range : opened) {
                try {
                    range.channel().close();
                } catch (IOException closing) {
                    e.addSuppressed(closing);
                }
            }
            if (e instanceof IOException unopened) {
                return new FilesAnswer(null, null, unopened);
            }
            throw (RuntimeException) e;
        } finally {
            release(ch, answer.getLeaseId());
        }
    }

    /** Unpins a lease's files without waiting: an unknown or expired lease is not an error, nor is a lost one. */
    private void release(ManagedChannel ch, String leaseId) {
        RemoteStorageGrpc.newStub(ch).withDeadlineAfter(agent().settings().callTimeoutMs, TimeUnit.MILLISECONDS)
            .releaseSegmentFiles(SegmentFilesLease.newBuilder().setLeaseId(leaseId).build(),
                new StreamObserver<Empty>() {
                    @Override
                    public void onNext(Empty value) {
                    }

                    @Override
                    public void onError(Throwable t) {
                        LOG.debug("Releasing segment files lease {} failed: {}", leaseId, Status.fromThrowable(t));
                    }

                    @Override
                    public void onCompleted() {
                    }
                });
    }

    @Override
    public InputStream fetchIndex(RemoteLogSegmentMetadata metadata, IndexType indexType)
            throws RemoteStorageException {
        FetchIndexRequest request = FetchIndexRequest.newBuilder()
            .setMetadata(ProtoMapping.toProto(metadata)).setIndexType(ProtoMapping.toProto(indexType)).build();
        return stream("fetchIndex(" + metadata.remoteLogSegmentId() + ", " + indexType + ")",
            stub -> stub.fetchIndex(request));
    }

    @Override
    public void deleteLogSegmentData(RemoteLogSegmentMetadata metadata) throws RemoteStorageException {
        try {
            recent.forget(metadata.remoteLogSegmentId().id());
        } catch (IOException e) {
            LOG.warn("deleteLogSegmentData({}): closing its chunk cache files failed: {}",
                metadata.remoteLogSegmentId(), e.toString());
        }
        agent().call("deleteLogSegmentData(" + metadata.remoteLogSegmentId() + ")", agent().settings().callTimeoutMs,
            (ch, dl) -> RemoteStorageGrpc.newBlockingStub(ch).withDeadline(dl)
                .deleteLogSegmentData(ProtoMapping.toProto(metadata)));
    }

    @Override
    public void close() throws IOException {
        try {
            recent.close();
        } finally {
            AgentClient a = agent;
            if (a != null) {
                a.close();
            }
        }
    }
}
