/*
 * fetchLogSegment through FetchLogSegmentFiles against a fake agent in this JVM that answers with chunk files of
 * a cache directory: exact bytes across windows and chunks, the next window only when the reader gets there,
 * every file closed, and the stream (FetchLogSegment) whenever the agent cannot answer with files; with
 * agent.fetch.files.reuse.ms, later fetches inside a recent answer's window read its files again, until it expires,
 * its segment is deleted or the plugin closes. Ranges with a check (the store's own file, no lease; cache files the
 * agent wrote and left for the adapter to check) have their chunk checked against its CRC32C before any byte is
 * served; a damaged chunk of the store's file is an error naming segment and chunk, a damaged cache file's range is
 * streamed instead (through the agent's own check, which drops and refetches it).
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.assertThrowsExactly;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Random;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;
import java.util.zip.CRC32C;

import com.google.protobuf.ByteString;

import io.grpc.Status;
import io.grpc.stub.StreamObserver;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import dev.tierlog.kafka.proto.Chunk;
import dev.tierlog.kafka.proto.ChunkCheck;
import dev.tierlog.kafka.proto.Empty;
import dev.tierlog.kafka.proto.FetchSegmentFilesRequest;
import dev.tierlog.kafka.proto.FetchSegmentRequest;
import dev.tierlog.kafka.proto.RemoteStorageGrpc;
import dev.tierlog.kafka.proto.SegmentFileRange;
import dev.tierlog.kafka.proto.SegmentFiles;
import dev.tierlog.kafka.proto.SegmentFilesLease;

@Timeout(60)
class SegmentFilesTest {
    private static final int CHUNK = 256 * 1024;
    private static final int WINDOW = 1024 * 1024;
    // Junk before each chunk's bytes in its file, so a range's offset matters.
    private static final int HEADER = 100;
    private static final byte[] SEGMENT = new byte[3 * 1024 * 1024 + 12_345];
    private static final TopicIdPartition TP = new TopicIdPartition(Uuid.randomUuid(), 0, "files");
    private static final RemoteLogSegmentMetadata METADATA = new RemoteLogSegmentMetadata(
        new RemoteLogSegmentId(TP, Uuid.randomUuid()), 0L, 99L, 1_700_000_000_000L, 0, 1_700_000_000_000L,
        SEGMENT.length, Optional.empty(), RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(0, 0L), false);

    static {
        new Random(27).nextBytes(SEGMENT);
    }

    @TempDir
    Path dir;
    private Path cache;
    // The segment as the store's own file (the filesystem backend's object): positions are file offsets.
    private Path storeFile;
    private FilesStorage storage;
    private FakeAgent.Running agent;
    private final List<TierlogRemoteStorageManager> plugins = new ArrayList<>();

    /** The agent's RemoteStorage: chunk files of {@link #cache}, with the faults a test switches on. */
    private final class FilesStorage extends RemoteStorageGrpc.RemoteStorageImplBase {
        final AtomicInteger filesCalls = new AtomicInteger();
        final AtomicInteger streamCalls = new AtomicInteger();
        final Set<String> leases = ConcurrentHashMap.newKeySet();
        final Set<String> released = ConcurrentHashMap.newKeySet();
        volatile boolean unimplemented;
        volatile boolean streamInstead;
        volatile boolean notFound;
        // Answer with the store's own file and each chunk's checksum, without a lease.
        volatile boolean fromStore;
        // Cache file ranges carry their chunk's checksum (files the agent wrote itself and did not read back).
        volatile boolean checkCacheFiles;
        // Answers left that name a file that is not there (an expired lease's evicted chunk).
        final AtomicInteger missingAnswers = new AtomicInteger();

        @Override
        public void fetchLogSegmentFiles(FetchSegmentFilesRequest request, StreamObserver<SegmentFiles> observer) {
            filesCalls.incrementAndGet();
            if (unimplemented) {
                super.fetchLogSegmentFiles(request, observer); // what an agent without the method answers
                return;
            }
            if (notFound) {
                observer.onError(Status.NOT_FOUND.withDescription("no such segment").asRuntimeException());
                return;
            }
            if (streamInstead) {
                answer(observer, SegmentFiles.newBuilder().setStreamInstead("no disk cache").build());
                return;
            }
            long start = request.getStartPosition();
            long last = Math.min(request.hasEndPosition() ? request.getEndPosition() : SEGMENT.length - 1,
                SEGMENT.length - 1);
            last = Math.min(last, start + request.getMaxBytes() - 1);
            boolean missing = missingAnswers.getAndUpdate(n -> Math.max(0, n - 1)) > 0;
            SegmentFiles.Builder files = SegmentFiles.newBuilder().setEndPosition(last);
            if (!fromStore) {
                files.setLeaseId(UUID.randomUUID().toString()).setLeaseMs(30_000);
            }
            for (long position = start; position <= last; ) {
                long chunk = position / CHUNK;
                long length = Math.min(last + 1, (chunk + 1) * CHUNK) - position;
                if (fromStore) {
                    int chunkLength = (int) Math.min(CHUNK, SEGMENT.length - chunk * CHUNK);
                    CRC32C crc = new CRC32C();
                    crc.update(SEGMENT, (int) chunk * CHUNK, chunkLength);
                    files.addRanges(SegmentFileRange.newBuilder().setPath(storeFile.toString()).setOffset(position)
                        .setLength(length).setCheck(ChunkCheck.newBuilder().setChunk((int) chunk)
                            .setOffset(chunk * CHUNK).setLength(chunkLength).setCrc32C((int) crc.getValue())));
                    position += length;
                    continue;
                }
                Path file = missing ? cache.resolve("evicted") : cache.resolve(String.valueOf(chunk));
                SegmentFileRange.Builder range = SegmentFileRange.newBuilder().setPath(file.toString())
                    .setOffset(HEADER + position - chunk * CHUNK).setLength(length);
                if (checkCacheFiles) {
                    int chunkLength = (int) Math.min(CHUNK, SEGMENT.length - chunk * CHUNK);
                    CRC32C crc = new CRC32C();
                    crc.update(SEGMENT, (int) chunk * CHUNK, chunkLength);
                    range.setCheck(ChunkCheck.newBuilder().setChunk((int) chunk).setOffset(HEADER)
                        .setLength(chunkLength).setCrc32C((int) crc.getValue()));
                }
                files.addRanges(range);
                position += length;
            }
            if (!fromStore) {
                leases.add(files.getLeaseId());
            }
            answer(observer, files.build());
        }

        @Override
        public void deleteLogSegmentData(dev.tierlog.kafka.proto.RemoteLogSegmentMetadata request,
                StreamObserver<Empty> observer) {
            answer(observer, Empty.getDefaultInstance());
        }

        @Override
        public void releaseSegmentFiles(SegmentFilesLease request, StreamObserver<Empty> observer) {
            released.add(request.getLeaseId());
            answer(observer, Empty.getDefaultInstance());
        }

        @Override
        public void fetchLogSegment(FetchSegmentRequest request, StreamObserver<Chunk> observer) {
            streamCalls.incrementAndGet();
            int end = request.hasEndPosition() ? request.getEndPosition() + 1 : SEGMENT.length;
            for (int at = request.getStartPosition(); at < end; at += 64 * 1024) {
                observer.onNext(Chunk.newBuilder()
                    .setData(ByteString.copyFrom(SEGMENT, at, Math.min(64 * 1024, end - at))).build());
            }
            observer.onCompleted();
        }
    }

    private static <T> void answer(StreamObserver<T> observer, T value) {
        observer.onNext(value);
        observer.onCompleted();
    }

    @BeforeEach
    void startAgent() throws IOException {
        cache = Files.createDirectories(dir.resolve("cache"));
        for (int chunk = 0; chunk * CHUNK < SEGMENT.length; chunk++) {
            byte[] file = new byte[HEADER + Math.min(CHUNK, SEGMENT.length - chunk * CHUNK)];
            Arrays.fill(file, 0, HEADER, (byte) 0x5a);
            System.arraycopy(SEGMENT, chunk * CHUNK, file, HEADER, file.length - HEADER);
            Files.write(cache.resolve(String.valueOf(chunk)), file);
        }
        storeFile = Files.write(dir.resolve("store.log"), SEGMENT);
        storage = new FilesStorage();
        agent = FakeAgent.serve(dir.resolve("a.sock"), storage);
    }

    @AfterEach
    void stop() throws Exception {
        for (TierlogRemoteStorageManager plugin : plugins) {
            plugin.close();
        }
        agent.close();
    }

    /** A plugin on the fake agent; answers are not reused unless an override sets agent.fetch.files.reuse.ms. */
    private TierlogRemoteStorageManager rsm(String... overrides) {
        Map<String, String> config = new HashMap<>(Map.of(
            "agent.socket.path", dir.resolve("a.sock").toString(),
            "agent.start", "false",
            "agent.fetch.files.window.bytes", String.valueOf(WINDOW),
            "agent.fetch.files.reuse.ms", "0"));
        for (int i = 0; i < overrides.length; i += 2) {
            config.put(overrides[i], overrides[i + 1]);
        }
        TierlogRemoteStorageManager rsm = new TierlogRemoteStorageManager();
        plugins.add(rsm);
        rsm.configure(config);
        return rsm;
    }

    /** Reads with an odd buffer size, so reads end inside chunks and windows. */
    private static byte[] readAll(InputStream in) throws IOException {
        try (in) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            byte[] buffer = new byte[7_777];
            for (int n; (n = in.read(buffer)) >= 0; ) {
                out.write(buffer, 0, n);
            }
            return out.toByteArray();
        }
    }

    private static byte[] segment(int from, int toInclusive) {
        return Arrays.copyOfRange(SEGMENT, from, toInclusive + 1);
    }

    /** Open descriptors of this process on the chunk files. */
    private long openChunkFiles() throws IOException {
        try (Stream<Path> fds = Files.list(Path.of("/proc/self/fd"))) {
            return fds.filter(fd -> {
                try {
                    return Files.readSymbolicLink(fd).startsWith(cache);
                } catch (IOException e) {
                    return false; // closed while listing
                }
            }).count();
        }
    }

    private void awaitAllReleased() throws InterruptedException {
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!storage.released.containsAll(storage.leases)) {
            assertTrue(System.nanoTime() < until, "leases never released: " + storage.leases);
            Thread.sleep(10);
        }
    }

    @Test
    void filesReturnExactBytesAcrossWindowsAndChunks() throws Exception {
        TierlogRemoteStorageManager rsm = rsm();
        int start = CHUNK / 2 + 3;
        assertArrayEquals(segment(start, SEGMENT.length - 1), readAll(rsm.fetchLogSegment(METADATA, start)));
        int windows = (SEGMENT.length - start + WINDOW - 1) / WINDOW;
        assertEquals(windows, storage.filesCalls.get());

        int end = 2 * WINDOW + CHUNK + 17;
        assertArrayEquals(segment(7, end), rsm.fetchLogSegment(METADATA, 7, end).readAllBytes());
        assertEquals(windows + 3, storage.filesCalls.get());
        // An end past the segment's last byte ends the read at it.
        assertArrayEquals(segment(SEGMENT.length - 10, SEGMENT.length - 1),
            readAll(rsm.fetchLogSegment(METADATA, SEGMENT.length - 10, SEGMENT.length + 100)));
        assertEquals(0, storage.streamCalls.get());
        awaitAllReleased();
    }

    @Test
    void aReaderThatStopsWithinTheFirstWindowCostsOneCall() throws Exception {
        try (InputStream in = rsm().fetchLogSegment(METADATA, 0)) {
            assertArrayEquals(segment(0, WINDOW - 1), in.readNBytes(WINDOW));
        }
        assertEquals(1, storage.filesCalls.get());
    }

    @Test
    void streamInsteadIsStreamedAndAskedAgainNextTime() throws Exception {
        storage.streamInstead = true;
        TierlogRemoteStorageManager rsm = rsm();
        assertArrayEquals(segment(5, SEGMENT.length - 1), readAll(rsm.fetchLogSegment(METADATA, 5)));
        assertArrayEquals(segment(5, 999), readAll(rsm.fetchLogSegment(METADATA, 5, 999)));
        assertEquals(2, storage.filesCalls.get());
        assertEquals(2, storage.streamCalls.get());
    }

    @Test
    void anAgentWithoutFilesIsStreamedFromAndNotAskedAgain() throws Exception {
        storage.unimplemented = true;
        TierlogRemoteStorageManager rsm = rsm();
        assertArrayEquals(segment(0, SEGMENT.length - 1), readAll(rsm.fetchLogSegment(METADATA, 0)));
        assertArrayEquals(segment(10, 20), readAll(rsm.fetchLogSegment(METADATA, 10, 20)));
        assertEquals(1, storage.filesCalls.get());
        assertEquals(2, storage.streamCalls.get());
    }

    @Test
    void aMissingFileIsAskedForOnceMoreThenStreamed() throws Exception {
        TierlogRemoteStorageManager rsm = rsm();
        storage.missingAnswers.set(1);
        assertArrayEquals(segment(0, 99_999), readAll(rsm.fetchLogSegment(METADATA, 0, 99_999)));
        assertEquals(2, storage.filesCalls.get());
        assertEquals(0, storage.streamCalls.get());

        storage.missingAnswers.set(2);
        assertArrayEquals(segment(0, 99_999), readAll(rsm.fetchLogSegment(METADATA, 0, 99_999)));
        assertEquals(4, storage.filesCalls.get());
        assertEquals(1, storage.streamCalls.get());
        awaitAllReleased(); // unopened answers' leases too
    }

    @Test
    void windowsAfterTheFirstMayTurnIntoAStream() throws Exception {
        try (InputStream in = rsm().fetchLogSegment(METADATA, 0)) {
            byte[] first = in.readNBytes(WINDOW);
            storage.streamInstead = true;
            assertArrayEquals(SEGMENT, concat(first, in.readAllBytes()));
        }
        assertEquals(2, storage.filesCalls.get());
        assertEquals(1, storage.streamCalls.get());
    }

    private static byte[] concat(byte[] a, byte[] b) {
        byte[] both = Arrays.copyOf(a, a.length + b.length);
        System.arraycopy(b, 0, both, a.length, b.length);
        return both;
    }

    @Test
    void everyFileIsClosedOnCloseOrAtTheEnd() throws Exception {
        TierlogRemoteStorageManager rsm = rsm();
        assertEquals(0, openChunkFiles());
        List<InputStream> open = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            InputStream in = rsm.fetchLogSegment(METADATA, 1000 + i);
            in.readNBytes(CHUNK + 5);
            open.add(in);
        }
        // One window of WINDOW bytes from an unaligned start spans five chunk files.
        assertEquals(3 * (WINDOW / CHUNK + 1), openChunkFiles());
        for (InputStream in : open) {
            in.close();
        }
        assertEquals(0, openChunkFiles());

        try (InputStream exhausted = rsm.fetchLogSegment(METADATA, 0)) {
            assertEquals(SEGMENT.length, exhausted.transferTo(OutputStream.nullOutputStream()));
            assertEquals(0, openChunkFiles(), "a stream read to its end keeps no file open");
        }
    }

    @Test
    void theSwitchTurnsFilesOff() throws Exception {
        assertArrayEquals(segment(1, 10), readAll(rsm("agent.fetch.files.enable", "false")
            .fetchLogSegment(METADATA, 1, 10)));
        assertEquals(0, storage.filesCalls.get());
        assertEquals(1, storage.streamCalls.get());
    }

    @Test
    void fetchesInsideARecentWindowReadItsFilesAgain() throws Exception {
        TierlogRemoteStorageManager rsm = rsm("agent.fetch.files.reuse.ms", "60000");
        // A consumer catching up: each broker fetch reads on from where the one before it stopped.
        int fetch = 100_000;
        for (int start = 0; start + fetch <= WINDOW; start += fetch) {
            try (InputStream in = rsm.fetchLogSegment(METADATA, start)) {
                assertArrayEquals(segment(start, start + fetch - 1), in.readNBytes(fetch));
            }
        }
        assertEquals(1, storage.filesCalls.get());
        // An end inside the window ends the read there; a read past the window's end asks for the next one.
        assertArrayEquals(segment(WINDOW - 50, WINDOW - 41), readAll(rsm.fetchLogSegment(METADATA, WINDOW - 50,
            WINDOW - 41)));
        assertArrayEquals(segment(WINDOW - 50, WINDOW + 49), readAll(rsm.fetchLogSegment(METADATA, WINDOW - 50,
            WINDOW + 49)));
        assertEquals(2, storage.filesCalls.get());
        // That answer ended at the read's end: a later fetch from inside it reads it, then asks on from its end.
        assertArrayEquals(segment(WINDOW + 7, 2 * WINDOW - 1), readAll(rsm.fetchLogSegment(METADATA, WINDOW + 7,
            2 * WINDOW - 1)));
        assertEquals(3, storage.filesCalls.get());
        assertArrayEquals(segment(WINDOW + 100, WINDOW + 200), readAll(rsm.fetchLogSegment(METADATA, WINDOW + 100,
            WINDOW + 200)));
        assertEquals(3, storage.filesCalls.get());
        assertEquals(0, storage.streamCalls.get());
    }

    @Test
    void aKeptWindowExpiresAndIsLetGoOnDeleteAndClose() throws Exception {
        TierlogRemoteStorageManager rsm = rsm("agent.fetch.files.reuse.ms", "200");
        readAll(rsm.fetchLogSegment(METADATA, 0, 10));
        Thread.sleep(300);
        readAll(rsm.fetchLogSegment(METADATA, 5, 10));
        assertEquals(2, storage.filesCalls.get(), "an answer older than agent.fetch.files.reuse.ms is asked again");

        plugins.remove(rsm);
        rsm.close();
        assertEquals(0, openChunkFiles());

        TierlogRemoteStorageManager kept = rsm("agent.fetch.files.reuse.ms", "60000");
        readAll(kept.fetchLogSegment(METADATA, 0, 10));
        assertEquals(1, openChunkFiles(), "the answer's file stays open for the next fetch");
        kept.deleteLogSegmentData(METADATA);
        assertEquals(0, openChunkFiles(), "a deleted segment's files are let go");
        readAll(kept.fetchLogSegment(METADATA, 0, 10));
        assertEquals(4, storage.filesCalls.get(), "asked again after the delete");
        InputStream reading = kept.fetchLogSegment(METADATA, WINDOW + 3, WINDOW + 100);
        assertEquals(5, storage.filesCalls.get());
        assertEquals(2, openChunkFiles());
        kept.close();
        assertEquals(1, openChunkFiles(), "a stream reading a kept window keeps its files");
        assertArrayEquals(segment(WINDOW + 3, WINDOW + 100), readAll(reading));
        assertEquals(0, openChunkFiles());
    }

    @Test
    void theStoresOwnFileIsCheckedAndReadWithoutALease() throws Exception {
        storage.fromStore = true;
        TierlogRemoteStorageManager rsm = rsm();
        int start = CHUNK + 5;
        assertArrayEquals(segment(start, SEGMENT.length - 1), readAll(rsm.fetchLogSegment(METADATA, start)));
        assertEquals((SEGMENT.length - start + WINDOW - 1) / WINDOW, storage.filesCalls.get());
        assertTrue(storage.released.isEmpty(), "nothing to release: " + storage.released);
        assertEquals(0, storage.streamCalls.get());
    }

    @Test
    void aDamagedChunkOfTheStoresFileIsAnErrorNamingSegmentAndChunkNeverBytes() throws Exception {
        storage.fromStore = true;
        TierlogRemoteStorageManager rsm = rsm();
        flip(2 * CHUNK + 10); // chunk 2, in the first window
        RemoteStorageException first = assertThrowsExactly(RemoteStorageException.class,
            () -> rsm.fetchLogSegment(METADATA, 0));
        assertTrue(first.getMessage().contains("segment " + METADATA.remoteLogSegmentId().id() + " chunk 2 ")
            && first.getMessage().contains("fails its CRC32C"), first.getMessage());
        // Other chunks are served.
        assertArrayEquals(segment(WINDOW, WINDOW + 99), rsm.fetchLogSegment(METADATA, WINDOW, WINDOW + 99)
            .readAllBytes());
        // A reader reaching a damaged chunk in a later window fails there.
        flip(2 * CHUNK + 10);
        flip(5 * CHUNK + 7);
        try (InputStream in = rsm.fetchLogSegment(METADATA, 0)) {
            assertArrayEquals(segment(0, WINDOW - 1), in.readNBytes(WINDOW));
            IOException later = assertThrows(IOException.class, in::read);
            assertTrue(later.getMessage().contains(" chunk 5 "), later.getMessage());
        }
        assertEquals(0, storage.streamCalls.get());
    }

    @Test
    void aDamagedCacheFileLeftForTheAdaptersCheckIsStreamedInsteadNeverServed() throws Exception {
        storage.checkCacheFiles = true;
        TierlogRemoteStorageManager rsm = rsm();
        assertArrayEquals(SEGMENT, readAll(rsm.fetchLogSegment(METADATA, 0)));
        assertEquals(0, storage.streamCalls.get());
        Path victim = cache.resolve("5"); // chunk 5, in the second window
        byte[] bytes = Files.readAllBytes(victim);
        bytes[HEADER + 7] ^= 1;
        Files.write(victim, bytes);
        assertArrayEquals(SEGMENT, readAll(rsm.fetchLogSegment(METADATA, 0)));
        assertEquals(1, storage.streamCalls.get());
        awaitAllReleased();
        assertEquals(0, openChunkFiles());
    }

    private void flip(long position) throws IOException {
        byte[] bytes = Files.readAllBytes(storeFile);
        bytes[(int) position] ^= 1;
        Files.write(storeFile, bytes);
    }

    @Test
    void aMissingSegmentIsKafkasNotFound() {
        storage.notFound = true;
        TierlogRemoteStorageManager rsm = rsm();
        assertThrows(RemoteResourceNotFoundException.class, () -> rsm.fetchLogSegment(METADATA, 0));
    }
}
