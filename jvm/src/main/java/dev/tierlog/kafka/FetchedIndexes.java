/*
 * Indexes of a segment the adapter fetched together and the broker has not asked for yet. Kafka's RemoteIndexCache
 * asks for a segment's OFFSET, TIMESTAMP and TRANSACTION indexes one call at a time (and a follower building its
 * state for LEADER_EPOCH and PRODUCER_SNAPSHOT); the adapter asks the agent once for the whole group (FetchIndexes)
 * and keeps the rest here until the broker's next calls take them. Each is served once: the broker keeps what it was
 * given in its own cache, so a later call for the same index is a miss that asks the agent again. Bounded in bytes
 * (oldest let go first); a deleted segment's are dropped.
 */
package dev.tierlog.kafka;

import java.util.ArrayList;
import java.util.EnumSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;

final class FetchedIndexes {
    /** One fetched index: its bytes, or null when the segment has none of that type. */
    record Index(byte[] data) {
        boolean absent() {
            return data == null;
        }

        long bytes() {
            return data == null ? 0 : data.length;
        }
    }

    private record Key(Uuid segment, IndexType type) {
    }

    /** The indexes fetched together, as the rsm reads them together (packed_index.READ_GROUPS). */
    private static final List<Set<IndexType>> GROUPS = List.of(
        EnumSet.of(IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.TRANSACTION),
        EnumSet.of(IndexType.LEADER_EPOCH, IndexType.PRODUCER_SNAPSHOT));

    private final long maxBytes;
    private final int maxEntries;
    private final LinkedHashMap<Key, Index> entries = new LinkedHashMap<>(); // oldest first; guarded by this
    private long bytes; // guarded by this

    /** Keeps at most {@code maxBytes} of index bytes and {@code maxEntries} indexes. */
    FetchedIndexes(long maxBytes, int maxEntries) {
        this.maxBytes = maxBytes;
        this.maxEntries = maxEntries;
    }

    /** The types fetched together with {@code type}, {@code type} first. */
    static List<IndexType> groupOf(IndexType type) {
        List<IndexType> types = new ArrayList<>(List.of(type));
        for (Set<IndexType> group : GROUPS) {
            if (group.contains(type)) {
                group.stream().filter(t -> t != type).forEach(types::add);
            }
        }
        return types;
    }

    /** The kept index, removed from here; null if none is kept. */
    synchronized Index take(Uuid segment, IndexType type) {
        Index found = entries.remove(new Key(segment, type));
        if (found != null) {
            bytes -= found.bytes();
        }
        return found;
    }

    /** Keeps the fetched indexes of a segment other than the one served, letting go of the oldest beyond bounds. */
    synchronized void keep(Uuid segment, Map<IndexType, Index> fetched, IndexType served) {
        for (Map.Entry<IndexType, Index> e : fetched.entrySet()) {
            if (e.getKey() == served || e.getValue().bytes() > maxBytes) {
                continue;
            }
            Index previous = entries.put(new Key(segment, e.getKey()), e.getValue());
            bytes += e.getValue().bytes() - (previous == null ? 0 : previous.bytes());
        }
        Iterator<Map.Entry<Key, Index>> oldest = entries.entrySet().iterator();
        while ((bytes > maxBytes || entries.size() > maxEntries) && oldest.hasNext()) {
            bytes -= oldest.next().getValue().bytes();
            oldest.remove();
        }
    }

    /** Drops a deleted segment's kept indexes. */
    synchronized void forget(Uuid segment) {
        entries.entrySet().removeIf(e -> {
            if (e.getKey().segment().equals(segment)) {
                bytes -= e.getValue().bytes();
                return true;
            }
            return false;
        });
    }

    synchronized long bytes() {
        return bytes;
    }

    synchronized int size() {
        return entries.size();
    }
}
