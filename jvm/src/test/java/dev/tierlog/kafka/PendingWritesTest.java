/*
 * The RLMM's write queue: a write's deadline runs from its submission, and close() releases every broker thread
 * waiting on a write, queued or running.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

class PendingWritesTest {

    /** A write that holds its pool thread until released (or interrupted). */
    private static PendingWrites.Write blocking(CountDownLatch started, CountDownLatch release) {
        return deadline -> {
            started.countDown();
            try {
                release.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        };
    }

    @Test
    @Timeout(value = 20, unit = TimeUnit.SECONDS)
    void aQueuedWriteFailsAtItsDeadlineCountedFromSubmission() throws Exception {
        CountDownLatch started = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        try (PendingWrites writes = new PendingWrites("test RLMM", 1)) {
            writes.submit("busy", 60_000, blocking(started, release));
            assertTrue(started.await(5, TimeUnit.SECONDS));
            long submitted = System.nanoTime();
            CompletableFuture<Void> queued = writes.submit("queued", 300, deadline -> { });
            ExecutionException e = assertThrows(ExecutionException.class, () -> queued.get(10, TimeUnit.SECONDS));
            long waitedMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - submitted);
            assertInstanceOf(RemoteStorageException.class, e.getCause());
            assertTrue(e.getCause().getMessage().contains("queued"), e.getCause().getMessage());
            // The only thread is still busy: the old pool started the clock when a thread took the write.
            assertTrue(waitedMs < 5_000, "waited " + waitedMs + " ms");
            release.countDown();
        }
    }

    @Test
    @Timeout(value = 20, unit = TimeUnit.SECONDS)
    void aWriteRunsWithTheDeadlineSetAtSubmission() throws Exception {
        try (PendingWrites writes = new PendingWrites("test RLMM", 1)) {
            List<Long> remainingMs = new ArrayList<>();
            writes.submit("w", 10_000, deadline -> remainingMs.add(deadline.timeRemaining(TimeUnit.MILLISECONDS)))
                .get(5, TimeUnit.SECONDS);
            assertEquals(1, remainingMs.size());
            assertTrue(remainingMs.get(0) <= 10_000 && remainingMs.get(0) > 5_000, remainingMs.toString());
        }
    }

    @Test
    @Timeout(value = 20, unit = TimeUnit.SECONDS)
    void closeFailsRunningAndQueuedWritesSoNoWaiterHangs() throws Exception {
        CountDownLatch started = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        PendingWrites writes = new PendingWrites("test RLMM", 1);
        CompletableFuture<Void> running = writes.submit("running", 60_000, blocking(started, release));
        assertTrue(started.await(5, TimeUnit.SECONDS));
        List<CompletableFuture<Void>> queued = new ArrayList<>();
        for (int i = 0; i < 5; i++) {
            queued.add(writes.submit("queued-" + i, 60_000, deadline -> { }));
        }
        // A broker thread blocked on get() the way RemoteLogManager waits for a write.
        CompletableFuture<Throwable> waiter = CompletableFuture.supplyAsync(() -> {
            try {
                queued.get(4).get();
                return null;
            } catch (ExecutionException e) {
                return e.getCause();
            } catch (InterruptedException e) {
                return e;
            }
        });
        writes.close();
        Throwable seen = waiter.get(5, TimeUnit.SECONDS);
        assertInstanceOf(RemoteStorageException.class, seen);
        assertTrue(seen.getMessage().contains("closed"), seen.getMessage());
        assertTrue(running.isCompletedExceptionally());
        queued.forEach(f -> assertTrue(f.isCompletedExceptionally()));
        assertEquals(0, writes.pendingCount());
        CompletableFuture<Void> late = writes.submit("late", 60_000, deadline -> { });
        assertTrue(late.isCompletedExceptionally());
    }
}
