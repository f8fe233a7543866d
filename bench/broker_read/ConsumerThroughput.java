/*
 * A Java consumer for bench/broker_tiered_read.py: reads one partition from offset 0 to its end offset at the
 * start, as a consumer catching up from tiered storage does, and prints one JSON line: records, bytes, seconds, and
 * the seconds until the first record came (the first remote fetch's latency, apart from the streaming after it).
 * Compiled by the bench with javac against the broker's kafka-clients jar (no build tool needed).
 */

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class ConsumerThroughput {
    private ConsumerThroughput() {
    }

    public static void main(String[] args) {
        if (args.length != 3) {
            System.err.println("usage: ConsumerThroughput <bootstrap> <topic> <timeout seconds>");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        // As kafka-consumer-perf-test's defaults for a catching-up reader.
        props.put(ConsumerConfig.FETCH_MAX_BYTES_CONFIG, String.valueOf(50 << 20));
        props.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, String.valueOf(1 << 20));
        props.put(ConsumerConfig.RECEIVE_BUFFER_CONFIG, String.valueOf(2 << 20));
        TopicPartition partition = new TopicPartition(args[1], 0);
        long deadline = System.nanoTime() + Long.parseLong(args[2]) * 1_000_000_000L;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(List.of(partition));
            Map<TopicPartition, Long> ends = consumer.endOffsets(List.of(partition));
            long end = ends.get(partition);
            consumer.seek(partition, 0);
            long records = 0;
            long bytes = 0;
            long next = 0;
            long started = System.nanoTime();
            long first = -1;
            while (next < end) {
                if (System.nanoTime() > deadline) {
                    System.err.printf("timed out at offset %d of %d%n", next, end);
                    System.exit(1);
                }
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(500))) {
                    if (first < 0) {
                        first = System.nanoTime();
                    }
                    records++;
                    bytes += record.serializedKeySize() + record.serializedValueSize();
                    next = record.offset() + 1;
                }
            }
            double seconds = (System.nanoTime() - started) / 1e9;
            System.out.printf("{\"records\": %d, \"bytes\": %d, \"seconds\": %.3f, \"first_record_s\": %.3f}%n",
                records, bytes, seconds, (first - started) / 1e9);
        }
    }
}
