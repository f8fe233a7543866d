/*
 * Recent answers of the broker's fetch-path lookup remoteLogSegmentMetadata(tp, epoch, offset), kept for
 * agent.rlmm.lookup.cache.ms. Kafka's RemoteLogManager asks it on every remote fetch, about 1 MiB each, so a consumer
 * catching up asks the agent for the same segment some sixteen times per 16 MiB segment; one answer holds for a whole
 * range of offsets, so the adapter asks once per segment and epoch (and again after the bound).
 *
 * The range an answer holds for, as the rlmm decides it (KAFKA_SEMANTICS.md, "Queries"): the segment returned for
 * (epoch, offset) is the floor entry of offset among the epoch's segments, if offset is at most the segment's end for
 * that epoch. So for that epoch it is the answer from the epoch's first offset in the segment to the next epoch's
 * first offset - 1, or the segment's end offset when the epoch is the segment's last: the segment's epoch map gives
 * both, and nothing but a metadata write can change it.
 *
 * Why an answer up to the bound old is within the contract: see jvm/README.md, "Segment lookups". In short, Kafka's
 * own TopicBasedRemoteLogMetadataManager answers from a view that trails the metadata topic too (on every broker for
 * other brokers' writes), while this broker's own writes through this adapter drop the partition's answers at once,
 * when submitted and again when the agent has applied them.
 */
package dev.tierlog.kafka;

import java.util.ArrayDeque;
import java.util.Iterator;
import java.util.Map;
import java.util.NavigableMap;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.LongSupplier;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;

final class SegmentLookupCache {
    /** Answers kept per partition: a reader or two at different places in the partition, each crossing a segment. */
    static final int ANSWERS_PER_PARTITION = 8;

    /** One answer and the offsets of {@code epoch} it holds for: {@code first..last}. */
    private record Answer(int epoch, long first, long last, RemoteLogSegmentMetadata segment, long expiresNanos) {
        boolean holds(int e, long offset) {
            return epoch == e && first <= offset && offset <= last;
        }
    }

    private final long ttlNanos;
    private final LongSupplier nanoClock;
    // Per partition, the most recent answer first; each deque is guarded by itself.
    private final Map<TopicIdPartition, ArrayDeque<Answer>> answers = new ConcurrentHashMap<>();
    // Counts invalidations: an answer asked for before one (read by stamp()) is not kept, it may predate a write.
    private final AtomicLong writes = new AtomicLong();

    SegmentLookupCache(long ttlMs, LongSupplier nanoClock) {
        this.ttlNanos = TimeUnit.MILLISECONDS.toNanos(ttlMs);
        this.nanoClock = nanoClock;
    }

    boolean enabled() {
        return ttlNanos > 0;
    }

    /** The kept answer for (tp, epoch, offset), if one holds and has not expired. */
    Optional<RemoteLogSegmentMetadata> get(TopicIdPartition tp, int epoch, long offset) {
        ArrayDeque<Answer> kept = answers.get(tp);
        if (kept == null) {
            return Optional.empty();
        }
        long now = nanoClock.getAsLong();
        synchronized (kept) {
            for (Iterator<Answer> it = kept.iterator(); it.hasNext(); ) {
                Answer answer = it.next();
                if (now - answer.expiresNanos() >= 0) {
                    it.remove();
                } else if (answer.holds(epoch, offset)) {
                    return Optional.of(answer.segment());
                }
            }
        }
        return Optional.empty();
    }

    /** Taken before asking the agent, handed to {@link #put}: an invalidation in between discards the answer. */
    long stamp() {
        return writes.get();
    }

    /**
     * Keeps the agent's answer to (tp, epoch, offset), asked for after {@code stamp} was taken, for the offsets of
     * {@code epoch} it holds for. Not kept: no segment (nothing to hold a range), an answer whose epoch map does not
     * cover (epoch, offset) (the rlmm never gives one), or one that a write may have made stale meanwhile.
     */
    void put(TopicIdPartition tp, int epoch, long offset, RemoteLogSegmentMetadata segment, long stamp) {
        if (!enabled()) {
            return;
        }
        NavigableMap<Integer, Long> epochs = segment.segmentLeaderEpochs();
        Long epochStart = epochs.get(epoch);
        if (epochStart == null) {
            return;
        }
        Map.Entry<Integer, Long> next = epochs.higherEntry(epoch);
        long first = Math.max(epochStart, segment.startOffset());
        long last = next == null ? segment.endOffset() : Math.min(next.getValue() - 1, segment.endOffset());
        if (offset < first || offset > last) {
            return;
        }
        Answer answer = new Answer(epoch, first, last, segment, nanoClock.getAsLong() + ttlNanos);
        // compute() serializes with invalidate() of the same partition: either the write's invalidation comes after
        // this and removes the answer, or it came before and changed the stamp.
        answers.compute(tp, (key, kept) -> {
            if (writes.get() != stamp) {
                return kept;
            }
            ArrayDeque<Answer> deque = kept == null ? new ArrayDeque<>() : kept;
            synchronized (deque) {
                deque.removeIf(a -> a.holds(epoch, offset));
                deque.addFirst(answer);
                while (deque.size() > ANSWERS_PER_PARTITION) {
                    deque.removeLast();
                }
            }
            return deque;
        });
    }

    /** Drops every answer of {@code tp}: a metadata write for it went through this adapter. */
    void invalidate(TopicIdPartition tp) {
        answers.compute(tp, (key, kept) -> {
            writes.incrementAndGet();
            return null;
        });
    }

    /** Drops every answer (leadership changes, close). */
    void invalidateAll() {
        writes.incrementAndGet();
        answers.clear();
    }
}
