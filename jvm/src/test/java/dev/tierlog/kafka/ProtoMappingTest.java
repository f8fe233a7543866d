/*
 * The wire mapping keeps every field of Kafka's value types, and a Uuid travels as its 16 big-endian bytes
 * (most significant half first), which is what Python's uuid.UUID(bytes=...) reads on the agent's side.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.Map;
import java.util.Optional;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.junit.jupiter.api.Test;

class ProtoMappingTest {

    @Test
    void segmentMetadataSurvivesTheRoundTrip() {
        TopicIdPartition tp = new TopicIdPartition(Uuid.randomUuid(), 7, "orders");
        RemoteLogSegmentMetadata original = new RemoteLogSegmentMetadata(
            new RemoteLogSegmentId(tp, Uuid.randomUuid()), 100L, 250L, 1_700_000_000_000L, 3,
            1_700_000_000_500L, 4096, Optional.of(new CustomMetadata(new byte[] {1, 2, 3})),
            RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(4, 100L, 5, 180L), true);

        assertEquals(original, ProtoMapping.fromProto(ProtoMapping.toProto(original)));
    }

    @Test
    void uuidIsSentAsItsBigEndianBytes() {
        Uuid id = new Uuid(0x0102030405060708L, 0x090a0b0c0d0e0f10L);

        assertArrayEquals(new byte[] {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
            ProtoMapping.uuid(id).toByteArray());
    }
}
