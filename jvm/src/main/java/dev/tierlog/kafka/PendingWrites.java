/*
 * The RLMM's asynchronous writes: a small pool runs them, each future carries a deadline that starts when the
 * broker submits the write (not when a pool thread picks it up), and close() fails every write still pending.
 */
package dev.tierlog.kafka;

import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;

import io.grpc.Deadline;

import org.apache.kafka.server.log.remote.storage.RemoteStorageException;

/** A broker thread blocked on a returned future's get() is always released: by the result, the deadline or close(). */
final class PendingWrites implements AutoCloseable {

    /** One write against the agent, given the deadline its calls must meet. */
    @FunctionalInterface
    interface Write {
        void run(Deadline deadline) throws RemoteStorageException;
    }

    private final String owner;
    private final ExecutorService pool;
    private final Set<CompletableFuture<Void>> pending = ConcurrentHashMap.newKeySet();
    private volatile boolean closed;

    PendingWrites(String owner, int threads) {
        this.owner = owner;
        this.pool = Executors.newFixedThreadPool(threads, AgentClient.daemonThreads(owner + "-write"));
    }

    CompletableFuture<Void> submit(String what, long timeoutMs, Write write) {
        Deadline deadline = Deadline.after(timeoutMs, TimeUnit.MILLISECONDS);
        CompletableFuture<Void> future = new CompletableFuture<>();
        pending.add(future);
        future.whenComplete((ignored, error) -> pending.remove(future));
        // The deadline runs from submission: a write queued behind busy threads fails on time as well.
        CompletableFuture.delayedExecutor(timeoutMs, TimeUnit.MILLISECONDS).execute(() ->
            future.completeExceptionally(new RemoteStorageException(owner + ": " + what + " did not complete within "
                + timeoutMs + " ms of its submission")));
        try {
            pool.execute(() -> run(what, deadline, write, future));
        } catch (RejectedExecutionException e) {
            future.completeExceptionally(closedError(what));
        }
        // close() may have run between the check-free add above and now; it must not miss this future.
        if (closed) {
            future.completeExceptionally(closedError(what));
        }
        return future;
    }

    private static void run(String what, Deadline deadline, Write write, CompletableFuture<Void> future) {
        if (future.isDone() || deadline.isExpired()) {
            return; // the deadline task fails (or has failed) it
        }
        try {
            write.run(deadline);
            future.complete(null);
        } catch (RemoteStorageException | RuntimeException e) {
            future.completeExceptionally(e);
        }
    }

    private RemoteStorageException closedError(String what) {
        return new RemoteStorageException(owner + " was closed before " + what + " completed");
    }

    /** Writes not yet completed (for tests and diagnostics). */
    int pendingCount() {
        return pending.size();
    }

    @Override
    public void close() {
        closed = true;
        for (CompletableFuture<Void> future : pending) {
            future.completeExceptionally(new RemoteStorageException(owner + " was closed before this write completed"));
        }
        // Every future is complete now, so interrupting the running calls leaves nobody waiting.
        pool.shutdownNow();
    }
}
