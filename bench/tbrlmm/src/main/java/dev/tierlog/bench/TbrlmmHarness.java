package dev.tierlog.bench;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.server.log.remote.metadata.storage.RemoteLogMetadataTopicPartitioner;
import org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager;
import org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManagerConfig;
import org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;

import java.io.BufferedReader;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.Random;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

/**
 * Drives Kafka's own TopicBasedRemoteLogMetadataManager (TBRLMM) for bench/rlmm_vs_kafka.py.
 *
 * <p>{@code produce EVENTS BOOTSTRAP PARTITIONS [SECONDS]}: writes the logical events of EVENTS (the runner's
 * text file) onto {@code __remote_log_metadata} exactly as TBRLMM's producer would (its serde, its partitioner,
 * null keys), without waiting for each write to be consumed; with SECONDS, spread evenly over that time.
 * {@code node EVENTS BOOTSTRAP PARTITIONS LOG_DIR LOOKUPS WRITES SEED [BUSY_EVENTS@SECONDS ...]}: a node with
 * an empty log dir starts TBRLMM, registers every user partition, waits until all are ready, then times in-process
 * lookups and API writes, then lookups again while each BUSY_EVENTS file is produced (at once, or over SECONDS)
 * and applied. Each command prints one JSON object.
 */
public final class TbrlmmHarness {
    private static final byte[] FINISHED_CUSTOM_METADATA = new byte[24];
    private static final long READY_TIMEOUT_MS = TimeUnit.MINUTES.toMillis(30);
    private static final long BUSY_TIMEOUT_MS = TimeUnit.MINUTES.toMillis(5);

    private TbrlmmHarness() {
    }

