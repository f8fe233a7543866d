import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.metadata.storage.RemoteLogMetadataTopicPartitioner;
import org.apache.kafka.server.log.remote.metadata.storage.RemoteLogSegmentMetadataSnapshot;
import org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteState;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Map;
import java.util.Optional;
import java.util.TreeMap;
import java.util.UUID;

/**
 * Test probe for tests/migrate: Kafka's own RemoteLogMetadataSerde and RemoteLogMetadataTopicPartitioner, from the
 * Kafka jars (java -cp '.dev/kafka-libs/*' KafkaSerdeProbe.java). One request per stdin line, one answer per stdout
 * line: the serialized value in hex (after checking that Kafka reads it back as an equal object), or the partition.
 *
 * <pre>
 * S topicId topic partition segmentId start end maxTs broker eventTs size epochs custom state txnIdxEmpty
 * U topicId topic partition segmentId eventTs custom state broker
 * D topicId topic partition state eventTs broker
 * N segmentId start end maxTs broker eventTs size epochs custom state txnIdxEmpty
 * P topicId partition metadataPartitions
 * </pre>
 * Ids are hex UUIDs; epochs "epoch:offset,..."; custom "-" (none) or hex; states and txnIdxEmpty are numbers.
 */
public final class KafkaSerdeProbe {
    private KafkaSerdeProbe() {
    }

    public static void main(String[] args) throws Exception {
        RemoteLogMetadataSerde serde = new RemoteLogMetadataSerde();
        HexFormat hex = HexFormat.of();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.split(" ");
            if (f[0].equals("P")) {
                TopicIdPartition tp = new TopicIdPartition(uuid(f[1]), Integer.parseInt(f[2]), "t");
                System.out.println(new RemoteLogMetadataTopicPartitioner(Integer.parseInt(f[3])).metadataPartition(tp));
                continue;
            }
            RemoteLogMetadata metadata = switch (f[0]) {
                case "S" -> new RemoteLogSegmentMetadata(
                    new RemoteLogSegmentId(tp(f), uuid(f[4])), Long.parseLong(f[5]), Long.parseLong(f[6]),
                    Long.parseLong(f[7]), Integer.parseInt(f[8]), Long.parseLong(f[9]), Integer.parseInt(f[10]),
                    custom(f[12]), RemoteLogSegmentState.forId(Byte.parseByte(f[13])), epochs(f[11]),
                    f[14].equals("1"));
                case "U" -> new RemoteLogSegmentMetadataUpdate(
                    new RemoteLogSegmentId(tp(f), uuid(f[4])), Long.parseLong(f[5]), custom(f[6]),
                    RemoteLogSegmentState.forId(Byte.parseByte(f[7])), Integer.parseInt(f[8]));
                case "D" -> new RemotePartitionDeleteMetadata(
                    tp(f), RemotePartitionDeleteState.forId(Byte.parseByte(f[4])), Long.parseLong(f[5]),
                    Integer.parseInt(f[6]));
                case "N" -> new RemoteLogSegmentMetadataSnapshot(
                    uuid(f[1]), Long.parseLong(f[2]), Long.parseLong(f[3]), Long.parseLong(f[4]),
                    Integer.parseInt(f[5]), Long.parseLong(f[6]), Integer.parseInt(f[7]), custom(f[9]),
                    RemoteLogSegmentState.forId(Byte.parseByte(f[10])), epochs(f[8]), f[11].equals("1"));
                default -> throw new IllegalArgumentException("unknown request " + line);
            };
            byte[] value = serde.serialize(metadata);
            RemoteLogMetadata back = serde.deserialize(value);
            if (!back.equals(metadata)) {
                throw new IllegalStateException("Kafka reads back " + back + " for " + metadata);
            }
            System.out.println(hex.formatHex(value));
        }
    }

    private static TopicIdPartition tp(String[] f) {
        return new TopicIdPartition(uuid(f[1]), Integer.parseInt(f[3]), f[2]);
    }

    private static Uuid uuid(String text) {
        UUID u = UUID.fromString(text);
        return new Uuid(u.getMostSignificantBits(), u.getLeastSignificantBits());
    }

    private static Optional<CustomMetadata> custom(String text) {
        return text.equals("-") ? Optional.empty() : Optional.of(new CustomMetadata(HexFormat.of().parseHex(text)));
    }

    private static Map<Integer, Long> epochs(String text) {
        Map<Integer, Long> epochs = new TreeMap<>();
        for (String entry : text.split(",")) {
            String[] pair = entry.split(":");
            epochs.put(Integer.parseInt(pair[0]), Long.parseLong(pair[1]));
        }
        return epochs;
    }
}
