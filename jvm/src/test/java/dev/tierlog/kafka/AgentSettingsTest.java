/*
 * The adapter keeps its agent.* keys and forwards the rest of a plugin's config to the agent untouched,
 * rejecting a misspelt adapter key by name.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.Map;
import java.util.Optional;

import org.apache.kafka.common.config.ConfigException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class AgentSettingsTest {

    @Test
    void agentKeysAreKeptAndOtherKeysForwardedAsStrings() {
        AgentSettings s = AgentSettings.parse(Map.of(
            "agent.socket.path", "/tmp/x.sock", "agent.start", "false", "broker.id", 3, "s3.bucket", "b"));
        assertEquals(Path.of("/tmp/x.sock"), s.socketPath);
        assertFalse(s.start);
        assertEquals(Map.of("broker.id", "3", "s3.bucket", "b"), s.forwarded);
    }

    @Test
    void defaultSocketPathNamesTheNode() {
        AgentSettings s = AgentSettings.parse(Map.of("node.id", 7, "agent.start", "false"));
        assertTrue(s.socketPath.getFileName().toString().contains("7"), s.socketPath.toString());
    }

    @Test
    void unknownAgentKeyIsRejectedByName() {
        ConfigException e = assertThrows(ConfigException.class,
            () -> AgentSettings.parse(Map.of("agent.socket.pth", "/tmp/x.sock")));
        assertTrue(e.getMessage().contains("agent.socket.pth"), e.getMessage());
    }

    @Test
    void nonNumericTimeoutIsRejectedByName() {
        ConfigException e = assertThrows(ConfigException.class,
            () -> AgentSettings.parse(Map.of("agent.call.timeout.ms", "soon")));
        assertTrue(e.getMessage().contains("agent.call.timeout.ms"), e.getMessage());
    }

    @Test
    void segmentLookupsAreKeptASecondByDefault() {
        AgentSettings defaults = AgentSettings.parse(Map.of("agent.start", "false"));
        assertEquals(1_000, defaults.rlmmLookupCacheMs);
        AgentSettings off = AgentSettings.parse(Map.of("agent.start", "false", "agent.rlmm.lookup.cache.ms", "0"));
        assertEquals(0, off.rlmmLookupCacheMs);
        ConfigException e = assertThrows(ConfigException.class,
            () -> AgentSettings.parse(Map.of("agent.start", "false", "agent.rlmm.lookup.cache.ms", "60001")));
        assertTrue(e.getMessage().contains("agent.rlmm.lookup.cache.ms"), e.getMessage());
    }

    @Test
    void fetchPathLookupsHaveAShortDeadlineOfTheirOwn() {
        AgentSettings defaults = AgentSettings.parse(Map.of("agent.start", "false"));
        assertEquals(5_000, defaults.lookupTimeoutMs);
        assertEquals(30_000, defaults.callTimeoutMs);
        assertEquals(120_000, defaults.fetchTimeoutMs);
        assertEquals(800, AgentSettings.parse(Map.of("agent.start", "false", "agent.lookup.timeout.ms", "800"))
            .lookupTimeoutMs);
    }

    @Test
    void supervisionKeysHaveDefaultsAndAreCheckedByName() {
        AgentSettings defaults = AgentSettings.parse(Map.of("agent.start", "false"));
        assertEquals(3, defaults.hungChecks);
        assertEquals(5_000, defaults.restartBackoffMs);
        assertEquals(60_000, defaults.restartBackoffMaxMs);
        ConfigException zero = assertThrows(ConfigException.class,
            () -> AgentSettings.parse(Map.of("agent.start", "false", "agent.hung.checks", "0")));
        assertTrue(zero.getMessage().contains("agent.hung.checks"), zero.getMessage());
        ConfigException inverted = assertThrows(ConfigException.class, () -> AgentSettings.parse(Map.of(
            "agent.start", "false", "agent.restart.backoff.ms", "10000", "agent.restart.backoff.max.ms", "5000")));
        assertTrue(inverted.getMessage().contains("agent.restart.backoff.max.ms"), inverted.getMessage());
        assertTrue(inverted.getMessage().contains("agent.restart.backoff.ms"), inverted.getMessage());
    }

    @Test
    void segmentFilesAreOnByDefaultWithAnEightMebibyteWindow() {
        AgentSettings defaults = AgentSettings.parse(Map.of("agent.start", "false"));
        assertTrue(defaults.fetchFiles);
        assertEquals(8 << 20, defaults.fetchFilesWindowBytes);
        AgentSettings off = AgentSettings.parse(Map.of("agent.start", "false", "agent.fetch.files.enable", "false",
            "agent.fetch.files.window.bytes", "4194304"));
        assertFalse(off.fetchFiles);
        assertEquals(4 << 20, off.fetchFilesWindowBytes);
        ConfigException e = assertThrows(ConfigException.class, () -> AgentSettings.parse(Map.of(
            "agent.start", "false", "agent.fetch.files.window.bytes", "0")));
        assertTrue(e.getMessage().contains("agent.fetch.files.window.bytes"), e.getMessage());
    }

    @Test
    void defaultSocketIsInAStateDirNotTheTempDir() {
        AgentSettings s = AgentSettings.parse(Map.of("node.id", 7, "agent.start", "false"));
        assertFalse(s.socketPath.startsWith(System.getProperty("java.io.tmpdir")), s.socketPath.toString());
        assertEquals(AgentSettings.stateDir().resolve("agent-7.sock"), s.socketPath);
    }

    @Test
    void tooLongSocketPathIsRejectedByName() {
        ConfigException e = assertThrows(ConfigException.class, () -> AgentSettings.parse(Map.of(
            "agent.socket.path", "/" + "d".repeat(120) + "/a.sock", "agent.start", "false")));
        assertTrue(e.getMessage().contains("agent.socket.path"), e.getMessage());
    }

    private static Path executable(Path path) throws Exception {
        Files.createDirectories(path.getParent());
        Files.writeString(path, "#!/bin/sh\n");
        Files.setPosixFilePermissions(path, PosixFilePermissions.fromString("rwxr-xr-x"));
        return path;
    }

    @Test
    void defaultCommandIsTheAgentScriptOfTheEnvironmentHoldingTheJar(@TempDir Path venv) throws Exception {
        Path jar = venv.resolve("lib/python3.11/site-packages/tierlog/jars/tierlog-kafka-plugin.jar");
        Files.createDirectories(jar.getParent());
        Files.createFile(jar);
        Path script = executable(venv.resolve("bin/tierlog-agent"));
        AgentSettings s = AgentSettings.parse(Map.of(), Optional.of(jar));
        assertEquals(List.of(script.toRealPath().toString()), s.command);
    }

    @Test
    void aSymlinkToTheInstalledJarFindsTheSameAgent(@TempDir Path dir) throws Exception {
        Path jar = dir.resolve("venv/lib/python3.11/site-packages/tierlog/jars/tierlog-kafka-plugin.jar");
        Files.createDirectories(jar.getParent());
        Files.createFile(jar);
        Path script = executable(dir.resolve("venv/bin/tierlog-agent"));
        Path link = dir.resolve("kafka/plugins/tierlog/tierlog-kafka-plugin-0.1.0.jar");
        Files.createDirectories(link.getParent());
        Files.createSymbolicLink(link, jar);
        assertEquals(List.of(script.toRealPath().toString()),
            AgentSettings.parse(Map.of(), Optional.of(link)).command);
    }

    @Test
    void metricsPortIsAnAdapterKey() {
        // It was renamed tierlog.agent.metrics.port by mistake: that name was forwarded to the agent's rlmm.
        AgentSettings s = AgentSettings.parse(Map.of("agent.metrics.port", "9464", "agent.start", "false"));
        assertEquals(Optional.of(9464), s.metricsPort);
        assertFalse(s.forwarded.containsKey("agent.metrics.port"));
    }

    @Test
    void metricsAddressIsAnAdapterKeyAndDefaultsToTheAgentsOwn() {
        AgentSettings given = AgentSettings.parse(
            Map.of("agent.metrics.address", "0.0.0.0", "agent.metrics.port", "9464", "agent.start", "false"));
        assertEquals(Optional.of("0.0.0.0"), given.metricsAddress);
        assertFalse(given.forwarded.containsKey("agent.metrics.address"));
        assertEquals(Optional.empty(), AgentSettings.parse(Map.of("agent.start", "false")).metricsAddress);
    }

    @Test
    void agentPythonRunsTheAgentModule(@TempDir Path dir) throws Exception {
        Path python = executable(dir.resolve("bin/python3"));
        AgentSettings s = AgentSettings.parse(Map.of("agent.python", python.toString()), Optional.empty());
        assertEquals(List.of(python.toString(), "-m", "tierlog.agent.server"), s.command);
    }

    @Test
    void withoutAnInstalledJarOrAgentPythonTheErrorNamesTheProperty(@TempDir Path dir) {
        // A jar built in a checkout (jvm/target) has no environment of its own; never fall back to PATH's python3.
        ConfigException e = assertThrows(ConfigException.class, () ->
            AgentSettings.parse(Map.of(), Optional.of(dir.resolve("jvm/target/tierlog-kafka-plugin-0.1.0.jar"))));
        assertTrue(e.getMessage().contains("agent.python"), e.getMessage());
        assertTrue(e.getMessage().contains("agent.command"), e.getMessage());
    }

    @Test
    void agentPythonThatIsNotAnInterpreterIsRejectedByName() {
        ConfigException e = assertThrows(ConfigException.class, () ->
            AgentSettings.parse(Map.of("agent.python", "/nonexistent/python3"), Optional.empty()));
        assertTrue(e.getMessage().contains("agent.python"), e.getMessage());
    }
}
