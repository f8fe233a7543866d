/*
 * The adapter keeps its agent.* keys and forwards the rest of a plugin's config to the agent untouched,
 * rejecting a misspelt adapter key by name.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.util.Map;

import org.apache.kafka.common.config.ConfigException;
import org.junit.jupiter.api.Test;

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
        AgentSettings s = AgentSettings.parse(Map.of("node.id", 7));
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
}
