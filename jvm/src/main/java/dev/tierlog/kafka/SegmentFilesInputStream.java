/*
 * An InputStream over a range of a segment read from the agent's chunk cache files instead of a gRPC byte stream:
 * each FetchLogSegmentFiles answer (a window) is a list of open file ranges, read in order with positional reads
 * into the caller's buffer. The next window is asked for only when the reader gets past this one, and the rest of
 * the range turns into a FetchLogSegment stream when the agent cannot answer it with files.
 */
package dev.tierlog.kafka;

import java.io.Closeable;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.util.List;

final class SegmentFilesInputStream extends InputStream {
    /** One file's part of the range: {@code length} bytes from {@code offset} of the open {@code channel}. */
    record OpenRange(FileChannel channel, String path, long offset, long length) {
    }

    /** What the range continues with from some position. */
    sealed interface Window permits Files, Streamed {
    }

    /** Open files covering positions up to {@code endPosition} (inclusive), let go by closing {@code holder}. */
    record Files(List<OpenRange> ranges, long endPosition, Closeable holder) implements Window {
    }

    /** A stream of the rest of the range. */
    record Streamed(InputStream stream) implements Window {
    }

    /** Asks the agent for the window starting at a segment position. */
    @FunctionalInterface
    interface Windows {
        Window from(long position) throws IOException;
    }

    private final String what;
    private final long lastPosition;
    private final Windows windows;
    private final byte[] one = new byte[1];
    private List<OpenRange> ranges = List.of();
    private Closeable holder;
    private int index;
    private long readInRange;
    private long nextPosition;
    private InputStream streamed;
    private boolean closed;

    /** Reads {@code first}, then the windows after it, up to {@code lastPosition} (inclusive). */
    SegmentFilesInputStream(String what, Window first, long lastPosition, Windows windows) {
        this.what = what;
        this.lastPosition = lastPosition;
        this.windows = windows;
        adopt(first);
    }

    private void adopt(Window window) {
        if (window instanceof Files files) {
            ranges = files.ranges();
            holder = files.holder();
            index = 0;
            readInRange = 0;
            nextPosition = files.endPosition() + 1;
        } else {
            streamed = ((Streamed) window).stream();
        }
    }

    @Override
    public int read() throws IOException {
        int n = read(one, 0, 1);
        return n < 0 ? -1 : one[0] & 0xff;
    }

    @Override
    public int read(byte[] b, int off, int len) throws IOException {
        if (closed) {
            throw new IOException(what + ": stream is closed");
        }
        if (len == 0) {
            return 0;
        }
        while (true) {
            if (streamed != null) {
                return streamed.read(b, off, len);
            }
            if (index < ranges.size()) {
                OpenRange range = ranges.get(index);
                if (readInRange == range.length()) {
                    index++;
                    readInRange = 0;
                    continue;
                }
                int want = (int) Math.min(len, range.length() - readInRange);
                int n = range.channel().read(ByteBuffer.wrap(b, off, want), range.offset() + readInRange);
                if (n < 0) {
                    throw new IOException(what + ": chunk cache file " + range.path() + " ends before byte "
                        + (range.offset() + range.length()) + " of the range the tierlog agent answered");
                }
                readInRange += n;
                return n;
            }
            closeWindow();
            if (nextPosition > lastPosition) {
                return -1;
            }
            adopt(windows.from(nextPosition));
        }
    }

    @Override
    public int available() throws IOException {
        if (closed) {
            return 0;
        }
        if (streamed != null) {
            return streamed.available();
        }
        return index < ranges.size() ? (int) Math.min(Integer.MAX_VALUE, ranges.get(index).length() - readInRange) : 0;
    }

    /** Lets go of the current window's files. */
    private void closeWindow() throws IOException {
        Closeable held = holder;
        ranges = List.of();
        holder = null;
        index = 0;
        if (held != null) {
            held.close();
        }
    }

    @Override
    public void close() throws IOException {
        if (closed) {
            return;
        }
        closed = true;
        try {
            closeWindow();
        } finally {
            if (streamed != null) {
                streamed.close();
            }
        }
    }
}
