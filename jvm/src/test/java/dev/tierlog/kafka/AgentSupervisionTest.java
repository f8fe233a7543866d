/*
 * Supervision of the agent against a stand-in agent process: fetch-path lookups fail within their own short
 * deadline, a hung (SIGSTOPped) agent is replaced and calls succeed again, an agent the broker did not start is
 * failed fast instead, a slow call does not get a healthy agent replaced, and a crash-looping agent backs off.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import dev.tierlog.kafka.proto.Component;

class AgentSupervisionTest {
    private static final String JAVA = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    private static final String FAKE_AGENT = JAVA + " -cp " + System.getProperty("java.class.path") + " "
        + FakeAgent.class.getName();
    private static final TopicIdPartition TP = new TopicIdPartition(Uuid.randomUuid(), 0, "supervised");
    private static final RemoteLogSegmentMetadata SEGMENT = new RemoteLogSegmentMetadata(
        new RemoteLogSegmentId(TP, Uuid.randomUuid()), 0L, 99L, 1_700_000_000_000L, 0, 1_700_000_000_000L, 4096,
        Optional.empty(), RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(0, 0L), false);
    // Short, but long enough for the stand-in's first answers from a fresh JVM on a busy machine.
    private static final long LOOKUP_MS = 1_000;

    @TempDir
    Path dir;
    private final List<AutoCloseable> plugins = new ArrayList<>();
    private final List<Process> external = new ArrayList<>();

    private Path socket() {
        return dir.resolve("a.sock");
    }

    private Map<String, String> config(String... overrides) {
        Map<String, String> config = new HashMap<>(Map.of(
            "agent.socket.path", socket().toString(),
            "agent.command", FAKE_AGENT,
            "agent.startup.timeout.ms", "30000",
            "agent.lookup.timeout.ms", String.valueOf(LOOKUP_MS),
            "agent.hung.checks", "2",
            "agent.restart.backoff.ms", "100"));
        for (int i = 0; i < overrides.length; i += 2) {
            config.put(overrides[i], overrides[i + 1]);
        }
        return config;
    }

    private TierlogRemoteLogMetadataManager rlmm(Map<String, String> config) {
        TierlogRemoteLogMetadataManager rlmm = new TierlogRemoteLogMetadataManager();
        plugins.add(rlmm);
        rlmm.configure(config);
        return rlmm;
    }

    private TierlogRemoteStorageManager rsm(Map<String, String> config) {
        TierlogRemoteStorageManager rsm = new TierlogRemoteStorageManager();
        plugins.add(rsm);
        rsm.configure(config);
        return rsm;
    }

    @AfterEach
    void stopAgentsThenPlugins() throws Exception {
        // Agents first: a plugin's close() asks a stopped agent to close its component and would wait.
        ProcessHandle.current().descendants().forEach(ProcessHandle::destroyForcibly);
        for (Process p : external) {
            p.destroyForcibly().waitFor();
        }
        for (AutoCloseable plugin : plugins) {
            plugin.close();
        }
    }

    private List<Long> agents() {
        return AgentClient.startedAgents(socket()).stream().map(ProcessHandle::pid).toList();
    }

    private long onlyAgent() {
        List<Long> agents = agents();
        assertEquals(1, agents.size(), "agent processes: " + agents);
        return agents.get(0);
    }

    private static void signal(long pid, String signal) throws Exception {
        assertEquals(0, new ProcessBuilder("kill", "-" + signal, String.valueOf(pid)).start().waitFor());
    }

    private static void await(String what, long timeoutMs, BooleanSupplier condition) throws InterruptedException {
        long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        while (!condition.getAsBoolean()) {
            assertTrue(System.nanoTime() < until, "timed out waiting for " + what);
            Thread.sleep(50);
        }
    }

    private long counter(Component component, String attribute) {
        try {
            return (Long) ManagementFactory.getPlatformMBeanServer()
                .getAttribute(AgentMetrics.objectName(component, socket()), attribute);
        } catch (Exception e) {
            throw new AssertionError("no JMX attribute " + attribute + " for " + component, e);
        }
    }

    /** What the adapter logged about this test's socket, WARN lines marked as such by the logger. */
    private List<String> log() {
        Path file = Path.of(System.getProperty("org.slf4j.simpleLogger.logFile"));
        try {
            return Files.readAllLines(file, StandardCharsets.UTF_8).stream()
                .filter(line -> line.contains(socket().toString())).toList();
        } catch (IOException e) {
            return List.of();
        }
    }

    private boolean logged(String level, String text) {
        return log().stream().anyMatch(line -> line.contains(" " + level + " ") && line.contains(text));
    }

    private static long millisSince(long startNanos) {
        return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - startNanos);
    }

    @Test
    @Timeout(value = 60, unit = TimeUnit.SECONDS)
    void fetchPathLookupsFailWithinTheLookupDeadlineWhenTheAgentHangs() throws Exception {
        // A hung agent is never declared here (too many checks): this is the per-call deadline alone.
        Map<String, String> config = config("agent.hung.checks", "1000", "agent.call.timeout.ms", "30000");
        TierlogRemoteLogMetadataManager rlmm = rlmm(config);
        TierlogRemoteStorageManager rsm = rsm(config);
        assertEquals(Optional.of(41L), rlmm.highestOffsetForEpoch(TP, 0));
        try (var index = rsm.fetchIndex(SEGMENT, IndexType.OFFSET)) {
            assertArrayEquals(FakeAgent.INDEX.toByteArray(), index.readAllBytes());
        }

        signal(onlyAgent(), "STOP");

        List<org.junit.jupiter.api.function.Executable> lookups = List.of(
            () -> rlmm.highestOffsetForEpoch(TP, 0),
            () -> rlmm.remoteLogSegmentMetadata(TP, 0, 10L),
            () -> rlmm.nextSegmentWithTxnIndex(TP, 0, 10L),
            () -> rsm.fetchIndex(SEGMENT, IndexType.OFFSET),
            () -> rsm.fetchLogSegment(SEGMENT, 0));
        for (var lookup : lookups) {
            long start = System.nanoTime();
            RemoteStorageException e = assertThrows(RemoteStorageException.class, lookup);
            long took = millisSince(start);
            assertTrue(e.getMessage().contains("within " + LOOKUP_MS + " ms"), e.getMessage());
            assertTrue(took >= LOOKUP_MS && took < LOOKUP_MS + 1_500, "took " + took + " ms: " + e.getMessage());
        }
        assertEquals(3, counter(Component.REMOTE_LOG_METADATA_MANAGER, "DeadlineMisses"));
        assertEquals(2, counter(Component.REMOTE_STORAGE_MANAGER, "DeadlineMisses"));
    }

    @Test
    @Timeout(value = 90, unit = TimeUnit.SECONDS)
    void aHungAgentIsReplacedAndCallsSucceedAgain() throws Exception {
        TierlogRemoteLogMetadataManager rlmm = rlmm(config());
        long hung = onlyAgent();
        signal(hung, "STOP");

        assertThrows(RemoteStorageException.class, () -> rlmm.highestOffsetForEpoch(TP, 0));

        await("a new agent in place of the hung one", 60_000, () -> {
            List<Long> agents = agents();
            return agents.size() == 1 && agents.get(0) != hung;
        });
        await("calls to succeed again", 30_000, () -> {
            try {
                return rlmm.highestOffsetForEpoch(TP, 0).equals(Optional.of(41L));
            } catch (RemoteStorageException e) {
                return false; // failing at once while the new agent starts
            }
        });
        assertFalse(ProcessHandle.of(hung).map(ProcessHandle::isAlive).orElse(false), "the hung agent still runs");
        Component rlmmComponent = Component.REMOTE_LOG_METADATA_MANAGER;
        await("the hung agent's exit to be counted", 10_000, () -> counter(rlmmComponent, "AgentDeaths") == 1);
        assertEquals(1, counter(rlmmComponent, "AgentRestarts"));
        assertTrue(counter(rlmmComponent, "DeadlineMisses") >= 1);
        assertFalse((Boolean) ManagementFactory.getPlatformMBeanServer()
            .getAttribute(AgentMetrics.objectName(rlmmComponent, socket()), "Hung"));
        assertTrue(logged("WARN", "is hung: highestOffsetForEpoch"), String.join("\n", log()));
        assertTrue(logged("WARN", "Stopping the tierlog agent (pid " + hung + ")"), String.join("\n", log()));
        assertTrue(logged("WARN", "Restarting the tierlog agent at " + socket() + " because it was hung"),
            String.join("\n", log()));
        // SIGTERM does not reach a stopped process; SIGKILL after the grace period does (128 + 9).
        assertTrue(logged("WARN", "(pid " + hung + ") at " + socket() + " exited with status 137"),
            String.join("\n", log()));
    }

    @Test
    @Timeout(value = 60, unit = TimeUnit.SECONDS)
    void anAgentTheBrokerDidNotStartIsFailedFastWhileHungAndUsedAgainOnceItAnswers() throws Exception {
        Process agent = new ProcessBuilder(JAVA, "-cp", System.getProperty("java.class.path"),
            FakeAgent.class.getName(), "--socket", socket().toString()).redirectErrorStream(true)
            .redirectOutput(dir.resolve("external.out").toFile()).start();
        external.add(agent);
        await("the external agent to listen", 30_000, () -> AgentClient.listening(socket()));
        TierlogRemoteLogMetadataManager rlmm = rlmm(config("agent.start", "false"));
        assertEquals(Optional.of(41L), rlmm.highestOffsetForEpoch(TP, 0));

        signal(agent.pid(), "STOP");
        assertThrows(RemoteStorageException.class, () -> rlmm.highestOffsetForEpoch(TP, 0));
        await("the agent to be declared hung", 30_000, () -> logged("WARN", "cannot replace it"));

        long start = System.nanoTime();
        RemoteStorageException e = assertThrows(RemoteStorageException.class, () -> rlmm.highestOffsetForEpoch(TP, 0));
        assertTrue(millisSince(start) < LOOKUP_MS, "a call to a hung agent waited " + millisSince(start) + " ms");
        assertTrue(e.getMessage().contains("is hung"), e.getMessage());
        assertTrue(agent.isAlive(), "the broker killed an agent it did not start");
        assertEquals(0, counter(Component.REMOTE_LOG_METADATA_MANAGER, "AgentRestarts"));

        signal(agent.pid(), "CONT");
        await("calls to reach the agent again", 30_000, () -> {
            try {
                return rlmm.highestOffsetForEpoch(TP, 0).equals(Optional.of(41L));
            } catch (RemoteStorageException notYet) {
                return false;
            }
        });
        assertTrue(logged("WARN", "answers again"), String.join("\n", log()));
    }

    @Test
    @Timeout(value = 60, unit = TimeUnit.SECONDS)
    void aSlowCallDoesNotGetAHealthyAgentReplaced() throws Exception {
        TierlogRemoteStorageManager rsm = rsm(config());
        long agent = onlyAgent();
        Files.createFile(FakeAgent.slowMarker(socket()));

        assertThrows(RemoteStorageException.class, () -> rsm.fetchIndex(SEGMENT, IndexType.OFFSET));
        await("the health check that clears the agent", 30_000,
            () -> logged("INFO", "answers its health check: fetchIndex"));

        Files.delete(FakeAgent.slowMarker(socket()));
        try (var index = rsm.fetchIndex(SEGMENT, IndexType.OFFSET)) {
            assertArrayEquals(FakeAgent.INDEX.toByteArray(), index.readAllBytes());
        }
        assertEquals(List.of(agent), agents());
        assertEquals(0, counter(Component.REMOTE_STORAGE_MANAGER, "AgentRestarts"));
        assertEquals(1, counter(Component.REMOTE_STORAGE_MANAGER, "DeadlineMisses"));
    }

    @Test
    @Timeout(value = 60, unit = TimeUnit.SECONDS)
    void aCrashLoopingAgentIsRestartedWithGrowingPauses() throws Exception {
        Path starts = dir.resolve("starts");
        Path crash = dir.resolve("crash");
        Path script = dir.resolve("agent.sh");
        Files.writeString(script, "#!/bin/sh\ndate +%s%N >> '" + starts + "'\n"
            + "if [ -e '" + crash + "' ]; then exit 3; fi\nexec " + FAKE_AGENT + " \"$@\"\n");
        Files.setPosixFilePermissions(script, PosixFilePermissions.fromString("rwx------"));
        TierlogRemoteLogMetadataManager rlmm = rlmm(config("agent.command", script.toString(),
            "agent.restart.backoff.ms", "200", "agent.restart.backoff.max.ms", "800"));
        long first = onlyAgent();

        Files.createFile(crash);
        ProcessHandle crashed = ProcessHandle.of(first).orElseThrow();
        crashed.destroyForcibly();
        crashed.onExit().get(10, TimeUnit.SECONDS);
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(4);
        int calls = 0;
        String lastError = "";
        while (System.nanoTime() < until) {
            calls++;
            try {
                rlmm.highestOffsetForEpoch(TP, 0);
            } catch (RemoteStorageException e) {
                lastError = e.getMessage();
            }
            Thread.sleep(20);
        }

        List<Long> startedAt = Files.readAllLines(starts).stream().map(Long::parseLong).toList();
        List<Long> pauses = new ArrayList<>();
        for (int i = 2; i < startedAt.size(); i++) {
            pauses.add(TimeUnit.NANOSECONDS.toMillis(startedAt.get(i) - startedAt.get(i - 1)));
        }
        assertTrue(pauses.size() >= 2 && pauses.size() <= 7, calls + " calls restarted it after pauses of " + pauses);
        for (int i = 0; i < pauses.size(); i++) {
            long backoff = Math.min(800, 200L << i);
            assertTrue(pauses.get(i) >= backoff - 100, "restart " + i + " after " + pauses.get(i) + " ms: " + pauses);
        }
        assertTrue(lastError.contains("restarts back off") || lastError.contains("exited with status 3"), lastError);
        Component component = Component.REMOTE_LOG_METADATA_MANAGER;
        await("every crash to be counted", 10_000, () -> counter(component, "AgentDeaths") == startedAt.size());
        assertEquals(startedAt.size() - 1, counter(component, "AgentRestarts"));
        assertTrue(logged("WARN", "exited with status 3"), String.join("\n", log()));
        assertTrue(logged("WARN", "exited with status 137"), String.join("\n", log()));
    }
}
