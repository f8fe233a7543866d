/*
 * The RLMM's listRemoteLogSegments against a fake agent in this JVM: the listing comes in one
 * ListRemoteLogSegmentsAtOnce answer; an answer with stream_instead (a partition of more segments than one answer
 * holds) is listed through the ListRemoteLogSegments stream; an agent without ListRemoteLogSegmentsAtOnce (older)
 * is listed through the stream, and not asked for the listing at once again.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;

import io.grpc.stub.StreamObserver;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import dev.tierlog.kafka.proto.ListQuery;
import dev.tierlog.kafka.proto.RemoteLogMetadataGrpc;
import dev.tierlog.kafka.proto.RemoteStorageGrpc;
import dev.tierlog.kafka.proto.SegmentList;

@Timeout(60)
class ListAtOnceTest {
    private static final TopicIdPartition TP = new TopicIdPartition(Uuid.randomUuid(), 0, "listings");
    private static final List<RemoteLogSegmentMetadata> SEGMENTS = List.of(
        SegmentLookupCacheTest.segment(TP, 0, 99, Map.of(0, 0L)),
        SegmentLookupCacheTest.segment(TP, 100, 199, Map.of(0, 0L)));

    /** Streams SEGMENTS; counts both kinds of listing. */
    private static class Streaming extends RemoteLogMetadataGrpc.RemoteLogMetadataImplBase {
        final AtomicInteger streamed = new AtomicInteger();
        final AtomicInteger atOnce = new AtomicInteger();

        @Override
        public void listRemoteLogSegments(ListQuery request,
                StreamObserver<dev.tierlog.kafka.proto.RemoteLogSegmentMetadata> observer) {
            streamed.incrementAndGet();
            SEGMENTS.forEach(s -> observer.onNext(ProtoMapping.toProto(s)));
            observer.onCompleted();
        }
    }

    /** Also answers the listing at once: SEGMENTS, or stream_instead. */
    private static final class AtOnce extends Streaming {
        private final boolean streamInstead;

        AtOnce(boolean streamInstead) {
            this.streamInstead = streamInstead;
        }

        @Override
        public void listRemoteLogSegmentsAtOnce(ListQuery request, StreamObserver<SegmentList> observer) {
            atOnce.incrementAndGet();
            SegmentList.Builder answer = SegmentList.newBuilder().setStreamInstead(streamInstead);
            if (!streamInstead) {
                SEGMENTS.forEach(s -> answer.addSegments(ProtoMapping.toProto(s)));
            }
            observer.onNext(answer.build());
            observer.onCompleted();
        }
    }

    /** An older agent: asked for the listing at once, answers UNIMPLEMENTED (counted). */
    private static final class Older extends Streaming {
        @Override
        public void listRemoteLogSegmentsAtOnce(ListQuery request, StreamObserver<SegmentList> observer) {
            atOnce.incrementAndGet();
            super.listRemoteLogSegmentsAtOnce(request, observer);
        }
    }

    @TempDir
    Path dir;
    private FakeAgent.Running agent;
    private TierlogRemoteLogMetadataManager rlmm;

    private void serve(Streaming metadata) throws Exception {
        agent = FakeAgent.serve(dir.resolve("a.sock"), metadata, new RemoteStorageGrpc.RemoteStorageImplBase() { });
        rlmm = new TierlogRemoteLogMetadataManager();
        rlmm.configure(Map.of("agent.socket.path", dir.resolve("a.sock").toString(), "agent.start", "false"));
    }

    @AfterEach
    void stop() throws Exception {
        if (rlmm != null) {
            rlmm.close();
        }
        if (agent != null) {
            agent.close();
        }
    }

    private List<RemoteLogSegmentMetadata> listTwice() throws Exception {
        List<RemoteLogSegmentMetadata> listed = new ArrayList<>();
        rlmm.listRemoteLogSegments(TP).forEachRemaining(listed::add);
        assertEquals(SEGMENTS, listed);
        listed.clear();
        rlmm.listRemoteLogSegments(TP, 0).forEachRemaining(listed::add);
        return listed;
    }

    @Test
    void theListingComesInOneAnswer() throws Exception {
        AtOnce metadata = new AtOnce(false);
        serve(metadata);
        assertEquals(SEGMENTS, listTwice());
        assertEquals(2, metadata.atOnce.get());
        assertEquals(0, metadata.streamed.get());
    }

    @Test
    void anAnswerSayingStreamInsteadIsListedThroughTheStream() throws Exception {
        AtOnce metadata = new AtOnce(true);
        serve(metadata);
        assertEquals(SEGMENTS, listTwice());
        assertEquals(2, metadata.atOnce.get());
        assertEquals(2, metadata.streamed.get());
    }

    @Test
    void anOlderAgentIsListedThroughTheStreamOnly() throws Exception {
        Older metadata = new Older();
        serve(metadata);
        assertEquals(SEGMENTS, listTwice());
        assertEquals(1, metadata.atOnce.get());
        assertEquals(2, metadata.streamed.get());
    }
}