    /** The user partitions and metadata events of an events file. */
    private record History(List<TopicIdPartition> partitions, List<RemoteLogMetadata> events) {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            usage();
        }
        History history = readHistory(Path.of(args[1]));
        String bootstrap = args[2];
        int partitions = Integer.parseInt(args[3]);
        switch (args[0]) {
            case "produce" -> produce(history, bootstrap, partitions,
                                      args.length > 4 ? Double.parseDouble(args[4]) : 0.0);
            case "node" -> {
                if (args.length < 8) {
                    usage();
                }
                node(history, bootstrap, partitions, args[4], Integer.parseInt(args[5]),
                     Integer.parseInt(args[6]), Long.parseLong(args[7]), Arrays.copyOfRange(args, 8, args.length));
            }
            default -> usage();
        }
        // TBRLMM's threads are non-daemon; the measurements are printed, so leave now.
        System.exit(0);
    }

    private static void usage() {
        System.err.println("usage: TbrlmmHarness produce EVENTS BOOTSTRAP PARTITIONS [SECONDS]\n"
                           + "       TbrlmmHarness node EVENTS BOOTSTRAP PARTITIONS LOG_DIR LOOKUPS WRITES SEED "
                           + "[BUSY_EVENTS@SECONDS ...]");
        System.exit(2);
    }

    // Lines: "P <topic id> <topic> <partition>", "A <tp index> <segment id> <start> <end> <epoch> <max ts>
    // <broker> <event ts> <size> <txn idx empty 0|1>", "U <tp index> <segment id> <state id> <event ts> <broker>".
    private static History readHistory(Path file) throws Exception {
        List<TopicIdPartition> partitions = new ArrayList<>();
        List<RemoteLogMetadata> events = new ArrayList<>();
        try (BufferedReader reader = Files.newBufferedReader(file)) {
            String line;
            while ((line = reader.readLine()) != null) {
                String[] f = line.split(" ");
                switch (f[0]) {
                    case "P" -> partitions.add(new TopicIdPartition(uuid(f[1]), Integer.parseInt(f[3]), f[2]));
                    case "A" -> {
                        TopicIdPartition tp = partitions.get(Integer.parseInt(f[1]));
                        long start = Long.parseLong(f[3]);
                        events.add(new RemoteLogSegmentMetadata(
                            new RemoteLogSegmentId(tp, uuid(f[2])), start, Long.parseLong(f[4]),
                            Long.parseLong(f[6]), Integer.parseInt(f[7]), Long.parseLong(f[8]),
                            Integer.parseInt(f[9]), Map.of(Integer.parseInt(f[5]), start), f[10].equals("1")));
                    }
                    case "U" -> {
                        TopicIdPartition tp = partitions.get(Integer.parseInt(f[1]));
                        RemoteLogSegmentState state = RemoteLogSegmentState.forId(Byte.parseByte(f[3]));
                        Optional<CustomMetadata> custom = state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
                            ? Optional.of(new CustomMetadata(FINISHED_CUSTOM_METADATA)) : Optional.empty();
                        events.add(new RemoteLogSegmentMetadataUpdate(new RemoteLogSegmentId(tp, uuid(f[2])),
                            Long.parseLong(f[4]), custom, state, Integer.parseInt(f[5])));
                    }
                    default -> throw new IllegalArgumentException(file + ": unknown line " + line);
                }
            }
        }
        return new History(partitions, events);
    }

    private static Uuid uuid(String text) {
        UUID u = UUID.fromString(text);
        return new Uuid(u.getMostSignificantBits(), u.getLeastSignificantBits());
    }

    private static void produce(History history, String bootstrap, int partitions, double spreadSeconds)
            throws Exception {
        String topic = TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_NAME;
        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
            // The settings TBRLMM creates its topic with (delete policy, infinite retention), at RF 1.
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1)
                .configs(Map.of("cleanup.policy", "delete", "retention.ms", "-1")))).all().get(60, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
            if (!(e.getCause() instanceof TopicExistsException)) {
                throw e;
            }
        }
        RemoteLogMetadataSerde serde = new RemoteLogMetadataSerde();
        RemoteLogMetadataTopicPartitioner partitioner = new RemoteLogMetadataTopicPartitioner(partitions);
        Map<String, Object> config = new HashMap<>();
        config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(ProducerConfig.ACKS_CONFIG, "all");
        config.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
        config.put(ProducerConfig.LINGER_MS_CONFIG, 50);
        config.put(ProducerConfig.BATCH_SIZE_CONFIG, 1_000_000);
        config.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
        long started = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> producer =
                 new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer())) {
            // Spread evenly over `spreadSeconds` when given (the runner's paced step), as its Python producer does.
            long intervalNs = (long) (spreadSeconds * 1e9 / Math.max(1, history.events().size()));
            long first = System.nanoTime();
            int i = 0;
            for (RemoteLogMetadata event : history.events()) {
                long waitNs = first + i++ * intervalNs - System.nanoTime();
                if (waitNs > 0) {
                    TimeUnit.NANOSECONDS.sleep(waitNs);
                }
                producer.send(new ProducerRecord<>(topic, partitioner.metadataPartition(event.topicIdPartition()),
                                                   null, serde.serialize(event)));
            }
            producer.flush();
        }
        double seconds = (System.nanoTime() - started) / 1e9;
        System.out.printf(Locale.ROOT, "{\"records\": %d, \"produce_s\": %.3f}%n", history.events().size(), seconds);
    }

    private static void node(History history, String bootstrap, int partitions, String logDir, int lookups,
                             int writes, long seed, String[] busyPhases) throws Exception {
        Map<String, Object> config = new HashMap<>();
        config.put(TopicBasedRemoteLogMetadataManagerConfig.LOG_DIR, logDir);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.BROKER_ID, 0);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_PARTITIONS_PROP, partitions);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_REPLICATION_FACTOR_PROP, (short) 1);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_MIN_ISR_PROP, (short) 1);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_COMMON_CLIENT_PREFIX
                   + "bootstrap.servers", bootstrap);
        Set<TopicIdPartition> all = new HashSet<>(history.partitions());
        Random random = new Random(seed);
        TopicIdPartition writeTarget = new TopicIdPartition(new Uuid(random.nextLong(), random.nextLong()), 0,
                                                            "bench-writes");
        all.add(writeTarget);

        long started = System.nanoTime();
        TopicBasedRemoteLogMetadataManager manager = new TopicBasedRemoteLogMetadataManager();
        manager.configure(config);
        manager.onBrokerReady();
        manager.onPartitionLeadershipChanges(all, Set.of());
        long deadline = System.currentTimeMillis() + READY_TIMEOUT_MS;
        for (TopicIdPartition tp : all) {
            while (!manager.isReady(tp)) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("TBRLMM did not get ready for " + tp + " in time");
                }
                Thread.sleep(2);
            }
        }
        double readySeconds = (System.nanoTime() - started) / 1e9;
        long rssAfterReady = rssKib();

        List<RemoteLogSegmentMetadata> live = new ArrayList<>();
        for (TopicIdPartition tp : history.partitions()) {
            Iterator<RemoteLogSegmentMetadata> it = manager.listRemoteLogSegments(tp);
            it.forEachRemaining(live::add);
        }
        long[] lookupNs = new long[lookups];
        int hits = 0;
        // Warm the JIT first, as a broker that has run for a while would be.
        for (int round = 0; round < 2; round++) {
            hits = 0;
            for (int i = 0; i < lookups; i++) {
                RemoteLogSegmentMetadata md = live.get(random.nextInt(live.size()));
                int epoch = md.segmentLeaderEpochs().firstKey();
                long offset = md.startOffset() + (long) (random.nextDouble() * (md.endOffset() - md.startOffset()));
                long t0 = System.nanoTime();
                Optional<RemoteLogSegmentMetadata> found = manager.remoteLogSegmentMetadata(md.topicIdPartition(),
                                                                                           epoch, offset);
                lookupNs[i] = System.nanoTime() - t0;
                hits += found.isPresent() ? 1 : 0;
            }
        }

        long[] addNs = new long[writes];
        long[] finishNs = new long[writes];
        for (int i = 0; i < writes; i++) {
            long start = i * 10_000L;
            RemoteLogSegmentMetadata md = new RemoteLogSegmentMetadata(
                new RemoteLogSegmentId(writeTarget, Uuid.randomUuid()), start,
                start + 9_999, 0L, 0, System.currentTimeMillis(), 1 << 20, Map.of(0, start), true);
            long t0 = System.nanoTime();
            manager.addRemoteLogSegmentMetadata(md).get(60, TimeUnit.SECONDS);
            long t1 = System.nanoTime();
            manager.updateRemoteLogSegmentMetadata(new RemoteLogSegmentMetadataUpdate(
                md.remoteLogSegmentId(), System.currentTimeMillis(),
                Optional.of(new CustomMetadata(FINISHED_CUSTOM_METADATA)),
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0)).get(60, TimeUnit.SECONDS);
            addNs[i] = t1 - t0;
            finishNs[i] = System.nanoTime() - t1;
        }

        StringBuilder busy = new StringBuilder();
        for (String phase : busyPhases) {
            int at = phase.lastIndexOf('@');
            busy.append(lookupsWhileBusy(manager, live, random, phase.substring(0, at),
                                         Double.parseDouble(phase.substring(at + 1)), bootstrap, partitions));
        }

        System.gc();
        long heapUsed = ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed();
        manager.close();
        Arrays.sort(lookupNs);
        Arrays.sort(addNs);
        Arrays.sort(finishNs);
        System.out.printf(Locale.ROOT,
            "{\"ready_s\": %.3f, \"live_segments\": %d, \"lookups\": %d, \"lookup_hits\": %d, "
            + "\"lookup_p50_us\": %.2f, \"lookup_p99_us\": %.2f, \"writes\": %d, \"add_p50_ms\": %.3f, "
            + "\"add_p99_ms\": %.3f, \"finish_p50_ms\": %.3f, \"finish_p99_ms\": %.3f, \"rss_mib\": %.1f, "
            + "\"heap_used_mib\": %.1f%s}%n",
            readySeconds, live.size(), lookups, hits, pct(lookupNs, 0.5) / 1e3, pct(lookupNs, 0.99) / 1e3, writes,
            pct(addNs, 0.5) / 1e6, pct(addNs, 0.99) / 1e6, pct(finishNs, 0.5) / 1e6, pct(finishNs, 0.99) / 1e6,
            rssAfterReady / 1024.0, heapUsed / 1048576.0, busy);
    }

    /**
     * Lookups timed back to back while TBRLMM's consumer applies the events of {@code busyFile} (other user
     * partitions, registered first), which a producer process appends: from the moment the first of them is seen
     * until the last is. With {@code seconds} above 0 the producer spreads them evenly over that time (the
     * runner's paced step, figures named "paced_..."; else "busy_..."). Returns the figures as JSON members, each
     * after a comma.
     */
    private static String lookupsWhileBusy(TopicBasedRemoteLogMetadataManager manager,
                                           List<RemoteLogSegmentMetadata> live, Random random, String busyFile,
                                           double seconds, String bootstrap, int partitions) throws Exception {
        History busy = readHistory(Path.of(busyFile));
        Set<TopicIdPartition> busyPartitions = new HashSet<>(busy.partitions());
        manager.onPartitionLeadershipChanges(busyPartitions, Set.of());
        long deadline = System.currentTimeMillis() + BUSY_TIMEOUT_MS;
        for (TopicIdPartition tp : busyPartitions) {
            while (!manager.isReady(tp)) {
                checkDeadline(deadline, "TBRLMM did not get ready for the busy partitions");
                Thread.sleep(2);
            }
        }
        // Seen first: the first upload; seen last: the last copy-finished update of a segment retention keeps.
        RemoteLogSegmentId first = ((RemoteLogSegmentMetadata) busy.events().get(0)).remoteLogSegmentId();
        RemoteLogSegmentId last = null;
        Set<RemoteLogSegmentId> deletedLater = new HashSet<>();
        for (int i = busy.events().size() - 1; i >= 0 && last == null; i--) {
            if (busy.events().get(i) instanceof RemoteLogSegmentMetadataUpdate update) {
                if (update.state() == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
                    && !deletedLater.contains(update.remoteLogSegmentId())) {
                    last = update.remoteLogSegmentId();
                } else if (update.state() != RemoteLogSegmentState.COPY_SEGMENT_FINISHED) {
                    deletedLater.add(update.remoteLogSegmentId());
                }
            }
        }
        String java = ProcessHandle.current().info().command().orElse("java");
        Process producer = new ProcessBuilder(java, "-cp", System.getProperty("java.class.path"),
                                              TbrlmmHarness.class.getName(), "produce", busyFile, bootstrap,
                                              Integer.toString(partitions), Double.toString(seconds))
            .redirectOutput(ProcessBuilder.Redirect.DISCARD).redirectError(ProcessBuilder.Redirect.INHERIT).start();
        try {
            while (state(manager, first) == null
                   && state(manager, last) != RemoteLogSegmentState.COPY_SEGMENT_FINISHED) {
                checkDeadline(deadline, "TBRLMM did not start on the busy events");
                Thread.sleep(1);
            }
            long[] busyNs = new long[1 << 16];
            int count = 0;
            long started = System.nanoTime();
            while (state(manager, last) != RemoteLogSegmentState.COPY_SEGMENT_FINISHED) {
                checkDeadline(deadline, "TBRLMM did not apply the busy events in time");
                for (int i = 0; i < 1000; i++) {
                    RemoteLogSegmentMetadata md = live.get(random.nextInt(live.size()));
                    int epoch = md.segmentLeaderEpochs().firstKey();
                    long offset = md.startOffset()
                        + (long) (random.nextDouble() * (md.endOffset() - md.startOffset()));
                    long t0 = System.nanoTime();
                    manager.remoteLogSegmentMetadata(md.topicIdPartition(), epoch, offset);
                    long took = System.nanoTime() - t0;
                    if (count == busyNs.length) {
                        busyNs = Arrays.copyOf(busyNs, count * 2);
                    }
                    busyNs[count++] = took;
                }
            }
            double busySeconds = (System.nanoTime() - started) / 1e9;
            if (!producer.waitFor(BUSY_TIMEOUT_MS, TimeUnit.MILLISECONDS) || producer.exitValue() != 0) {
                throw new IllegalStateException("the busy producer failed");
            }
            long[] sorted = Arrays.copyOf(busyNs, count);
            Arrays.sort(sorted);
            return String.format(Locale.ROOT,
                ", \"%1$s_records\": %2$d, \"%1$s_s\": %3$.3f, \"%1$s_lookups\": %4$d, "
                + "\"%1$s_lookup_p50_us\": %5$.2f, \"%1$s_lookup_p99_us\": %6$.2f, \"%1$s_lookup_p999_us\": %7$.2f, "
                + "\"%1$s_lookup_max_us\": %8$.2f",
                seconds > 0 ? "paced" : "busy", busy.events().size(), busySeconds, count, pct(sorted, 0.5) / 1e3, pct(sorted, 0.99) / 1e3,
                pct(sorted, 0.999) / 1e3, count == 0 ? Double.NaN : sorted[count - 1] / 1e3);
        } finally {
            producer.destroyForcibly();
        }
    }

    /** The state TBRLMM's cache holds for a segment, or null while it holds none. */
    private static RemoteLogSegmentState state(TopicBasedRemoteLogMetadataManager manager, RemoteLogSegmentId id)
            throws Exception {
        Iterator<RemoteLogSegmentMetadata> it = manager.listRemoteLogSegments(id.topicIdPartition());
        while (it.hasNext()) {
            RemoteLogSegmentMetadata md = it.next();
            if (md.remoteLogSegmentId().equals(id)) {
                return md.state();
            }
        }
        return null;
    }

    private static void checkDeadline(long deadline, String what) {
        if (System.currentTimeMillis() > deadline) {
            throw new IllegalStateException(what);
        }
    }

    private static double pct(long[] sorted, double q) {
        return sorted.length == 0 ? Double.NaN : sorted[Math.min(sorted.length - 1, (int) (sorted.length * q))];
    }

    private static long rssKib() throws Exception {
        for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (line.startsWith("VmRSS:")) {
                return Long.parseLong(line.replaceAll("[^0-9]", ""));
            }
        }
        return -1;
    }
}
