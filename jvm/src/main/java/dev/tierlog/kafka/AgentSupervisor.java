/*
 * Tells a hung agent from a slow call: a call that misses its deadline starts health checks, and an agent that
 * fails several in a row counts as hung; calls then fail at once while the adapter replaces it (if it may).
 */
package dev.tierlog.kafka;

import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One per plugin instance. A slow S3 copy also misses its deadline, but its agent answers the health check:
 * only an agent that does not (stopped, deadlocked, every worker stuck) is declared hung.
 */
final class AgentSupervisor implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(AgentSupervisor.class);
    static final long CHECK_INTERVAL_MS = 1_000;

    /** What the supervisor needs of the client that owns the agent's channel and process. */
    interface Agent {
        /** Whether the agent answers its health check (a short deadline of its own). */
        boolean healthy();

        /**
         * Stops the hung agent and starts another; false when the agent is not this broker's to replace
         * (connect mode, or a process this JVM did not start). Throws when a start failed or must back off.
         */
        boolean replaceHung(String reason) throws RemoteStorageException;

        /** How long until a restart is allowed (restarts back off). */
        long restartAllowedInMs();
    }

    private final AgentSettings settings;
    private final AgentMetrics metrics;
    private final Agent agent;
    private final ExecutorService checks;
    private final AtomicBoolean checking = new AtomicBoolean();
    private volatile String hungReason;

    AgentSupervisor(AgentSettings settings, AgentMetrics metrics, Agent agent, String threadName) {
        this.settings = settings;
        this.metrics = metrics;
        this.agent = agent;
        this.checks = Executors.newSingleThreadExecutor(AgentClient.daemonThreads(threadName));
    }

    /** Why the agent counts as hung, or null when it does not: callers then fail at once instead of waiting. */
    String hungReason() {
        return hungReason;
    }

    /** Counts a call that missed its deadline and starts checking the agent's health, unless already doing so. */
    void deadlineMissed(String what) {
        metrics.deadlineMisses.incrementAndGet();
        if (checking.compareAndSet(false, true)) {
            try {
                checks.execute(() -> check(what));
            } catch (RejectedExecutionException e) {
                checking.set(false); // closed
            }
        }
    }

    private void check(String missed) {
        int failed = 0;
        boolean toldUnreplaceable = false;
        try {
            while (!Thread.currentThread().isInterrupted()) {
                if (agent.healthy()) {
                    if (hungReason != null) {
                        LOG.warn("The tierlog agent at {} answers again", settings.socketPath);
                    } else {
                        LOG.info("The tierlog agent at {} answers its health check: {} was slow, not the agent",
                            settings.socketPath, missed);
                    }
                    answered();
                    return;
                }
                failed++;
                long pause = CHECK_INTERVAL_MS;
                if (failed >= settings.hungChecks) {
                    String reason = missed + " missed its deadline and " + failed
                        + " health checks in a row went unanswered";
                    if (hungReason == null) {
                        LOG.warn("The tierlog agent at {} is hung: {}; calls to it fail at once until it answers{}",
                            settings.socketPath, reason, settings.start ? " or is replaced" : "");
                        metrics.hung = true;
                    }
                    hungReason = reason;
                    try {
                        if (agent.replaceHung(reason)) {
                            answered();
                            return;
                        }
                        if (!toldUnreplaceable) {
                            LOG.warn("The hung tierlog agent at {} was not started by this broker ({}={}, or started "
                                + "by hand), so the broker cannot replace it: restart it (see {})", settings.socketPath,
                                AgentSettings.START, settings.start, settings.logFile);
                            toldUnreplaceable = true;
                        }
                    } catch (RemoteStorageException e) {
                        LOG.warn("Could not replace the hung tierlog agent at {}: {}", settings.socketPath,
                            e.getMessage());
                        pause = Math.max(pause, agent.restartAllowedInMs());
                    }
                }
                Thread.sleep(pause);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt(); // close()
        } finally {
            checking.set(false);
        }
    }

    private void answered() {
        hungReason = null;
        metrics.hung = false;
    }

    @Override
    public void close() {
        checks.shutdownNow();
    }
}
