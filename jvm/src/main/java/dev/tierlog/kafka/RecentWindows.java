/*
 * The open chunk cache files of recent FetchLogSegmentFiles answers, kept for a short while so that the broker's next
 * fetch of the same segment reads them again without asking the agent. A consumer catching up asks for about a
 * megabyte per fetch, each a fetchLogSegment call from a position inside the window the call before it was answered
 * with (8 MiB): one call to the agent per window instead of one per broker fetch.
 *
 * What makes reuse safe: the agent checked each file's chunk against its checksum just before answering, the cache
 * never changes a file in place (it writes a new file and renames it over), and an open file keeps its bytes when the
 * cache evicts it. So an open window reads the bytes that were checked. It is reused for at most
 * agent.fetch.files.reuse.ms after the check, and a deleted segment's windows are let go at once.
 */
package dev.tierlog.kafka;

import java.io.Closeable;
import java.io.IOException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.function.LongSupplier;

import org.apache.kafka.common.Uuid;

final class RecentWindows implements Closeable {
    /** One answer's open files, covering segment positions {@code start..end}, shared by the streams reading them. */
    static final class Shared implements Closeable {
        final Uuid segment;
        final long start;
        final long end;
        final long checkedNanos;
        private final String what;
        private final List<SegmentFilesInputStream.OpenRange> ranges;
        private int holders = 1; // the stream the answer was asked for; guarded by this

        Shared(String what, Uuid segment, long start, long end, List<SegmentFilesInputStream.OpenRange> ranges,
                long checkedNanos) {
            this.what = what;
            this.segment = segment;
            this.start = start;
            this.end = end;
            this.ranges = List.copyOf(ranges);
            this.checkedNanos = checkedNanos;
        }

        /** One more holder; false if the files are closed already. */
        synchronized boolean acquire() {
            if (holders == 0) {
                return false;
            }
            holders++;
            return true;
        }

        /** A holder lets go; the last one closes the files (all of them, reporting the first failure). */
        @Override
        public void close() throws IOException {
            synchronized (this) {
                if (holders == 0 || --holders > 0) {
                    return;
                }
            }
            IOException failure = null;
            for (SegmentFilesInputStream.OpenRange range : ranges) {
                try {
                    range.channel().close();
                } catch (IOException e) {
                    if (failure == null) {
                        failure = new IOException(what + ": closing chunk cache file " + range.path() + " failed", e);
                    } else {
                        failure.addSuppressed(e);
                    }
                }
            }
            if (failure != null) {
                throw failure;
            }
        }

        /** The window's files for positions {@code from..min(end, last)}, held by the caller until it closes it. */
        SegmentFilesInputStream.Files files(long from, long last) {
            long upTo = Math.min(end, last);
            long skip = from - start;
            long left = upTo - from + 1;
            List<SegmentFilesInputStream.OpenRange> slice = new ArrayList<>();
            for (SegmentFilesInputStream.OpenRange range : ranges) {
                if (left == 0) {
                    break;
                }
                if (skip >= range.length()) {
                    skip -= range.length();
                    continue;
                }
                long length = Math.min(range.length() - skip, left);
                slice.add(new SegmentFilesInputStream.OpenRange(range.channel(), range.path(), range.offset() + skip,
                    length));
                left -= length;
                skip = 0;
            }
            return new SegmentFilesInputStream.Files(List.copyOf(slice), upTo, this);
        }
    }

    private final int maxWindows;
    private final long reuseNanos;
    private final LongSupplier nanoClock;
    private final ArrayDeque<Shared> windows = new ArrayDeque<>(); // newest first; guarded by this

    /** Keeps at most {@code maxWindows} answers, each reused for {@code reuseMs} after it was checked (0: never). */
    RecentWindows(int maxWindows, long reuseMs, LongSupplier nanoClock) {
        this.maxWindows = maxWindows;
        this.reuseNanos = reuseMs * 1_000_000L;
        this.nanoClock = nanoClock;
    }

    boolean enabled() {
        return reuseNanos > 0 && maxWindows > 0;
    }

    /** A kept answer of {@code segment} holding {@code position}, for positions up to {@code last}; null if none. */
    SegmentFilesInputStream.Files reuse(Uuid segment, long position, long last) throws IOException {
        if (!enabled()) {
            return null;
        }
        List<Shared> expired = new ArrayList<>();
        SegmentFilesInputStream.Files found = null;
        synchronized (this) {
            long now = nanoClock.getAsLong();
            for (Iterator<Shared> it = windows.iterator(); it.hasNext(); ) {
                Shared window = it.next();
                if (now - window.checkedNanos >= reuseNanos) {
                    it.remove();
                    expired.add(window);
                } else if (found == null && window.segment.equals(segment) && window.start <= position
                        && position <= window.end && window.acquire()) {
                    found = window.files(position, last);
                }
            }
        }
        closeAll(expired);
        return found;
    }

    /** Keep a new answer (the caller keeps its own hold), letting go of the oldest beyond the bound. */
    void keep(Shared window) throws IOException {
        if (!enabled() || !window.acquire()) {
            return;
        }
        List<Shared> dropped = new ArrayList<>();
        synchronized (this) {
            windows.addFirst(window);
            while (windows.size() > maxWindows) {
                dropped.add(windows.removeLast());
            }
        }
        closeAll(dropped);
    }

    /** Let go of every kept answer of a segment (deleted). */
    void forget(Uuid segment) throws IOException {
        List<Shared> dropped = new ArrayList<>();
        synchronized (this) {
            windows.removeIf(window -> window.segment.equals(segment) && dropped.add(window));
        }
        closeAll(dropped);
    }

    @Override
    public void close() throws IOException {
        List<Shared> dropped;
        synchronized (this) {
            dropped = new ArrayList<>(windows);
            windows.clear();
        }
        closeAll(dropped);
    }

    private static void closeAll(List<Shared> windows) throws IOException {
        IOException failure = null;
        for (Shared window : windows) {
            try {
                window.close();
            } catch (IOException e) {
                if (failure == null) {
                    failure = e;
                } else {
                    failure.addSuppressed(e);
                }
            }
        }
        if (failure != null) {
            throw failure;
        }
    }
}
