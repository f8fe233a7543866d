/*
 * Kafka's RemoteStorageManager, served by the tierlog agent's packed-index object store.
 * Copies pass file paths (the agent runs on the broker's host); fetched segment bytes are read from the files of
 * the agent's chunk cache or the store's own files (FetchLogSegmentFiles, rsm/README.md "Segment bytes as files"),
 * or streamed back with flow control when the agent has no files to offer; a segment's indexes come in one call
 * per group the broker asks for one by one (FetchIndexes, FetchedIndexes).
 */
package dev.tierlog.kafka;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.EnumMap;
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
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
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
import dev.tierlog.kafka.proto.FetchIndexesRequest;
import dev.tierlog.kafka.proto.FetchSegmentFilesRequest;
import dev.tierlog.kafka.proto.FetchSegmentRequest;
import dev.tierlog.kafka.proto.IndexChunk;
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
    // Indexes fetched with the one the broker asked for, kept until it asks for them (a few segments' worth).
    static final long FETCHED_INDEX_BYTES = 32L << 20;
    static final int FETCHED_INDEX_ENTRIES = 1024;

    private volatile AgentClient agent;
    // FetchLogSegmentFiles, which an older agent lacks: then only streams.
    private final OptionalCall files = new OptionalCall("serve segment files", "fetched segments are streamed");
    // FetchIndexes, which an older agent lacks: then one FetchIndex call per index.
    private final OptionalCall indexes = new OptionalCall("serve FetchIndexes", "each index is fetched on its own");
    private final FetchedIndexes fetchedIndexes = new FetchedIndexes(FETCHED_INDEX_BYTES, FETCHED_INDEX_ENTRIES);
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
        if (!agent().settings().fetchFiles || !files.available()) {
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

    /**
     * One FetchLogSegmentFiles answer: its files, opened (and their chunks checked where the answer says to), or
     * why the range must be streamed instead, or a file that could not be opened, or a chunk that failed its check
     * (in a file of the agent's chunk cache, {@code leased}, or of the store).
     */
    private record FilesAnswer(RecentWindows.Shared files, String streamInstead, IOException unopened,
            String damaged, boolean leased) {
        static FilesAnswer streamInstead(String why) {
            return new FilesAnswer(null, why, null, null, false);
        }
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
            if (answer.damaged() != null) {
                if (!answer.leased()) {
                    throw new RemoteStorageException(call + ": " + answer.damaged());
                }
                // A cache file the agent wrote and left for this check: the stream reads through the agent's own
                // check, which drops the damaged file and fetches the chunk again (or fails naming it).
                LOG.warn("{}: {}; streaming the range instead", call, answer.damaged());
                break;
            }
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

    /**
     * Asks for the files of a range, opens them all, then releases their lease (open files stay readable). Ranges of
     * the store's own files, and of cache files the agent wrote itself and did not read back, come with their chunk's
     * checksum: each such chunk is checked before the files are used.
     */
    private FilesAnswer openFiles(ManagedChannel ch, Deadline deadline, FetchSegmentFilesRequest request,
            String what, Uuid segment, long position) {
        SegmentFiles answer;
        long checked = System.nanoTime(); // the agent checks the files after this
        try {
            answer = RemoteStorageGrpc.newBlockingStub(ch).withDeadline(deadline).fetchLogSegmentFiles(request);
        } catch (StatusRuntimeException e) {
            files.failed(e, agent().settings().socketPath);
            return FilesAnswer.streamInstead("the agent does not implement FetchLogSegmentFiles");
        }
        if (!answer.getStreamInstead().isEmpty()) {
            return FilesAnswer.streamInstead(answer.getStreamInstead());
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
            String damaged = null;
            for (int i = 0; i < opened.size() && damaged == null; i++) {
                SegmentFileRange range = answer.getRanges(i);
                if (range.hasCheck()) {
                    damaged = ChunkChecks.damage(segment.toString(), range.getPath(), opened.get(i).channel(),
                        range.getCheck());
                }
            }
            if (damaged != null) {
                throw new DamagedChunk(damaged);
            }
            return new FilesAnswer(new RecentWindows.Shared(what, segment, position, answer.getEndPosition(), opened,
                checked), null, null, null, false);
        } catch (IOException | RuntimeException e) {
            for (SegmentFilesInputStream.OpenRange range : opened) {
                try {
                    range.channel().close();
                } catch (IOException closing) {
                    e.addSuppressed(closing);
                }
            }
            if (e instanceof IOException unopened) {
                return new FilesAnswer(null, null, unopened, null, false);
            }
            if (e instanceof DamagedChunk damaged) {
                return new FilesAnswer(null, null, null, damaged.getMessage(), !answer.getLeaseId().isEmpty());
            }
            throw (RuntimeException) e;
        } finally {
            if (!answer.getLeaseId().isEmpty()) {
                release(ch, answer.getLeaseId());
            }
        }
    }

    /** A chunk of an answer's file failed its check: its files are closed and none of their bytes served. */
    private static final class DamagedChunk extends RuntimeException {
        DamagedChunk(String message) {
            super(message, null, false, false);
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

    /**
     * An index of the segment: kept from an earlier FetchIndexes answer, else fetched with the rest of its group in
     * one call (the others kept for the broker's next calls); one FetchIndex stream with an older agent.
     */
    @Override
    public InputStream fetchIndex(RemoteLogSegmentMetadata metadata, IndexType indexType)
            throws RemoteStorageException {
        String what = "fetchIndex(" + metadata.remoteLogSegmentId() + ", " + indexType + ")";
        Uuid segment = metadata.remoteLogSegmentId().id();
        FetchedIndexes.Index index = fetchedIndexes.take(segment, indexType);
        if (index == null && indexes.available()) {
            Map<IndexType, FetchedIndexes.Index> fetched = fetchIndexes(what, metadata, indexType);
            if (fetched != null) {
                index = fetched.get(indexType);
                fetchedIndexes.keep(segment, fetched, indexType);
            }
        }
        if (index == null) {
            FetchIndexRequest request = FetchIndexRequest.newBuilder()
                .setMetadata(ProtoMapping.toProto(metadata)).setIndexType(ProtoMapping.toProto(indexType)).build();
            return stream(what, stub -> stub.fetchIndex(request));
        }
        if (index.absent()) {
            throw new RemoteResourceNotFoundException("segment " + metadata.remoteLogSegmentId() + " has no "
                + indexType + " index");
        }
        return new ByteArrayInputStream(index.data());
    }

    /** The indexes of {@code type}'s group in one FetchIndexes call; null if the agent does not implement it. */
    private Map<IndexType, FetchedIndexes.Index> fetchIndexes(String what, RemoteLogSegmentMetadata metadata,
            IndexType type) throws RemoteStorageException {
        FetchIndexesRequest.Builder request = FetchIndexesRequest.newBuilder()
            .setMetadata(ProtoMapping.toProto(metadata));
        Map<dev.tierlog.kafka.proto.IndexType, IndexType> group =
            new EnumMap<>(dev.tierlog.kafka.proto.IndexType.class);
        for (IndexType t : FetchedIndexes.groupOf(type)) {
            group.put(ProtoMapping.toProto(t), t);
            request.addIndexTypes(ProtoMapping.toProto(t));
        }
        return agent().call(what, agent().settings().lookupTimeoutMs, (ch, dl) -> {
            Map<IndexType, ByteArrayOutputStream> data = new EnumMap<>(IndexType.class);
            Map<IndexType, FetchedIndexes.Index> fetched = new EnumMap<>(IndexType.class);
            try {
                Iterator<IndexChunk> pieces = RemoteStorageGrpc.newBlockingStub(ch).withDeadline(dl)
                    .fetchIndexes(request.build());
                while (pieces.hasNext()) {
                    IndexChunk piece = pieces.next();
                    IndexType pieceType = group.get(piece.getIndexType());
                    if (pieceType == null) {
                        throw Status.INTERNAL.withDescription("FetchIndexes answered a " + piece.getIndexType()
                            + " index, not asked for").asRuntimeException();
                    }
                    if (piece.getAbsent()) {
                        fetched.put(pieceType, new FetchedIndexes.Index(null));
                    } else {
                        piece.getData().writeTo(data.computeIfAbsent(pieceType, t -> new ByteArrayOutputStream()));
                    }
                }
            } catch (StatusRuntimeException e) {
                indexes.failed(e, agent().settings().socketPath);
                return null;
            } catch (IOException e) {
                throw new IllegalStateException("a ByteArrayOutputStream failed", e); // it does not
            }
            data.forEach((t, bytes) -> fetched.put(t, new FetchedIndexes.Index(bytes.toByteArray())));
            if (!fetched.keySet().containsAll(group.values())) {
                throw Status.INTERNAL.withDescription("FetchIndexes answered " + fetched.keySet() + " for "
                    + group.values()).asRuntimeException();
            }
            return fetched;
        });
    }

    @Override
    public void deleteLogSegmentData(RemoteLogSegmentMetadata metadata) throws RemoteStorageException {
        fetchedIndexes.forget(metadata.remoteLogSegmentId().id());
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
