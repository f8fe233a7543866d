/*
 * The adapter's own configuration keys (agent.*), read from the map a plugin's configure() receives.
 * Every other key is forwarded unchanged to the agent, which owns its meaning.
 */
package dev.tierlog.kafka;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

import org.apache.kafka.common.config.ConfigException;

/** Where the agent listens, whether the adapter starts it, and the deadline of each kind of call. */
public final class AgentSettings {
    public static final String PREFIX = "agent.";
    public static final String SOCKET_PATH = "agent.socket.path";
    public static final String START = "agent.start";
    public static final String COMMAND = "agent.command";
    public static final String LOG_FILE = "agent.log.file";
    public static final String METRICS_PORT = "tierlog.agent.metrics.port";
    public static final String CALL_TIMEOUT_MS = "agent.call.timeout.ms";
    public static final String COPY_TIMEOUT_MS = "agent.copy.timeout.ms";
    public static final String FETCH_TIMEOUT_MS = "agent.fetch.timeout.ms";
    public static final String STARTUP_TIMEOUT_MS = "agent.startup.timeout.ms";

    /** Every key this class understands; the docker test checks the compose file against this set. */
    public static final Set<String> KEYS = Set.of(
        SOCKET_PATH, START, COMMAND, LOG_FILE, METRICS_PORT,
        CALL_TIMEOUT_MS, COPY_TIMEOUT_MS, FETCH_TIMEOUT_MS, STARTUP_TIMEOUT_MS);

    static final String DEFAULT_COMMAND = "python3 -m tierlog.agent.server";

    public final Path socketPath;
    public final boolean start;
    public final List<String> command;
    public final Path logFile;
    public final Optional<Integer> metricsPort;
    public final long callTimeoutMs;
    public final long copyTimeoutMs;
    public final long fetchTimeoutMs;
    public final long startupTimeoutMs;
    /** The configure() map without the agent.* keys, as strings: what the agent's component receives. */
    public final Map<String, String> forwarded;

    private AgentSettings(Map<String, ?> configs) {
        Map<String, String> own = new TreeMap<>();
        Map<String, String> rest = new TreeMap<>();
        for (Map.Entry<String, ?> e : configs.entrySet()) {
            if (e.getValue() == null) {
                continue;
            }
            String value = String.valueOf(e.getValue());
            if (e.getKey().startsWith(PREFIX)) {
                if (!KEYS.contains(e.getKey())) {
                    throw new ConfigException("unknown tierlog adapter key " + e.getKey() + "; known keys: "
                        + String.join(", ", new TreeSet<>(KEYS)));
                }
                own.put(e.getKey(), value);
            } else {
                rest.put(e.getKey(), value);
            }
        }
        String node = rest.getOrDefault("node.id", rest.getOrDefault("broker.id", "0"));
        this.socketPath = Path.of(own.getOrDefault(SOCKET_PATH,
            Path.of(System.getProperty("java.io.tmpdir"), "tierlog-agent-" + node + ".sock").toString()));
        this.start = parseBool(own, START, true);
        String cmd = own.getOrDefault(COMMAND, DEFAULT_COMMAND).trim();
        if (cmd.isEmpty()) {
            throw new ConfigException(COMMAND + " must not be empty");
        }
        this.command = Collections.unmodifiableList(new ArrayList<>(Arrays.asList(cmd.split("\\s+"))));
        this.logFile = Path.of(own.getOrDefault(LOG_FILE, socketPath + ".log"));
        this.metricsPort = own.containsKey(METRICS_PORT)
            ? Optional.of((int) parseLong(own, METRICS_PORT, 0, 0, 65535)) : Optional.empty();
        this.callTimeoutMs = parseLong(own, CALL_TIMEOUT_MS, 30_000, 1, Long.MAX_VALUE);
        this.copyTimeoutMs = parseLong(own, COPY_TIMEOUT_MS, 300_000, 1, Long.MAX_VALUE);
        this.fetchTimeoutMs = parseLong(own, FETCH_TIMEOUT_MS, 120_000, 1, Long.MAX_VALUE);
        this.startupTimeoutMs = parseLong(own, STARTUP_TIMEOUT_MS, 60_000, 1, Long.MAX_VALUE);
        this.forwarded = Collections.unmodifiableMap(rest);
    }

    public static AgentSettings parse(Map<String, ?> configs) {
        return new AgentSettings(configs);
    }

    private static boolean parseBool(Map<String, String> own, String key, boolean dflt) {
        String v = own.get(key);
        if (v == null) {
            return dflt;
        }
        switch (v.trim().toLowerCase()) {
            case "true":
                return true;
            case "false":
                return false;
            default:
                throw new ConfigException(key, v, "expected true or false");
        }
    }

    private static long parseLong(Map<String, String> own, String key, long dflt, long min, long max) {
        String v = own.get(key);
        if (v == null) {
            return dflt;
        }
        long parsed;
        try {
            parsed = Long.parseLong(v.trim());
        } catch (NumberFormatException e) {
            throw new ConfigException(key, v, "expected an integer");
        }
        if (parsed < min || parsed > max) {
            throw new ConfigException(key, v, "must be between " + min + " and " + max);
        }
        return parsed;
    }
}
