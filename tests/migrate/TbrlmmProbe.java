import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.metadata.storage.ConsumerManager;
import org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager;
import org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManagerConfig;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteState;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

/**
 * Test probe for tests/migrate/test_tbrlmm_differential.py: Kafka's real TopicBasedRemoteLogMetadataManager (TBRLMM),
 * configured as a broker configures it, driven over stdin/stdout
 * ({@code java -cp '.dev/kafka-libs/*' TbrlmmProbe.java BOOTSTRAP METADATA_PARTITIONS BROKER_ID LOG_DIR}).
 * One request per stdin line, one JSON object per stdout line; a call that throws answers
 * {@code {"error": "<exception class>", "message": ...}}. Kafka's own logging goes to stderr.
 *
 * <pre>
 * REGISTER L|F tp                    onPartitionLeadershipChanges (leader or follower)  -> {"ok": true}
 * READY tp timeoutMs                 waits until isReady(tp)                             -> {"ready": bool}
 * SYNC metadataPartition offset timeoutMs   waits until its consumer has read that offset  -> {"ok": true}
 * ADD|UPDATE|DELETE record timeoutMs the API write, waited for (record: KafkaSerdeProbe's S, U or D line)
 *                                                                                        -> {"ok": true}
 * SEND ADD|UPDATE|DELETE record      the API write, not waited for (TBRLMM's one producer keeps their order)
 *                                                                                        -> {"ok": true}
 * AWAIT timeoutMs                    waits for every write SENT since the last AWAIT       -> {"ok": true, "writes": n}
 * LIST tp [epoch]                    listRemoteLogSegments                               -> {"segments": [...]}
 * LOOKUP tp epoch offset             remoteLogSegmentMetadata                            -> {"segment": {...}|null}
 * TXN tp epoch offset                nextSegmentWithTxnIndex                             -> {"segment": {...}|null}
 * HIGHEST tp epoch                   highestOffsetForEpoch                               -> {"offset": n|null}
 * SIZE tp epoch                      remoteLogSize                                       -> {"size": n}
 * </pre>
 * tp is "topicId topic partition" (hex UUID); a segment is {"id", "start", "end", "max_ts", "broker", "event_ts",
 * "size", "epochs": {"epoch": offset}, "custom": hex|null, "state": id, "txn_idx_empty"}.
 */
public final class TbrlmmProbe {
    private static final ObjectMapper JSON = new ObjectMapper();
    // SEND's writes not yet awaited, in the order they were made.
    private static final List<CompletableFuture<Void>> SENT = new ArrayList<>();
    private static final long POLL_MS = 5;
    private static final Field CONSUMER_MANAGER;
    private static final Method WAIT_TILL_CONSUMED;

