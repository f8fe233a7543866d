/*
 * SegmentLookupCache on a clock of the test's: an answer holds exactly for its epoch's offsets in the segment (the
 * epoch map's boundaries), expires after the bound, is dropped by an invalidation (also one that raced with the
 * lookup), keeps only the last answers per partition, and nothing is kept when the bound is 0.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.junit.jupiter.api.Test;

class SegmentLookupCacheTest {
    private static final long TTL_MS = 1_000;
    private static final TopicIdPartition TP = new TopicIdPartition(Uuid.randomUuid(), 0, "lookups");
    private static final TopicIdPartition OTHER = new TopicIdPartition(Uuid.randomUuid(), 1, "lookups");
    // Offsets 100..299 written in epochs 3 (100..149), 5 (150..249) and 6 (250..299).
    private static final RemoteLogSegmentMetadata MULTI_EPOCH =
        segment(TP, 100, 299, Map.of(3, 100L, 5, 150L, 6, 250L));

    private final AtomicLong now = new AtomicLong(1_000_000_000L);
    private final SegmentLookupCache cache = new SegmentLookupCache(TTL_MS, now::get);

    static RemoteLogSegmentMetadata segment(TopicIdPartition tp, long start, long end, Map<Integer, Long> epochs) {
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(tp, Uuid.randomUuid()), start, end,
            1_700_000_000_000L, 0, 1_700_000_000_000L, 1024, Optional.empty(),
            RemoteLogSegmentState.COPY_SEGMENT_FINISHED, epochs, false);
    }

    private boolean hit(TopicIdPartition tp, int epoch, long offset) {
        return cache.get(tp, epoch, offset).isPresent();
    }

    @Test
    void aMiddleEpochsAnswerHoldsFromItsStartToTheNextEpochsStartMinusOne() {
        cache.put(TP, 5, 200, MULTI_EPOCH, cache.stamp());
        assertEquals(Optional.of(MULTI_EPOCH), cache.get(TP, 5, 150));
        assertTrue(hit(TP, 5, 249));
        assertFalse(hit(TP, 5, 149), "before epoch 5 began");
        assertFalse(hit(TP, 5, 250), "epoch 6's first offset");
        assertFalse(hit(TP, 3, 120), "another epoch, though inside the segment");
        assertFalse(hit(TP, 6, 260), "another epoch, though inside the segment");
        assertFalse(hit(OTHER, 5, 200), "another partition");
    }

    @Test
    void theLastEpochsAnswerHoldsToTheSegmentsEndAndTheFirstFromItsStart() {
        cache.put(TP, 6, 250, MULTI_EPOCH, cache.stamp());
        assertTrue(hit(TP, 6, 299));
        assertFalse(hit(TP, 6, 300), "past the segment's end offset");
        cache.put(TP, 3, 149, MULTI_EPOCH, cache.stamp());
        assertTrue(hit(TP, 3, 100));
        assertFalse(hit(TP, 3, 99), "before the segment");
        assertFalse(hit(TP, 3, 150));
    }

    @Test
    void anAnswerThatDoesNotCoverTheQueryIsNotKept() {
        cache.put(TP, 4, 160, MULTI_EPOCH, cache.stamp()); // epoch 4 is not in the segment
        cache.put(TP, 5, 260, MULTI_EPOCH, cache.stamp()); // offset past epoch 5's end
        assertFalse(hit(TP, 4, 160));
        assertFalse(hit(TP, 5, 200));
    }

    @Test
    void anAnswerExpiresAfterTheBound() {
        cache.put(TP, 5, 200, MULTI_EPOCH, cache.stamp());
        now.addAndGet(TimeUnit.MILLISECONDS.toNanos(TTL_MS) - 1);
        assertTrue(hit(TP, 5, 200));
        now.addAndGet(1);
        assertFalse(hit(TP, 5, 200));
    }

    @Test
    void invalidatingAPartitionDropsItsAnswersOnly() {
        RemoteLogSegmentMetadata other = segment(OTHER, 0, 99, Map.of(0, 0L));
        cache.put(TP, 5, 200, MULTI_EPOCH, cache.stamp());
        cache.put(OTHER, 0, 50, other, cache.stamp());
        cache.invalidate(TP);
        assertFalse(hit(TP, 5, 200));
        assertTrue(hit(OTHER, 0, 50));
        cache.invalidateAll();
        assertFalse(hit(OTHER, 0, 50));
    }

    @Test
    void anAnswerAskedForBeforeAnInvalidationIsNotKept() {
        long stamp = cache.stamp(); // the lookup asks the agent ...
        cache.invalidate(TP); // ... while a write for the partition goes through
        cache.put(TP, 5, 200, MULTI_EPOCH, stamp);
        assertFalse(hit(TP, 5, 200));
    }

    @Test
    void onlyTheLastAnswersOfAPartitionAreKept() {
        int segments = SegmentLookupCache.ANSWERS_PER_PARTITION + 1;
        for (int i = 0; i < segments; i++) {
            cache.put(TP, 0, i * 100L, segment(TP, i * 100L, i * 100L + 99, Map.of(0, i * 100L)), cache.stamp());
        }
        assertFalse(hit(TP, 0, 0), "the oldest answer made room");
        for (int i = 1; i < segments; i++) {
            assertTrue(hit(TP, 0, i * 100L + 50));
        }
    }

    @Test
    void aBoundOfZeroKeepsNothing() {
        SegmentLookupCache off = new SegmentLookupCache(0, now::get);
        assertFalse(off.enabled());
        off.put(TP, 5, 200, MULTI_EPOCH, off.stamp());
        assertFalse(off.get(TP, 5, 200).isPresent());
    }
}
