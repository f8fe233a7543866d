/*
 * Conversions between Kafka's remote-storage value types and the agent protocol's messages.
 * One place owns the mapping, so both plugin classes send and read exactly the same shapes.
 */
package dev.tierlog.kafka;

import java.nio.ByteBuffer;
import java.util.Collection;
import java.util.Map;
import java.util.Optional;
import java.util.TreeMap;

import com.google.protobuf.ByteString;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;

import dev.tierlog.kafka.proto.Partitions;

final class ProtoMapping {
    private ProtoMapping() {
    }

    static ByteString uuid(Uuid id) {
        return ByteString.copyFrom(ByteBuffer.allocate(16)
            .putLong(id.getMostSignificantBits()).putLong(id.getLeastSignificantBits()).array());
    }

    static Uuid uuid(ByteString bytes) {
        if (bytes.size() != 16) {
            throw new IllegalArgumentException("a Uuid must be 16 bytes, the agent sent " + bytes.size());
        }
        ByteBuffer buf = bytes.asReadOnlyByteBuffer();
        return new Uuid(buf.getLong(), buf.getLong());
    }

    static dev.tierlog.kafka.proto.TopicIdPartition toProto(TopicIdPartition tp) {
        return dev.tierlog.kafka.proto.TopicIdPartition.newBuilder()
            .setTopicId(uuid(tp.topicId())).setTopic(tp.topic()).setPartition(tp.partition()).build();
    }

    static TopicIdPartition fromProto(dev.tierlog.kafka.proto.TopicIdPartition tp) {
        return new TopicIdPartition(uuid(tp.getTopicId()), tp.getPartition(), tp.getTopic());
    }

    static Partitions toProto(Collection<TopicIdPartition> tps) {
        Partitions.Builder b = Partitions.newBuilder();
        tps.forEach(tp -> b.addPartitions(toProto(tp)));
        return b.build();
    }

    static dev.tierlog.kafka.proto.RemoteLogSegmentId toProto(RemoteLogSegmentId id) {
        return dev.tierlog.kafka.proto.RemoteLogSegmentId.newBuilder()
            .setTopicIdPartition(toProto(id.topicIdPartition())).setId(uuid(id.id())).build();
    }

    static RemoteLogSegmentId fromProto(dev.tierlog.kafka.proto.RemoteLogSegmentId id) {
        return new RemoteLogSegmentId(fromProto(id.getTopicIdPartition()), uuid(id.getId()));
    }

    static dev.tierlog.kafka.proto.RemoteLogSegmentState toProto(RemoteLogSegmentState s) {
        return dev.tierlog.kafka.proto.RemoteLogSegmentState.forNumber(s.id());
    }

    static RemoteLogSegmentState fromProto(dev.tierlog.kafka.proto.RemoteLogSegmentState s) {
        return RemoteLogSegmentState.forId((byte) s.getNumber());
    }

    static dev.tierlog.kafka.proto.RemoteLogSegmentMetadata toProto(RemoteLogSegmentMetadata m) {
        dev.tierlog.kafka.proto.RemoteLogSegmentMetadata.Builder b =
            dev.tierlog.kafka.proto.RemoteLogSegmentMetadata.newBuilder()
                .setRemoteLogSegmentId(toProto(m.remoteLogSegmentId()))
                .setStartOffset(m.startOffset())
                .setEndOffset(m.endOffset())
                .setMaxTimestampMs(m.maxTimestampMs())
                .setBrokerId(m.brokerId())
                .setEventTimestampMs(m.eventTimestampMs())
                .setSegmentSizeInBytes(m.segmentSizeInBytes())
                .putAllSegmentLeaderEpochs(m.segmentLeaderEpochs())
                .setState(toProto(m.state()))
                .setTxnIdxEmpty(m.isTxnIdxEmpty());
        m.customMetadata().ifPresent(c -> b.setCustomMetadata(ByteString.copyFrom(c.value())));
        return b.build();
    }

    static RemoteLogSegmentMetadata fromProto(dev.tierlog.kafka.proto.RemoteLogSegmentMetadata m) {
        Map<Integer, Long> epochs = new TreeMap<>(m.getSegmentLeaderEpochsMap());
        Optional<CustomMetadata> custom = m.hasCustomMetadata()
            ? Optional.of(new CustomMetadata(m.getCustomMetadata().toByteArray())) : Optional.empty();
        return new RemoteLogSegmentMetadata(fromProto(m.getRemoteLogSegmentId()), m.getStartOffset(),
            m.getEndOffset(), m.getMaxTimestampMs(), m.getBrokerId(), m.getEventTimestampMs(),
            m.getSegmentSizeInBytes(), custom, fromProto(m.getState()), epochs, m.getTxnIdxEmpty());
    }

    static dev.tierlog.kafka.proto.RemoteLogSegmentMetadataUpdate toProto(RemoteLogSegmentMetadataUpdate u) {
        dev.tierlog.kafka.proto.RemoteLogSegmentMetadataUpdate.Builder b =
            dev.tierlog.kafka.proto.RemoteLogSegmentMetadataUpdate.newBuilder()
                .setRemoteLogSegmentId(toProto(u.remoteLogSegmentId()))
                .setEventTimestampMs(u.eventTimestampMs())
                .setState(toProto(u.state()))
                .setBrokerId(u.brokerId());
        u.customMetadata().ifPresent(c -> b.setCustomMetadata(ByteString.copyFrom(c.value())));
        return b.build();
    }

    static dev.tierlog.kafka.proto.RemotePartitionDeleteMetadata toProto(RemotePartitionDeleteMetadata d) {
        return dev.tierlog.kafka.proto.RemotePartitionDeleteMetadata.newBuilder()
            .setTopicIdPartition(toProto(d.topicIdPartition()))
            .setState(dev.tierlog.kafka.proto.RemotePartitionDeleteState.forNumber(d.state().id()))
            .setEventTimestampMs(d.eventTimestampMs())
            .setBrokerId(d.brokerId())
            .build();
    }

    static dev.tierlog.kafka.proto.IndexType toProto(IndexType t) {
        switch (t) {
            case OFFSET:
                return dev.tierlog.kafka.proto.IndexType.OFFSET;
            case TIMESTAMP:
                return dev.tierlog.kafka.proto.IndexType.TIMESTAMP;
            case PRODUCER_SNAPSHOT:
                return dev.tierlog.kafka.proto.IndexType.PRODUCER_SNAPSHOT;
            case TRANSACTION:
                return dev.tierlog.kafka.proto.IndexType.TRANSACTION;
            case LEADER_EPOCH:
                return dev.tierlog.kafka.proto.IndexType.LEADER_EPOCH;
            default:
                throw new IllegalArgumentException("index type " + t + " has no protocol mapping");
        }
    }
}
