/*
 * fetchIndex through FetchIndexes against a fake agent in this JVM: the broker's OFFSET, TIMESTAMP and TRANSACTION
 * calls for a segment cost one call to the agent, an absent index is Kafka's not-found without a call, each kept
 * index is served once, a deleted segment's kept indexes are dropped, and an agent without FetchIndexes is asked
 * with FetchIndex per index. The bound of what is kept, in bytes and entries.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicInteger;

import com.google.protobuf.ByteString;

import io.grpc.stub.StreamObserver;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import dev.tierlog.kafka.proto.Chunk;
import dev.tierlog.kafka.proto.Empty;
import dev.tierlog.kafka.proto.FetchIndexRequest;
import dev.tierlog.kafka.proto.FetchIndexesRequest;
import dev.tierlog.kafka.proto.IndexChunk;
import dev.tierlog.kafka.proto.RemoteStorageGrpc;

@Timeout(60)
class FetchedIndexesTest {
    private static final TopicIdPartition TP = new TopicIdPartition(Uuid.randomUuid(), 0, "indexes");

    @TempDir
    Path dir;
    private Indexes storage;
    private FakeAgent.Running agent;
    private TierlogRemoteStorageManager rsm;

    /** Every index of a segment is its type's name repeated, in pieces of 3 bytes; no segment has TRANSACTION. */
    private static final class Indexes extends RemoteStorageGrpc.RemoteStorageImplBase {
        final AtomicInteger groupCalls = new AtomicInteger();
        final AtomicInteger singleCalls = new AtomicInteger();
        volatile boolean unimplemented;

        @Override
        public void fetchIndexes(FetchIndexesRequest request, StreamObserver<IndexChunk> observer) {
            groupCalls.incrementAndGet();
            if (unimplemented) {
                super.fetchIndexes(request, observer);
                return;
            }
            for (dev.tierlog.kafka.proto.IndexType type : request.getIndexTypesList()) {
                if (type == dev.tierlog.kafka.proto.IndexType.TRANSACTION) {
                    observer.onNext(IndexChunk.newBuilder().setIndexType(type).setAbsent(true).build());
                    continue;
                }
                byte[] data = content(type.name());
                for (int at = 0; at < data.length; at += 3) {
                    observer.onNext(IndexChunk.newBuilder().setIndexType(type)
                        .setData(ByteString.copyFrom(data, at, Math.min(3, data.length - at))).build());
                }
            }
            observer.onCompleted();
        }

        @Override
        public void fetchIndex(FetchIndexRequest request, StreamObserver<Chunk> observer) {
            singleCalls.incrementAndGet();
            observer.onNext(Chunk.newBuilder().setData(ByteString.copyFrom(content(request.getIndexType().name())))
                .build());
            observer.onCompleted();
        }

        @Override
        public void deleteLogSegmentData(dev.tierlog.kafka.proto.RemoteLogSegmentMetadata request,
                StreamObserver<Empty> observer) {
            observer.onNext(Empty.getDefaultInstance());
            observer.onCompleted();
        }
    }

    private static byte[] content(String type) {
        return type.repeat(5).getBytes(StandardCharsets.US_ASCII);
    }

    private static RemoteLogSegmentMetadata segment() {
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(TP, Uuid.randomUuid()), 0L, 99L,
            1_700_000_000_000L, 0, 1_700_000_000_000L, 1000, Optional.empty(),
            RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(0, 0L), false);
    }

    @BeforeEach
    void start() throws Exception {
        storage = new Indexes();
        agent = FakeAgent.serve(dir.resolve("a.sock"), storage);
        rsm = new TierlogRemoteStorageManager();
        rsm.configure(Map.of("agent.socket.path", dir.resolve("a.sock").toString(), "agent.start", "false"));
    }

    @AfterEach
    void stop() throws Exception {
        rsm.close();
        agent.close();
    }

    private byte[] index(RemoteLogSegmentMetadata segment, IndexType type) throws Exception {
        try (InputStream in = rsm.fetchIndex(segment, type)) {
            return in.readAllBytes();
        }
    }

    @Test
    void theBrokersThreeIndexCallsOfASegmentCostOneCall() throws Exception {
        RemoteLogSegmentMetadata segment = segment();
        assertArrayEquals(content("OFFSET"), index(segment, IndexType.OFFSET));
        assertArrayEquals(content("TIMESTAMP"), index(segment, IndexType.TIMESTAMP));
        assertThrows(RemoteResourceNotFoundException.class, () -> index(segment, IndexType.TRANSACTION));
        assertEquals(1, storage.groupCalls.get());
        // Served once: the broker keeps what it was given, so asking again asks the agent again.
        assertArrayEquals(content("OFFSET"), index(segment, IndexType.OFFSET));
        assertEquals(2, storage.groupCalls.get());
        // A follower's pair is the other group.
        assertArrayEquals(content("LEADER_EPOCH"), index(segment, IndexType.LEADER_EPOCH));
        assertArrayEquals(content("PRODUCER_SNAPSHOT"), index(segment, IndexType.PRODUCER_SNAPSHOT));
        assertEquals(3, storage.groupCalls.get());
        assertEquals(0, storage.singleCalls.get());
    }

    @Test
    void aDeletedSegmentsKeptIndexesAreDropped() throws Exception {
        RemoteLogSegmentMetadata segment = segment();
        index(segment, IndexType.OFFSET);
        rsm.deleteLogSegmentData(segment);
        assertArrayEquals(content("TIMESTAMP"), index(segment, IndexType.TIMESTAMP));
        assertEquals(2, storage.groupCalls.get());
    }

    @Test
    void anAgentWithoutFetchIndexesIsAskedPerIndexAndNotAgain() throws Exception {
        storage.unimplemented = true;
        RemoteLogSegmentMetadata segment = segment();
        assertArrayEquals(content("OFFSET"), index(segment, IndexType.OFFSET));
        assertArrayEquals(content("TIMESTAMP"), index(segment, IndexType.TIMESTAMP));
        assertEquals(1, storage.groupCalls.get());
        assertEquals(2, storage.singleCalls.get());
    }

    @Test
    void keptIndexesStayWithinTheirBounds() {
        FetchedIndexes kept = new FetchedIndexes(100, 3);
        Uuid a = Uuid.randomUuid();
        Uuid b = Uuid.randomUuid();
        kept.keep(a, group(40, 30), IndexType.OFFSET);
        assertEquals(30, kept.bytes());
        kept.keep(b, group(60, 50), IndexType.OFFSET); // 30 + 50 bytes, 4 entries: a's oldest let go
        assertEquals(3, kept.size());
        assertNull(kept.take(a, IndexType.TIMESTAMP));
        assertEquals(50, kept.bytes());
        kept.keep(a, group(10, 200), IndexType.OFFSET); // bigger than the bound: not kept
        assertNull(kept.take(a, IndexType.TIMESTAMP));
        assertEquals(50, kept.take(b, IndexType.TIMESTAMP).data().length);
        assertEquals(true, kept.take(b, IndexType.TRANSACTION).absent());
        assertEquals(0, kept.bytes());
        assertEquals(List.of(IndexType.TIMESTAMP, IndexType.OFFSET, IndexType.TRANSACTION),
            FetchedIndexes.groupOf(IndexType.TIMESTAMP));
    }

    private static Map<IndexType, FetchedIndexes.Index> group(int offset, int timestamp) {
        Map<IndexType, FetchedIndexes.Index> group = new EnumMap<>(IndexType.class);
        group.put(IndexType.OFFSET, new FetchedIndexes.Index(new byte[offset]));
        group.put(IndexType.TIMESTAMP, new FetchedIndexes.Index(new byte[timestamp]));
        group.put(IndexType.TRANSACTION, new FetchedIndexes.Index(null));
        return group;
    }
}
