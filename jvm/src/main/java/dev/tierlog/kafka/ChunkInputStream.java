/*
 * An InputStream over a server-streaming gRPC call of Chunks. The blocking iterator requests one message
 * at a time, so the agent sends no faster than the broker reads; close() cancels the call.
 */
package dev.tierlog.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.util.Iterator;

import com.google.protobuf.ByteString;

import io.grpc.Context;
import io.grpc.StatusRuntimeException;

import dev.tierlog.kafka.proto.Chunk;

final class ChunkInputStream extends InputStream {
    private final String what;
    private final Context.CancellableContext context;
    private final Iterator<Chunk> chunks;
    private ByteString current = ByteString.EMPTY;
    private int position;
    private boolean closed;

    /** {@code chunks} must have been started inside {@code context}, so cancelling it ends the call. */
    ChunkInputStream(String what, Context.CancellableContext context, Iterator<Chunk> chunks) {
        this.what = what;
        this.context = context;
        this.chunks = chunks;
    }

    private boolean fill() throws IOException {
        if (closed) {
            throw new IOException(what + ": stream is closed");
        }
        while (position >= current.size()) {
            try {
                if (!chunks.hasNext()) {
                    return false;
                }
                current = chunks.next().getData();
            } catch (StatusRuntimeException e) {
                throw new IOException(what + " failed in the tierlog agent: " + e.getStatus(), e);
            }
            position = 0;
        }
        return true;
    }

    @Override
    public int read() throws IOException {
        if (!fill()) {
            return -1;
        }
        return current.byteAt(position++) & 0xff;
    }

    @Override
    public int read(byte[] b, int off, int len) throws IOException {
        if (len == 0) {
            return 0;
        }
        if (!fill()) {
            return -1;
        }
        int n = Math.min(len, current.size() - position);
        current.copyTo(b, position, off, n);
        position += n;
        return n;
    }

    @Override
    public int available() {
        return closed ? 0 : current.size() - position;
    }

    @Override
    public void close() {
        if (!closed) {
            closed = true;
            context.cancel(null);
        }
    }
}