    static {
        try {
            CONSUMER_MANAGER = TopicBasedRemoteLogMetadataManager.class.getDeclaredField("consumerManager");
            CONSUMER_MANAGER.setAccessible(true);
            WAIT_TILL_CONSUMED = ConsumerManager.class.getDeclaredMethod(
                "waitTillConsumptionCatchesUp", RecordMetadata.class, long.class);
            WAIT_TILL_CONSUMED.setAccessible(true);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    private TbrlmmProbe() {
    }

    public static void main(String[] args) throws Exception {
        // Answers are the only thing on stdout: whatever logs to System.out goes to stderr instead.
        PrintStream answers = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        Map<String, Object> config = new HashMap<>();
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_COMMON_CLIENT_PREFIX
                   + "bootstrap.servers", args[0]);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_PARTITIONS_PROP,
                   Integer.parseInt(args[1]));
        config.put(TopicBasedRemoteLogMetadataManagerConfig.NODE_ID, Integer.parseInt(args[2]));
        config.put(TopicBasedRemoteLogMetadataManagerConfig.LOG_DIR, args[3]);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_REPLICATION_FACTOR_PROP,
                   (short) 1);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_MIN_ISR_PROP, (short) 1);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_CONSUME_WAIT_MS_PROP, 30_000L);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_INITIALIZATION_RETRY_MAX_TIMEOUT_MS_PROP,
                   30_000L);
        TopicBasedRemoteLogMetadataManager manager = new TopicBasedRemoteLogMetadataManager();
        manager.configure(config);
        manager.onBrokerReady();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            ObjectNode answer;
            try {
                answer = answer(manager, line.split(" "));
            } catch (ExecutionException e) {
                answer = error(e.getCause());
            } catch (Exception e) {
                answer = error(e);
            }
            answers.println(JSON.writeValueAsString(answer));
        }
        manager.close();
        // TBRLMM's threads are non-daemon; stdin is closed, so leave now.
        System.exit(0);
    }

    private static ObjectNode answer(TopicBasedRemoteLogMetadataManager manager, String[] f) throws Exception {
        ObjectNode answer = JSON.createObjectNode();
        switch (f[0]) {
            case "REGISTER" -> {
                Set<TopicIdPartition> tp = Set.of(tp(f, 2));
                manager.onPartitionLeadershipChanges(f[1].equals("L") ? tp : Set.of(), f[1].equals("L") ? Set.of() : tp);
                answer.put("ok", true);
            }
            case "READY" -> {
                TopicIdPartition tp = tp(f, 1);
                long deadline = System.currentTimeMillis() + Long.parseLong(f[4]);
                while (!manager.isReady(tp) && System.currentTimeMillis() < deadline) {
                    Thread.sleep(POLL_MS);
                }
                answer.put("ready", manager.isReady(tp));
            }
            case "SYNC" -> {
                // The wait TBRLMM's own writes make before their futures complete: its consumer has read up to the
                // offset on that metadata partition (package-private, hence reflection).
                RecordMetadata upTo = new RecordMetadata(
                    new TopicPartition(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_NAME,
                                       Integer.parseInt(f[1])), Long.parseLong(f[2]), 0, 0L, 0, 0);
                try {
                    WAIT_TILL_CONSUMED.invoke(CONSUMER_MANAGER.get(manager), upTo, Long.parseLong(f[3]));
                } catch (InvocationTargetException e) {
                    throw new ExecutionException(e.getCause());
                }
                answer.put("ok", true);
            }
            case "ADD", "UPDATE", "DELETE" -> {
                write(manager, f[0], Arrays.copyOfRange(f, 1, f.length - 1))
                    .get(Long.parseLong(f[f.length - 1]), TimeUnit.MILLISECONDS);
                answer.put("ok", true);
            }
            case "SEND" -> {
                SENT.add(write(manager, f[1], Arrays.copyOfRange(f, 2, f.length)));
                answer.put("ok", true);
            }
            case "AWAIT" -> {
                CompletableFuture<?>[] sent = SENT.toArray(new CompletableFuture<?>[0]);
                SENT.clear();
                CompletableFuture.allOf(sent).get(Long.parseLong(f[1]), TimeUnit.MILLISECONDS);
                answer.put("ok", true);
                answer.put("writes", sent.length);
            }
            case "LIST" -> {
                Iterator<RemoteLogSegmentMetadata> found = f.length > 4
                    ? manager.listRemoteLogSegments(tp(f, 1), Integer.parseInt(f[4]))
                    : manager.listRemoteLogSegments(tp(f, 1));
                ArrayNode segments = answer.putArray("segments");
                found.forEachRemaining(segment -> segments.add(segment(segment)));
            }
            case "LOOKUP", "TXN" -> {
                TopicIdPartition tp = tp(f, 1);
                int epoch = Integer.parseInt(f[4]);
                long offset = Long.parseLong(f[5]);
                Optional<RemoteLogSegmentMetadata> found = f[0].equals("LOOKUP")
                    ? manager.remoteLogSegmentMetadata(tp, epoch, offset)
                    : manager.nextSegmentWithTxnIndex(tp, epoch, offset);
                answer.set("segment", found.map(TbrlmmProbe::segment).orElse(null));
            }
            case "HIGHEST" -> {
                Optional<Long> found = manager.highestOffsetForEpoch(tp(f, 1), Integer.parseInt(f[4]));
                if (found.isPresent()) {
                    answer.put("offset", found.get());
                } else {
                    answer.putNull("offset");
                }
            }
            case "SIZE" -> answer.put("size", manager.remoteLogSize(tp(f, 1), Integer.parseInt(f[4])));
            default -> throw new IllegalArgumentException("unknown request " + String.join(" ", f));
        }
        return answer;
    }

    private static CompletableFuture<Void> write(TopicBasedRemoteLogMetadataManager manager, String verb, String[] r)
            throws Exception {
        return switch (verb) {
            case "ADD" -> manager.addRemoteLogSegmentMetadata(new RemoteLogSegmentMetadata(
                new RemoteLogSegmentId(tp(r, 1), uuid(r[4])), Long.parseLong(r[5]), Long.parseLong(r[6]),
                Long.parseLong(r[7]), Integer.parseInt(r[8]), Long.parseLong(r[9]), Integer.parseInt(r[10]),
                custom(r[12]), RemoteLogSegmentState.forId(Byte.parseByte(r[13])), epochs(r[11]),
                r[14].equals("1")));
            case "UPDATE" -> manager.updateRemoteLogSegmentMetadata(new RemoteLogSegmentMetadataUpdate(
                new RemoteLogSegmentId(tp(r, 1), uuid(r[4])), Long.parseLong(r[5]), custom(r[6]),
                RemoteLogSegmentState.forId(Byte.parseByte(r[7])), Integer.parseInt(r[8])));
            case "DELETE" -> manager.putRemotePartitionDeleteMetadata(new RemotePartitionDeleteMetadata(
                tp(r, 1), RemotePartitionDeleteState.forId(Byte.parseByte(r[4])), Long.parseLong(r[5]),
                Integer.parseInt(r[6])));
            default -> throw new IllegalArgumentException("unknown write " + verb);
        };
    }

    private static ObjectNode error(Throwable e) {
        ObjectNode answer = JSON.createObjectNode();
        answer.put("error", e.getClass().getSimpleName());
        answer.put("message", String.valueOf(e.getMessage()));
        return answer;
    }

    private static ObjectNode segment(RemoteLogSegmentMetadata md) {
        ObjectNode segment = JSON.createObjectNode();
        segment.put("id", uuidText(md.remoteLogSegmentId().id()));
        segment.put("start", md.startOffset());
        segment.put("end", md.endOffset());
        segment.put("max_ts", md.maxTimestampMs());
        segment.put("broker", md.brokerId());
        segment.put("event_ts", md.eventTimestampMs());
        segment.put("size", md.segmentSizeInBytes());
        ObjectNode epochs = segment.putObject("epochs");
        md.segmentLeaderEpochs().forEach((epoch, offset) -> epochs.put(String.valueOf(epoch), offset));
        segment.put("custom", md.customMetadata().map(c -> HexFormat.of().formatHex(c.value())).orElse(null));
        segment.put("state", md.state().id());
        segment.put("txn_idx_empty", md.isTxnIdxEmpty());
        return segment;
    }

    private static TopicIdPartition tp(String[] f, int at) {
        return new TopicIdPartition(uuid(f[at]), Integer.parseInt(f[at + 2]), f[at + 1]);
    }

    private static Uuid uuid(String text) {
        UUID u = UUID.fromString(text);
        return new Uuid(u.getMostSignificantBits(), u.getLeastSignificantBits());
    }

    private static String uuidText(Uuid id) {
        return new UUID(id.getMostSignificantBits(), id.getLeastSignificantBits()).toString();
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
