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
 * <p>{@code produce BOOTSTRAP PARTITIONS SECONDS FILE...}: writes the logical events of the runner's text files
 * (read in turn, streamed: user partitions are numbered across the files) onto {@code __remote_log_metadata} exactly
 * as TBRLMM's producer would (its serde, its partitioner, null keys), without waiting for each write to be consumed;
 * with SECONDS above 0, spread evenly over that time.
 * {@code node PLAN BOOTSTRAP PARTITIONS LOG_DIR WRITES SEED NEWCOMERS [BUSY_EVENTS@SECONDS ...]}: a node with an
 * empty log dir starts TBRLMM, registers the plan's hosted user partitions, waits until all are ready, then times the
 * first lookup of each hosted partition, in-process lookups and API writes, with NEWCOMERS 1 the time until each
 * newcomer partition registered one at a time is ready and answers its first lookup, then lookups again while each
 * BUSY_EVENTS file is produced (at once, or over SECONDS) and applied. Each command prints one JSON object.
 */
public final class TbrlmmHarness {
    private static final byte[] FINISHED_CUSTOM_METADATA = new byte[24];
    private static final long READY_TIMEOUT_MS = TimeUnit.MINUTES.toMillis(20);
    private static final long NEWCOMER_TIMEOUT_MS = TimeUnit.MINUTES.toMillis(2);
    private static final long BUSY_TIMEOUT_MS = TimeUnit.MINUTES.toMillis(5);

    private TbrlmmHarness() {
    }

    /** The user partitions and metadata events of an events file. */
    private record History(List<TopicIdPartition> partitions, List<RemoteLogMetadata> events) {
    }

    /** A lookup: a leader epoch and an offset of a user partition. */
    private record Lookup(TopicIdPartition partition, int epoch, long offset) {
    }

