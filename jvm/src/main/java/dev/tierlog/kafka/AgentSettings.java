/*
 * The adapter's own configuration keys (agent.*), read from the map a plugin's configure() receives.
 * Every other key is forwarded unchanged to the agent, which owns its meaning.
 */
package dev.tierlog.kafka;

import java.io.IOException;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.CodeSource;
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
    public static final String PYTHON = "agent.python";
    public static final String LOG_FILE = "agent.log.file";
    public static final String METRICS_PORT = "agent.metrics.port";
    public static final String METRICS_ADDRESS = "agent.metrics.address";
    public static final String CALL_TIMEOUT_MS = "agent.call.timeout.ms";
    public static final String COPY_TIMEOUT_MS = "agent.copy.timeout.ms";
    public static final String FETCH_TIMEOUT_MS = "agent.fetch.timeout.ms";
    public static final String STARTUP_TIMEOUT_MS = "agent.startup.timeout.ms";
    public static final String LOOKUP_TIMEOUT_MS = "agent.lookup.timeout.ms";
    public static final String HUNG_CHECKS = "agent.hung.checks";
    public static final String RESTART_BACKOFF_MS = "agent.restart.backoff.ms";
    public static final String RESTART_BACKOFF_MAX_MS = "agent.restart.backoff.max.ms";
    public static final String FETCH_FILES_ENABLE = "agent.fetch.files.enable";
    public static final String FETCH_FILES_WINDOW_BYTES = "agent.fetch.files.window.bytes";
    public static final String FETCH_FILES_REUSE_MS = "agent.fetch.files.reuse.ms";
    public static final String RLMM_LOOKUP_CACHE_MS = "agent.rlmm.lookup.cache.ms";

    /** Every key this class understands; the docker test checks the compose file against this set. */
    public static final Set<String> KEYS = Set.of(
        SOCKET_PATH, START, COMMAND, PYTHON, LOG_FILE, METRICS_PORT, METRICS_ADDRESS,
        CALL_TIMEOUT_MS, COPY_TIMEOUT_MS, FETCH_TIMEOUT_MS, STARTUP_TIMEOUT_MS, LOOKUP_TIMEOUT_MS, HUNG_CHECKS,
        RESTART_BACKOFF_MS, RESTART_BACKOFF_MAX_MS, FETCH_FILES_ENABLE, FETCH_FILES_WINDOW_BYTES,
        FETCH_FILES_REUSE_MS, RLMM_LOOKUP_CACHE_MS);

    /** The console script the tierlog wheel installs beside its `tierlog` command. */
    static final String AGENT_SCRIPT = "tierlog-agent";
    static final String AGENT_MODULE = "tierlog.agent.server";
    // A Unix socket's path must fit sockaddr_un.sun_path (108 bytes on Linux, NUL included).
    static final int MAX_SOCKET_PATH_BYTES = 107;

    public final Path socketPath;
    public final boolean start;
    public final List<String> command;
    public final Path logFile;
    public final Optional<Integer> metricsPort;
    /** Where the metrics port listens; loopback unless a remote Prometheus must scrape it. */
    public final Optional<String> metricsAddress;
    public final long callTimeoutMs;
    public final long copyTimeoutMs;
    public final long fetchTimeoutMs;
    public final long startupTimeoutMs;
    /** Deadline of the broker's fetch-path lookups, and of the first chunk of a fetched segment or index. */
    public final long lookupTimeoutMs;
    /** Health checks in a row, begun after a call missed its deadline, that must fail before the agent counts as hung. */
    public final int hungChecks;
    /** The wait before restarting an agent that was started recently; it doubles per quick restart up to the max. */
    public final long restartBackoffMs;
    public final long restartBackoffMaxMs;
    /** Whether fetched segment bytes are read from the agent's chunk cache files (else always streamed). */
    public final boolean fetchFiles;
    /** The most bytes one FetchLogSegmentFiles answer covers: best a multiple of the rsm's chunk size. */
    public final int fetchFilesWindowBytes;
    /** How long the adapter reads an answer's checked files again for later fetches of their segment (0: never). */
    public final long fetchFilesReuseMs;
    /** How long the RLMM answers a segment lookup from an earlier answer that holds for it (0: always asks). */
    public final long rlmmLookupCacheMs;
    /** The configure() map without the agent.* keys, as strings: what the agent's component receives. */
    public final Map<String, String> forwarded;

    private AgentSettings(Map<String, ?> configs, Optional<Path> pluginJar) {
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
        this.socketPath = own.containsKey(SOCKET_PATH) ? Path.of(own.get(SOCKET_PATH))
            : stateDir().resolve("agent-" + node + ".sock");
        if (socketPath.toString().getBytes(StandardCharsets.UTF_8).length > MAX_SOCKET_PATH_BYTES) {
            throw new ConfigException(SOCKET_PATH, socketPath.toString(), "a Unix socket path may not exceed "
                + MAX_SOCKET_PATH_BYTES + " bytes; choose a shorter one");
        }
        this.start = parseBool(own, START, true);
        this.logFile = Path.of(own.getOrDefault(LOG_FILE, socketPath + ".log"));
        this.metricsPort = own.containsKey(METRICS_PORT)
            ? Optional.of((int) parseLong(own, METRICS_PORT, 0, 0, 65535)) : Optional.empty();
        this.metricsAddress = Optional.ofNullable(own.get(METRICS_ADDRESS)).map(String::trim).filter(a -> !a.isEmpty());
        this.callTimeoutMs = parseLong(own, CALL_TIMEOUT_MS, 30_000, 1, Long.MAX_VALUE);
        this.copyTimeoutMs = parseLong(own, COPY_TIMEOUT_MS, 300_000, 1, Long.MAX_VALUE);
        this.fetchTimeoutMs = parseLong(own, FETCH_TIMEOUT_MS, 120_000, 1, Long.MAX_VALUE);
        this.startupTimeoutMs = parseLong(own, STARTUP_TIMEOUT_MS, 60_000, 1, Long.MAX_VALUE);
        this.lookupTimeoutMs = parseLong(own, LOOKUP_TIMEOUT_MS, 5_000, 1, Long.MAX_VALUE);
        this.hungChecks = (int) parseLong(own, HUNG_CHECKS, 3, 1, 1_000);
        this.restartBackoffMs = parseLong(own, RESTART_BACKOFF_MS, 5_000, 1, Long.MAX_VALUE);
        this.restartBackoffMaxMs = parseLong(own, RESTART_BACKOFF_MAX_MS, 60_000, 1, Long.MAX_VALUE);
        if (restartBackoffMaxMs < restartBackoffMs) {
            throw new ConfigException(RESTART_BACKOFF_MAX_MS, String.valueOf(restartBackoffMaxMs),
                "must not be below " + RESTART_BACKOFF_MS + " (" + restartBackoffMs + ")");
        }
        this.fetchFiles = parseBool(own, FETCH_FILES_ENABLE, true);
        this.fetchFilesWindowBytes = (int) parseLong(own, FETCH_FILES_WINDOW_BYTES, 8L << 20, 1, Integer.MAX_VALUE);
        this.fetchFilesReuseMs = parseLong(own, FETCH_FILES_REUSE_MS, 10_000, 0, 3_600_000);
        this.rlmmLookupCacheMs = parseLong(own, RLMM_LOOKUP_CACHE_MS, 1_000, 0, 60_000);
        this.forwarded = Collections.unmodifiableMap(rest);
        this.command = start ? command(own, pluginJar) : List.of();
    }

    public static AgentSettings parse(Map<String, ?> configs) {
        return new AgentSettings(configs, pluginJar());
    }

    /** As {@link #parse(Map)}, as if the plugin's classes were loaded from {@code pluginJar}. */
    static AgentSettings parse(Map<String, ?> configs, Optional<Path> pluginJar) {
        return new AgentSettings(configs, pluginJar);
    }

    /** Where the started agent's raw output goes (anything written before its own rotated log is set up). */
    public Path outputFile() {
        return Path.of(logFile + ".out");
    }

    /**
     * The default home of sockets: a per-user state directory ($XDG_STATE_HOME/tierlog, else
     * ~/.local/state/tierlog), never a temporary directory that cleaners may empty under a running broker.
     * Both plugins must derive the same path and only the RLMM is told the broker's log.dir, so it is not used.
     */
    static Path stateDir() {
        String xdg = System.getenv("XDG_STATE_HOME");
        Path base = xdg != null && !xdg.isBlank() ? Path.of(xdg)
            : Path.of(System.getProperty("user.home"), ".local", "state");
        return base.resolve("tierlog");
    }

    /**
     * How to start the agent: agent.command as given; else agent.python running the agent module; else the
     * tierlog-agent script of the Python environment whose wheel holds this jar. Never whatever `python3`
     * happens to be first on the broker's PATH, which may import another checkout's code.
     */
    private static List<String> command(Map<String, String> own, Optional<Path> pluginJar) {
        if (own.containsKey(COMMAND)) {
            String cmd = own.get(COMMAND).trim();
            if (cmd.isEmpty()) {
                throw new ConfigException(COMMAND + " must not be empty");
            }
            return List.copyOf(Arrays.asList(cmd.split("\\s+")));
        }
        if (own.containsKey(PYTHON)) {
            String python = own.get(PYTHON).trim();
            if (python.isEmpty() || !Files.isExecutable(Path.of(python))) {
                throw new ConfigException(PYTHON, python, "not an executable Python interpreter");
            }
            return List.of(python, "-m", AGENT_MODULE);
        }
        Optional<Path> script = pluginJar.flatMap(AgentSettings::installedAgent);
        if (script.isPresent()) {
            return List.of(script.get().toString());
        }
        throw new ConfigException("tierlog cannot tell which Python environment to start its agent from: this "
            + "plugin jar (" + pluginJar.map(Path::toString).orElse("location unknown") + ") is not the one a "
            + "tierlog wheel installed (print that one's path with `tierlog plugin-path`). Set " + PYTHON
            + " to the interpreter of the environment where tierlog is installed, or " + COMMAND);
    }

    /**
     * The tierlog-agent script beside the wheel holding {@code jar}: the wheel puts the jar at
     * {@code <site-packages>/tierlog/jars/}, and the environment's scripts are in {@code <prefix>/bin} with
     * site-packages at {@code <prefix>/lib/pythonX.Y/site-packages} (or Debian's lib/python3/dist-packages).
     * The Dockerfile links the broker's plugins/ entry to that jar.
     */
    static Optional<Path> installedAgent(Path jar) {
        Path real;
        try {
            real = jar.toRealPath(); // a symlink to the installed jar (a broker's plugins/ dir) counts as it
        } catch (IOException e) {
            real = jar.toAbsolutePath();
        }
        Path jars = real.getParent();
        if (jars == null || !jars.getFileName().toString().equals("jars")) {
            return Optional.empty();
        }
        Path prefix = jars;
        for (int up = 0; up < 5 && prefix != null; up++) {
            prefix = prefix.getParent(); // tierlog, site-packages, pythonX.Y, lib, <prefix>
        }
        if (prefix == null) {
            return Optional.empty();
        }
        Path script = prefix.resolve("bin").resolve(AGENT_SCRIPT);
        return Files.isExecutable(script) ? Optional.of(script) : Optional.empty();
    }

    private static Optional<Path> pluginJar() {
        try {
            CodeSource source = AgentSettings.class.getProtectionDomain().getCodeSource();
            if (source == null || source.getLocation() == null) {
                return Optional.empty();
            }
            return Optional.of(Path.of(source.getLocation().toURI()));
        } catch (URISyntaxException | IllegalArgumentException | SecurityException e) {
            return Optional.empty();
        }
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
