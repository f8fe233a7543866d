/*
 * Starting the agent never displaces a live one: a process that listens on the socket but answers the health
 * probe slowly (or not at all) is waited for, and no second agent is started beside it.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import dev.tierlog.kafka.proto.Component;

class AgentLaunchTest {

    /** An "agent" that only leaves a mark and exits, so a start is visible. */
    private static Path marker(Path dir, Path launched) throws Exception {
        Path script = dir.resolve("fake-agent");
        Files.writeString(script, "#!/bin/sh\ntouch '" + launched + "'\n");
        Files.setPosixFilePermissions(script, PosixFilePermissions.fromString("rwx------"));
        return script;
    }

    @Test
    @Timeout(value = 60, unit = TimeUnit.SECONDS)
    void aLiveButSlowAgentIsNotDisplaced(@TempDir Path dir) throws Exception {
        Path socket = dir.resolve("a.sock");
        Path launched = dir.resolve("launched");
        // The "agent" the adapter would start only leaves a mark, so a second start is visible.
        Map<String, String> config = Map.of(
            "agent.socket.path", socket.toString(),
            "agent.command", marker(dir, launched).toString(),
            "agent.call.timeout.ms", "2000",
            "agent.startup.timeout.ms", "3000");
        try (ServerSocketChannel live = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
            // Accepts connections (the kernel's backlog) but never speaks gRPC: a live agent too busy to answer.
            live.bind(UnixDomainSocketAddress.of(socket));
            try (AgentClient client = new AgentClient(AgentSettings.parse(config, Optional.empty()),
                    Component.REMOTE_LOG_METADATA_MANAGER, (ch, dl) -> null)) {
                RemoteStorageException e = assertThrows(RemoteStorageException.class, client::start);
                assertTrue(e.getMessage().contains("not starting a second agent"), e.getMessage());
            }
            assertTrue(Files.exists(socket), "the live agent's socket was deleted");
            assertFalse(Files.exists(launched), "a second agent was started beside the live one");
        }
    }

    @Test
    @Timeout(value = 60, unit = TimeUnit.SECONDS)
    void aStaleSocketDoesNotStopALaunch(@TempDir Path dir) throws Exception {
        Path socket = dir.resolve("a.sock");
        Path launched = dir.resolve("launched");
        try (ServerSocketChannel dead = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
            dead.bind(UnixDomainSocketAddress.of(socket)); // closing leaves the file: a crashed agent's socket
        }
        Map<String, String> config = Map.of(
            "agent.socket.path", socket.toString(),
            "agent.command", marker(dir, launched).toString(),
            "agent.call.timeout.ms", "2000",
            "agent.startup.timeout.ms", "3000");
        try (AgentClient client = new AgentClient(AgentSettings.parse(config, Optional.empty()),
                Component.REMOTE_LOG_METADATA_MANAGER, (ch, dl) -> null)) {
            // The fake agent exits at once, so the launch fails, but only after starting the command.
            assertThrows(RemoteStorageException.class, client::start);
        }
        assertTrue(Files.exists(launched), "no agent was started for a dead socket");
    }
}