    /**
     * What a node does (the runner's plan file): "P topic-id topic partition role" per user partition (role h:
     * hosted, n: registered later as a newcomer, o: only in the topic), then "F tp epoch offset" (the first lookup
     * of a hosted partition), "L tp epoch offset" (a timed lookup), "N tp epoch offset" (a newcomer's first lookup);
     * tp is the partition's line number among the P lines.
     */
    private record Plan(Set<TopicIdPartition> hosted, List<Lookup> first, List<Lookup> lookups,
                        List<Lookup> newcomers) {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            usage();
        }
        switch (args[0]) {
            case "produce" -> produce(args[1], Integer.parseInt(args[2]), Double.parseDouble(args[3]),
                                      Arrays.copyOfRange(args, 4, args.length));
            case "node" -> {
                if (args.length < 8) {
                    usage();
                }
                node(readPlan(Path.of(args[1])), args[2], Integer.parseInt(args[3]), args[4],
                     Integer.parseInt(args[5]), Long.parseLong(args[6]), args[7].equals("1"),
                     Arrays.copyOfRange(args, 8, args.length));
            }
            default -> usage();
        }
        // TBRLMM's threads are non-daemon; the measurements are printed, so leave now.
        System.exit(0);
    }

    private static void usage() {
        System.err.println("usage: TbrlmmHarness produce BOOTSTRAP PARTITIONS SECONDS FILE...\n"
                           + "       TbrlmmHarness node PLAN BOOTSTRAP PARTITIONS LOG_DIR WRITES SEED NEWCOMERS "
                           + "[BUSY_EVENTS@SECONDS ...]");
        System.exit(2);
    }

    private static Plan readPlan(Path file) throws Exception {
        List<TopicIdPartition> partitions = new ArrayList<>();
        Set<TopicIdPartition> hosted = new HashSet<>();
        List<Lookup> first = new ArrayList<>();
        List<Lookup> lookups = new ArrayList<>();
        List<Lookup> newcomers = new ArrayList<>();
        try (BufferedReader reader = Files.newBufferedReader(file)) {
            String line;
            while ((line = reader.readLine()) != null) {
                String[] f = line.split(" ");
                if (f[0].equals("P")) {
                    TopicIdPartition tp = new TopicIdPartition(uuid(f[1]), Integer.parseInt(f[3]), f[2]);
                    partitions.add(tp);
                    if (f[4].equals("h")) {
                        hosted.add(tp);
                    }
                    continue;
                }
                Lookup lookup = new Lookup(partitions.get(Integer.parseInt(f[1])), Integer.parseInt(f[2]),
                                           Long.parseLong(f[3]));
                switch (f[0]) {
                    case "F" -> first.add(lookup);
                    case "L" -> lookups.add(lookup);
                    case "N" -> newcomers.add(lookup);
                    default -> throw new IllegalArgumentException(file + ": unknown line " + line);
                }
            }
        }
        return new Plan(hosted, first, lookups, newcomers);
    }

    // Lines: "P <topic id> <topic> <partition> [role]", "A <tp index> <segment id> <start> <end> <epoch> <max ts>
    // <broker> <event ts> <size> <txn idx empty 0|1>", "U <tp index> <segment id> <state id> <event ts> <broker>".
    // `partitions` collects the P lines; each event is handed to `sink` as it is read.
    private static void readEvents(Path file, List<TopicIdPartition> partitions, EventSink sink) throws Exception {
        try (BufferedReader reader = Files.newBufferedReader(file)) {
            String line;
            while ((line = reader.readLine()) != null) {
                String[] f = line.split(" ");
                switch (f[0]) {
                    case "P" -> partitions.add(new TopicIdPartition(uuid(f[1]), Integer.parseInt(f[3]), f[2]));
                    case "A" -> {
                        TopicIdPartition tp = partitions.get(Integer.parseInt(f[1]));
                        long start = Long.parseLong(f[3]);
                        sink.accept(new RemoteLogSegmentMetadata(
                            new RemoteLogSegmentId(tp, uuid(f[2])), start, Long.parseLong(f[4]),
                            Long.parseLong(f[6]), Integer.parseInt(f[7]), Long.parseLong(f[8]),
                            Integer.parseInt(f[9]), Map.of(Integer.parseInt(f[5]), start), f[10].equals("1")));
                    }
                    case "U" -> {
                        TopicIdPartition tp = partitions.get(Integer.parseInt(f[1]));
                        RemoteLogSegmentState state = RemoteLogSegmentState.forId(Byte.parseByte(f[3]));
                        Optional<CustomMetadata> custom = state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
                            ? Optional.of(new CustomMetadata(FINISHED_CUSTOM_METADATA)) : Optional.empty();
                        sink.accept(new RemoteLogSegmentMetadataUpdate(new RemoteLogSegmentId(tp, uuid(f[2])),
                            Long.parseLong(f[4]), custom, state, Integer.parseInt(f[5])));
                    }
                    default -> throw new IllegalArgumentException(file + ": unknown line " + line);
                }
            }
        }
    }

    @FunctionalInterface
    private interface EventSink {
        void accept(RemoteLogMetadata event) throws Exception;
    }

    private static History readHistory(Path file) throws Exception {
        List<TopicIdPartition> partitions = new ArrayList<>();
        List<RemoteLogMetadata> events = new ArrayList<>();
        readEvents(file, partitions, events::add);
        return new History(partitions, events);
    }

    private static long countEvents(String[] files) throws Exception {
        long count = 0;
        for (String file : files) {
            try (var lines = Files.lines(Path.of(file))) {
                count += lines.filter(line -> !line.startsWith("P ")).count();
            }
        }
        return count;
    }

    private static Uuid uuid(String text) {
        UUID u = UUID.fromString(text);
        return new Uuid(u.getMostSignificantBits(), u.getLeastSignificantBits());
    }

    private static void produce(String bootstrap, int partitions, double spreadSeconds, String[] files)
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
        config.put(ProducerConfig.LINGER_MS_CONFIG, 100);
        config.put(ProducerConfig.BATCH_SIZE_CONFIG, 1_000_000);
        config.put(ProducerConfig.BUFFER_MEMORY_CONFIG, 256L << 20);
        config.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
        long started = System.nanoTime();
        long[] sent = {0};
        try (KafkaProducer<byte[], byte[]> producer =
                 new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer())) {
            // Spread evenly over `spreadSeconds` when given (the runner's paced step), as its Python producer does.
            long intervalNs = spreadSeconds > 0 ? (long) (spreadSeconds * 1e9 / Math.max(1, countEvents(files))) : 0;
            long first = System.nanoTime();
            List<TopicIdPartition> userPartitions = new ArrayList<>();
            for (String file : files) {
                readEvents(Path.of(file), userPartitions, event -> {
                    long waitNs = first + sent[0]++ * intervalNs - System.nanoTime();
                    if (waitNs > 0) {
                        TimeUnit.NANOSECONDS.sleep(waitNs);
                    }
                    producer.send(new ProducerRecord<>(topic, partitioner.metadataPartition(event.topicIdPartition()),
                                                       null, serde.serialize(event)));
                });
            }
            producer.flush();
        }
        double seconds = (System.nanoTime() - started) / 1e9;
        System.out.printf(Locale.ROOT, "{\"records\": %d, \"produce_s\": %.3f}%n", sent[0], seconds);
    }

    private static void node(Plan plan, String bootstrap, int partitions, String logDir, int writes, long seed,
                             boolean newcomers, String[] busyPhases) throws Exception {
        Map<String, Object> config = new HashMap<>();
        config.put(TopicBasedRemoteLogMetadataManagerConfig.LOG_DIR, logDir);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.BROKER_ID, 0);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_PARTITIONS_PROP, partitions);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_REPLICATION_FACTOR_PROP, (short) 1);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_MIN_ISR_PROP, (short) 1);
        config.put(TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_COMMON_CLIENT_PREFIX
                   + "bootstrap.servers", bootstrap);
        Set<TopicIdPartition> all = new HashSet<>(plan.hosted());
        Random random = new Random(seed);
        TopicIdPartition writeTarget = new TopicIdPartition(new Uuid(random.nextLong(), random.nextLong()), 0,
                                                            "bench-writes");
        all.add(writeTarget);

        long rssBefore = rssKib();
        long started = System.nanoTime();
        TopicBasedRemoteLogMetadataManager manager = new TopicBasedRemoteLogMetadataManager();
        manager.configure(config);
        manager.onBrokerReady();
        manager.onPartitionLeadershipChanges(all, Set.of());
        long deadline = System.currentTimeMillis() + READY_TIMEOUT_MS;
        for (TopicIdPartition tp : all) {
            while (!manager.isReady(tp)) {
                checkDeadline(deadline, "TBRLMM did not get ready for " + tp + " within "
                              + READY_TIMEOUT_MS / 1000 + " s");
                Thread.sleep(2);
            }
        }
        double readySeconds = (System.nanoTime() - started) / 1e9;
        long rssAfterReady = rssKib();

        // The first lookup of each hosted partition (TBRLMM holds every one in memory from the start).
        long[] firstNs = new long[plan.first().size()];
        int firstHits = 0;
        for (int i = 0; i < firstNs.length; i++) {
            Lookup lookup = plan.first().get(i);
            long t0 = System.nanoTime();
            firstHits += lookup(manager, lookup).isPresent() ? 1 : 0;
            firstNs[i] = System.nanoTime() - t0;
        }
        long[] lookupNs = new long[plan.lookups().size()];
        int hits = 0;
        // Warm the JIT first, as a broker that has run for a while would be.
        for (int round = 0; round < 2; round++) {
            hits = 0;
            for (int i = 0; i < lookupNs.length; i++) {
                long t0 = System.nanoTime();
                Optional<RemoteLogSegmentMetadata> found = lookup(manager, plan.lookups().get(i));
                lookupNs[i] = System.nanoTime() - t0;
                hits += found.isPresent() ? 1 : 0;
            }
        }

        long[] addNs = new long[writes];
        long[] finishNs = new long[writes];
        // Past what earlier steps uploaded, as the runner's tierlog node does (a broker's copier goes on from there).
        long base = manager.highestOffsetForEpoch(writeTarget, 0).map(offset -> offset + 1).orElse(0L);
        for (int i = 0; i < writes; i++) {
            long start = base + i * 10_000L;
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

        // A partition newly hosted on the running node (leadership moved here): registered alone, then the time
        // until it is ready and until its first lookup answers.
        List<Lookup> joining = newcomers ? plan.newcomers() : List.of();
        long[] newcomerReadyNs = new long[joining.size()];
        long[] newcomerAnswerNs = new long[joining.size()];
        int newcomerHits = 0;
        for (int i = 0; i < newcomerReadyNs.length; i++) {
            Lookup lookup = joining.get(i);
            long newcomerDeadline = System.currentTimeMillis() + NEWCOMER_TIMEOUT_MS;
            long t0 = System.nanoTime();
            manager.onPartitionLeadershipChanges(Set.of(lookup.partition()), Set.of());
            while (!manager.isReady(lookup.partition())) {
                checkDeadline(newcomerDeadline, "TBRLMM did not get newcomer " + lookup.partition() + " ready");
                Thread.onSpinWait();
            }
            newcomerReadyNs[i] = System.nanoTime() - t0;
            newcomerHits += lookup(manager, lookup).isPresent() ? 1 : 0;
            newcomerAnswerNs[i] = System.nanoTime() - t0;
        }

        StringBuilder busy = new StringBuilder();
        for (String phase : busyPhases) {
            int at = phase.lastIndexOf('@');
            busy.append(lookupsWhileBusy(manager, plan.lookups(), phase.substring(0, at),
                                         Double.parseDouble(phase.substring(at + 1)), bootstrap, partitions));
        }

        long live = 0;
        for (TopicIdPartition tp : plan.hosted()) {
            Iterator<RemoteLogSegmentMetadata> it = manager.listRemoteLogSegments(tp);
            while (it.hasNext()) {
                it.next();
                live++;
            }
        }
        System.gc();
        long heapUsed = ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed();
        manager.close();
        Arrays.sort(firstNs);
        Arrays.sort(lookupNs);
        Arrays.sort(addNs);
        Arrays.sort(finishNs);
        Arrays.sort(newcomerReadyNs);
        Arrays.sort(newcomerAnswerNs);
        String newcomerFigures = joining.isEmpty() ? "" : String.format(Locale.ROOT,
            ", \"newcomers\": %d, \"newcomer_hits\": %d, \"newcomer_ready_p50_ms\": %.3f, "
            + "\"newcomer_ready_p99_ms\": %.3f, \"newcomer_answer_p50_ms\": %.3f, \"newcomer_answer_p99_ms\": %.3f",
            joining.size(), newcomerHits, pct(newcomerReadyNs, 0.5) / 1e6, pct(newcomerReadyNs, 0.99) / 1e6,
            pct(newcomerAnswerNs, 0.5) / 1e6, pct(newcomerAnswerNs, 0.99) / 1e6);
        System.out.printf(Locale.ROOT,
            "{\"ready_s\": %.3f, \"hosted_partitions\": %d, \"hosted_live_segments\": %d, \"first_lookups\": %d, "
            + "\"first_lookup_hits\": %d, \"first_lookup_p50_us\": %.2f, \"first_lookup_p99_us\": %.2f, "
            + "\"lookups\": %d, \"lookup_hits\": %d, "
            + "\"lookup_p50_us\": %.2f, \"lookup_p99_us\": %.2f, \"writes\": %d, \"add_p50_ms\": %.3f, "
            + "\"add_p99_ms\": %.3f, \"finish_p50_ms\": %.3f, \"finish_p99_ms\": %.3f, \"rss_before_mib\": %.1f, "
            + "\"rss_mib\": %.1f, "
            + "\"rss_end_mib\": %.1f, \"heap_used_mib\": %.1f%s%s}%n",
            readySeconds, plan.hosted().size(), live, firstNs.length, firstHits, pct(firstNs, 0.5) / 1e3,
            pct(firstNs, 0.99) / 1e3, lookupNs.length, hits, pct(lookupNs, 0.5) / 1e3, pct(lookupNs, 0.99) / 1e3,
            writes, pct(addNs, 0.5) / 1e6, pct(addNs, 0.99) / 1e6, pct(finishNs, 0.5) / 1e6,
            pct(finishNs, 0.99) / 1e6, rssBefore / 1024.0, rssAfterReady / 1024.0, rssKib() / 1024.0, heapUsed / 1048576.0,
            newcomerFigures, busy);
    }

    private static Optional<RemoteLogSegmentMetadata> lookup(TopicBasedRemoteLogMetadataManager manager,
                                                            Lookup lookup) throws Exception {
        return manager.remoteLogSegmentMetadata(lookup.partition(), lookup.epoch(), lookup.offset());
    }

    /**
     * Lookups timed back to back while TBRLMM's consumer applies the events of {@code busyFile} (other user
     * partitions, registered first), which a producer process appends: from the moment the first of them is seen
     * until the last is. With {@code seconds} above 0 the producer spreads them evenly over that time (the
     * runner's paced step, figures named "paced_..."; else "busy_..."). Returns the figures as JSON members, each
     * after a comma.
     */
    private static String lookupsWhileBusy(TopicBasedRemoteLogMetadataManager manager,
                                           List<Lookup> lookups, String busyFile,
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
                                              TbrlmmHarness.class.getName(), "produce", bootstrap,
                                              Integer.toString(partitions), Double.toString(seconds), busyFile)
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
                    Lookup lookup = lookups.get(count % lookups.size());
                    long t0 = System.nanoTime();
                    lookup(manager, lookup);
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
