/*
 * Kafka's RemoteStorageManager, served by the tierlog agent's packed-index object store.
 * Copies pass file paths (the agent runs on the broker's host); fetches stream bytes back with flow control.
 */
package dev.tierlog.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.util.Iterator;
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
import dev.tierlog.kafka.proto.FetchIndexRequest;
import dev.tierlog.kafka.proto.FetchSegmentRequest;
import dev.tierlog.kafka.proto.RemoteStorageGrpc;

/**
 * Configure it with {@code remote.log.storage.manager.class.name=dev.tierlog.kafka.TierlogRemoteStorageManager};
 * {@code rsm.config.agent.*} keys configure the adapter, every other {@code rsm.config.*} key goes to tierlog's rsm.
 */
public class TierlogRemoteStorageManager implements RemoteStorageManager {
    private static final Logger LOG = LoggerFactory.getLogger(TierlogRemoteStorageManager.class);

    private volatile AgentClient agent;

    @Override
    public void configure(Map<String, ?> configs) {
        AgentSettings settings = AgentSettings.parse(configs);
        agent = new AgentClient(settings, Component.REMOTE_STORAGE_MANAGER, (ch, dl) -> null);
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
        FetchSegmentRequest request = FetchSegmentRequest.newBuilder()
            .setMetadata(ProtoMapping.toProto(metadata)).setStartPosition(startPosition).build();
        return stream("fetchLogSegment(" + metadata.remoteLogSegmentId() + ", " + startPosition + ")",
            stub -> stub.fetchLogSegment(request));
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata metadata, int startPosition, int endPosition)
            throws RemoteStorageException {
        FetchSegmentRequest request = FetchSegmentRequest.newBuilder()
            .setMetadata(ProtoMapping.toProto(metadata)).setStartPosition(startPosition)
            .setEndPosition(endPosition).build();
        return stream("fetchLogSegment(" + metadata.remoteLogSegmentId() + ", " + startPosition + ", "
            + endPosition + ")", stub -> stub.fetchLogSegment(request));
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
        agent().call("deleteLogSegmentData(" + metadata.remoteLogSegmentId() + ")", agent().settings().callTimeoutMs,
            (ch, dl) -> RemoteStorageGrpc.newBlockingStub(ch).withDeadline(dl)
                .deleteLogSegmentData(ProtoMapping.toProto(metadata)));
    }

    @Override
    public void close() throws IOException {
        AgentClient a = agent;
        if (a != null) {
            a.close();
        }
    }
}
