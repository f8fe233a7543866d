/*
 * The check the adapter makes before serving a range of a segment's file that the agent did not check itself: an
 * untransformed segment of a store of local files (the filesystem backend) is answered with the store's own file,
 * and each range with the position and CRC32C of the whole chunk it lies in (rsm/README.md, "Segment bytes as
 * files"). The adapter reads that chunk from the file it opened and compares its CRC32C (java.util.zip.CRC32C,
 * an intrinsic) before any of its bytes are served; the bytes read are then those of the open file, which the store
 * never changes in place (it writes a new file and renames it over).
 */
package dev.tierlog.kafka;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.util.zip.CRC32C;

import dev.tierlog.kafka.proto.ChunkCheck;

final class ChunkChecks {
    // Read in pieces of this size into a direct buffer per thread (the broker's remote read threads), so checking a
    // chunk holds no chunk-sized array.
    private static final int PIECE_BYTES = 256 * 1024;
    private static final ThreadLocal<ByteBuffer> PIECES =
        ThreadLocal.withInitial(() -> ByteBuffer.allocateDirect(PIECE_BYTES));

    private ChunkChecks() {
    }

    /**
     * Null if the {@code check.length} bytes at {@code check.offset} of {@code channel} have CRC32C
     * {@code check.crc32c}; else why not, naming the segment and the chunk. Throws IOException if the file cannot
     * be read.
     */
    static String damage(String segment, String path, FileChannel channel, ChunkCheck check) throws IOException {
        ByteBuffer piece = PIECES.get();
        CRC32C crc = new CRC32C();
        long position = check.getOffset();
        long end = check.getOffset() + check.getLength();
        while (position < end) {
            piece.clear().limit((int) Math.min(PIECE_BYTES, end - position));
            int n = channel.read(piece, position);
            if (n < 0) {
                return describe(segment, path, check, "the file ends at byte " + position);
            }
            piece.flip();
            crc.update(piece);
            position += n;
        }
        if ((int) crc.getValue() != check.getCrc32C()) {
            return describe(segment, path, check, "it fails its CRC32C checksum");
        }
        return null;
    }

    private static String describe(String segment, String path, ChunkCheck check, String why) {
        return "segment " + segment + " chunk " + check.getChunk() + " (bytes " + check.getOffset() + "-"
            + (check.getOffset() + check.getLength() - 1) + " of " + path + ") is damaged: " + why
            + "; its bytes are not served. Copy the segment again from a replica that still has it, or delete it";
    }
}
