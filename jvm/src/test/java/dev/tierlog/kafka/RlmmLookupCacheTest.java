/*
 * The RLMM's remoteLogSegmentMetadata against a fake agent in this JVM that counts its lookups: later lookups the
 * agent's answer holds for are answered by the adapter, every write through the adapter for the partition (segment
 * add and update, partition delete, leadership change, stop) makes the next lookup ask again, and with
 * agent.rlmm.lookup.cache.ms=0 every lookup asks.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Path;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;

import io.grpc.stub.StreamObserver;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteState;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import dev.tierlog.kafka.proto.Empty;
import dev.tierlog.kafka.proto.EpochQuery;
import dev.tierlog.kafka.proto.LeadershipChanges;
import dev.tierlog.kafka.proto.OptionalOffset;
import dev.tierlog.kafka.proto.OptionalSegment;
import dev.tierlog.kafka.proto.Partitions;
import dev.tierlog.kafka.proto.RemoteLogMetadataGrpc;
import dev.tierlog.kafka.proto.RemoteStorageGrpc;
import dev.tierlog.kafka.proto.SegmentQuery;

@Timeout(60)
class RlmmLookupCacheTest {
    private static final TopicIdPartition TP = new TopicIdPartition(Uuid.randomUuid(), 0, "lookups");
    // Offsets 0..999 in epoch 0 (0..499) and epoch 1 (500..999).
    private static final RemoteLogSegmentMetadata SEGMENT =
        SegmentLookupCacheTest.segment(TP, 0, 999, Map.of(0, 0L, 1, 500L));

    /** The agent's metadata service: every lookup answers SEGMENT, every write is accepted. */
    private static final class Metadata extends RemoteLogMetadataGrpc.RemoteLogMetadataImplBase {
        final AtomicInteger lookups = new AtomicInteger();

        private static <T> void answer(StreamObserver<T> observer, T value) {
            observer.onNext(value);
            observer.onCompleted();
        }

        @Override
        public void getRemoteLogSegmentMetadata(SegmentQuery request, StreamObserver<OptionalSegment> observer) {
            lookups.incrementAndGet();
            answer(observer, OptionalSegment.newBuilder().setSegment(ProtoMapping.toProto(SEGMENT)).build());
        }

        @Override
        public void highestOffsetForEpoch(EpochQuery request, StreamObserver<OptionalOffset> observer) {
            answer(observer, OptionalOffset.getDefaultInstance());
        }

        @Override
        public void addRemoteLogSegmentMetadata(dev.tierlog.kafka.proto.RemoteLogSegmentMetadata request,
                StreamObserver<Empty> observer) {
            answer(observer, Empty.getDefaultInstance());
        }

        @Override
        public void updateRemoteLogSegmentMetadata(dev.tierlog.kafka.proto.RemoteLogSegmentMetadataUpdate request,
                StreamObserver<Empty> observer) {
            answer(observer, Empty.getDefaultInstance());
        }

        @Override
        public void putRemotePartitionDeleteMetadata(dev.tierlog.kafka.proto.RemotePartitionDeleteMetadata request,
                StreamObserver<Empty> observer) {
            answer(observer, Empty.getDefaultInstance());
        }

        @Override
        public void onPartitionLeadershipChanges(LeadershipChanges request, StreamObserver<Empty> observer) {
            answer(observer, Empty.getDefaultInstance());
        }

        @Override
        public void onStopPartitions(Partitions request, StreamObserver<Empty> observer) {
            answer(observer, Empty.getDefaultInstance());
        }
    }

    @TempDir
    Path dir;
    private Metadata metadata;
    private FakeAgent.Running agent;
    private TierlogRemoteLogMetadataManager rlmm;

    @BeforeEach
    void start() throws Exception {
        metadata = new Metadata();
        agent = FakeAgent.serve(dir.resolve("a.sock"), metadata, new RemoteStorageGrpc.RemoteStorageImplBase() { });
    }

    @AfterEach
    void stop() throws Exception {
        if (rlmm != null) {
            rlmm.close();
        }
        agent.close();
    }

    private void configure(long cacheMs) {
        rlmm = new TierlogRemoteLogMetadataManager();
        rlmm.configure(Map.of("agent.socket.path", dir.resolve("a.sock").toString(), "agent.start", "false",
            "agent.rlmm.lookup.cache.ms", String.valueOf(cacheMs)));
    }

    /** Looks up (epoch, offset), checks the answer, and returns how many lookups the agent has had. */
    private int lookup(int epoch, long offset) throws Exception {
        assertEquals(Optional.of(SEGMENT), rlmm.remoteLogSegmentMetadata(TP, epoch, offset));
        return metadata.lookups.get();
    }

    @Test
    void lookupsTheAnswerHoldsForAreAnsweredByTheAdapter() throws Exception {
        configure(60_000);
        assertEquals(1, lookup(0, 10));
        assertEquals(1, lookup(0, 499));
        assertEquals(2, lookup(1, 500), "epoch 1 is another range");
        assertEquals(2, lookup(1, 999));
    }

    @Test
    void everyWriteForThePartitionMakesTheNextLookupAsk() throws Exception {
        configure(60_000);
        int asked = lookup(0, 10);
        rlmm.addRemoteLogSegmentMetadata(new RemoteLogSegmentMetadata(new RemoteLogSegmentId(TP, Uuid.randomUuid()),
            1000, 1999, 0L, 0, 0L, 1024, Optional.empty(), RemoteLogSegmentState.COPY_SEGMENT_STARTED,
            Map.of(1, 1000L), false)).get();
        assertEquals(++asked, lookup(0, 10));
        rlmm.updateRemoteLogSegmentMetadata(new RemoteLogSegmentMetadataUpdate(SEGMENT.remoteLogSegmentId(), 0L,
            Optional.empty(), RemoteLogSegmentState.DELETE_SEGMENT_STARTED, 0)).get();
        assertEquals(++asked, lookup(0, 10));
        rlmm.putRemotePartitionDeleteMetadata(new RemotePartitionDeleteMetadata(TP,
            RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 0L, 0)).get();
        assertEquals(++asked, lookup(0, 10));
        rlmm.onPartitionLeadershipChanges(Set.of(), Set.of(TP));
        assertEquals(++asked, lookup(0, 10));
        rlmm.onStopPartitions(Set.of(TP));
        assertEquals(++asked, lookup(0, 10));
        assertEquals(asked, lookup(0, 20), "kept again after the write");
    }

    @Test
    void aBoundOfZeroAsksEveryTime() throws Exception {
        configure(0);
        assertEquals(1, lookup(0, 10));
        assertEquals(2, lookup(0, 10));
    }
}
