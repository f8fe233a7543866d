/*
 * The connection from one plugin instance to the tierlog agent: a gRPC channel on a Unix domain socket,
 * a deadline on every call, error mapping to Kafka's exceptions, and (optionally) the agent's process:
 * started, restarted with backoff when down, replaced when hung, and every exit logged and counted.
 */
package dev.tierlog.kafka;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;

import io.grpc.Deadline;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;

import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.common.errors.ReplicaNotAvailableException;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import dev.tierlog.kafka.proto.AgentGrpc;
import dev.tierlog.kafka.proto.CloseRequest;
import dev.tierlog.kafka.proto.Component;
import dev.tierlog.kafka.proto.ConfigureRequest;
import dev.tierlog.kafka.proto.Empty;
import dev.tierlog.kafka.proto.HealthResponse;

/**
 * One per plugin instance; {@code afterConfigure} restores state the agent lost by restarting. The broker configures its RLMM and RSM separately (possibly in separate class
 * loaders), so each plugin owns a client; they meet at the socket, and a file lock keeps them from
 * starting two agents.
 */
final class AgentClient implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(AgentClient.class);
    private static final long HEALTH_TIMEOUT_MS = 2_000;
    // How long a hung agent gets to exit on SIGTERM before SIGKILL (a stopped process only obeys the latter).
    private static final long STOP_GRACE_MS = 5_000;
    private static final int MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
    private static final String STILL_STARTING = "still starting";

    /** A call against the channel, given the deadline it must meet. */
    @FunctionalInterface
    interface Rpc<T> {
        T call(ManagedChannel channel, Deadline deadline);
    }

    private final AgentSettings settings;
    private final Component component;
    private final Rpc<Void> afterConfigure;
    private final EventLoopGroup eventLoop;
    private final ManagedChannel channel;
    private final AgentMetrics metrics;
    private final AgentSupervisor supervisor;
    private final ScheduledExecutorService timers;
    // Restarts back off (doubling) so that an agent that cannot start, say a broken Python install, or that
    // dies soon after starting is not respawned on every call. Written under the start lock.
    private volatile long lastLaunchMs;
    private volatile long restartDelayMs;
    private volatile String lastLaunchFailure = "";
    private volatile Thread creationWatcher;
    private volatile boolean closed;

    AgentClient(AgentSettings settings, Component component, Rpc<Void> afterConfigure) {
        this.settings = settings;
        this.component = component;
        this.afterConfigure = afterConfigure;
        this.eventLoop = new EpollEventLoopGroup(1, daemonThreads("tierlog-agent-io-" + component));
        this.channel = NettyChannelBuilder.forAddress(new DomainSocketAddress(settings.socketPath.toFile()))
            .eventLoopGroup(eventLoop)
            .channelType(EpollDomainSocketChannel.class)
            // gRPC asks every transport for TCP keepalive, which a Unix socket does not have: netty then warns
            // "Unknown channel option 'SO_KEEPALIVE'" in the broker log on each connection. Unset, it is not asked.
            .withOption(ChannelOption.SO_KEEPALIVE, null)
            .usePlaintext()
            .maxInboundMessageSize(MAX_MESSAGE_BYTES)
            .build();
        this.metrics = new AgentMetrics(component, settings.socketPath);
        this.supervisor = new AgentSupervisor(settings, metrics, new AgentSupervisor.Agent() {
            @Override
            public boolean healthy() {
                return AgentClient.this.healthy();
            }

            @Override
            public boolean replaceHung(String reason) throws RemoteStorageException {
                return AgentClient.this.replaceHung(reason);
            }

            @Override
            public long restartAllowedInMs() {
                return AgentClient.this.restartAllowedInMs();
            }
        }, "tierlog-agent-health-" + component);
        this.timers = Executors.newSingleThreadScheduledExecutor(daemonThreads("tierlog-agent-timer-" + component));
    }

    /** Makes sure an agent answers (starting one if allowed) and hands it this component's config. */
    void start() throws RemoteStorageException {
        ensureAgent(null);
        try {
            configure(Deadline.after(settings.startupTimeoutMs, TimeUnit.MILLISECONDS));
        } catch (StatusRuntimeException e) {
            if (e.getStatus().getCode() == Status.Code.INVALID_ARGUMENT) {
                // A bad rlmm.config.* / rsm.config.* key: fail the broker's startup naming it.
                throw new ConfigException("tierlog " + component + ": " + e.getStatus().getDescription());
            }
            throw translate("configure", e, settings.startupTimeoutMs);
        }
    }

    /**
     * Runs one call with a deadline. A call that finds the component unconfigured (the agent restarted)
     * reconfigures it and runs once more; one that finds no agent restarts it when this adapter owns it.
     */
    <T> T call(String what, long timeoutMs, Rpc<T> rpc) throws RemoteStorageException {
        return call(what, Deadline.after(timeoutMs, TimeUnit.MILLISECONDS), timeoutMs, rpc);
    }

    /** As above, against a deadline set earlier (a queued write's, set when the broker submitted it). */
    <T> T call(String what, Deadline deadline, long timeoutMs, Rpc<T> rpc) throws RemoteStorageException {
        String hung = supervisor.hungReason();
        if (hung != null) {
            throw new RemoteStorageException("tierlog agent at " + settings.socketPath + " is hung (" + hung + "); "
                + what + " fails at once until it answers" + (settings.start ? " or is replaced" : "")
                + "; see the agent's log at " + settings.logFile);
        }
        StatusRuntimeException first;
        try {
            return rpc.call(channel, deadline);
        } catch (StatusRuntimeException e) {
            first = e;
        }
        Status.Code code = first.getStatus().getCode();
        boolean recover = code == Status.Code.FAILED_PRECONDITION
            || (code == Status.Code.UNAVAILABLE && settings.start);
        if (!recover || deadline.isExpired()) {
            throw failed(what, first, timeoutMs);
        }
        try {
            if (code == Status.Code.UNAVAILABLE) {
                ensureAgent(what + " found no agent answering (" + first.getStatus().getDescription() + ")");
            }
            configure(deadline);
            return rpc.call(channel, deadline);
        } catch (StatusRuntimeException e) {
            throw failed(what, e, timeoutMs);
        }
    }

    /** As translate(), and a missed deadline starts the supervisor's health checks. */
    private RemoteStorageException failed(String what, StatusRuntimeException e, long timeoutMs) {
        if (e.getStatus().getCode() == Status.Code.DEADLINE_EXCEEDED) {
            supervisor.deadlineMissed(what);
        }
        return translate(what, e, timeoutMs);
    }

    /** For deadlines inside a call (a stream's first chunk); its tasks must be short. */
    ScheduledExecutorService timers() {
        return timers;
    }

    /**
     * Watches, in the background, the agent create this component from the config start() handed it, and
     * logs the outcome on the broker's side: creation can outlast configure() (the rlmm waits for the broker
     * it is part of) and can then fail (say, a metadata topic replication factor above the broker count).
     * {@code probe} is any side-effect-free call on the component; the agent answers it FAILED_PRECONDITION
     * naming the cause when creating the component failed, ABORTED "still starting" while it is being created
     * (tierlog/agent/components.py).
     */
    void watchCreation(Rpc<?> probe) {
        Thread watcher = new Thread(() -> {
            long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(settings.startupTimeoutMs);
            while (System.nanoTime() < until) {
                try {
                    probe.call(channel, Deadline.after(HEALTH_TIMEOUT_MS, TimeUnit.MILLISECONDS));
                    LOG.info("tierlog {} is ready in the agent at {}", component, settings.socketPath);
                    return;
                } catch (StatusRuntimeException e) {
                    switch (e.getStatus().getCode()) {
                        case FAILED_PRECONDITION:
                            LOG.error("tierlog {} failed to start in the agent at {}: {} (agent log: {})", component,
                                settings.socketPath, e.getStatus().getDescription(), settings.logFile);
                            return;
                        case ABORTED:
                            // The component's own "not ready" (an unknown partition) means it exists.
                            if (!String.valueOf(e.getStatus().getDescription()).contains(STILL_STARTING)) {
                                LOG.info("tierlog {} is ready in the agent at {}", component, settings.socketPath);
                                return;
                            }
                            break;
                        case UNAVAILABLE:
                        case DEADLINE_EXCEEDED:
                            break; // still being created, or the agent is restarting: ask again
                        default:
                            LOG.info("tierlog {} is ready in the agent at {}", component, settings.socketPath);
                            return;
                    }
                }
                try {
                    Thread.sleep(500);
                } catch (InterruptedException e) {
                    return; // close() interrupts: the broker is shutting down
                }
            }
            LOG.error("tierlog {} was still not created in the agent at {} after {} ms; see the agent log at {}",
                component, settings.socketPath, settings.startupTimeoutMs, settings.logFile);
        }, "tierlog-" + component + "-startup");
        watcher.setDaemon(true);
        creationWatcher = watcher;
        watcher.start();
    }

    AgentSettings settings() {
        return settings;
    }

    /** Kafka's exception for a failed call; runtime ones (bad argument, not ready) are thrown directly. */
    RemoteStorageException translate(String what, StatusRuntimeException e, long timeoutMs) {
        Status status = e.getStatus();
        String detail = status.getDescription() == null ? status.getCode().toString() : status.getDescription();
        switch (status.getCode()) {
            case NOT_FOUND:
                return new RemoteResourceNotFoundException(detail);
            case INVALID_ARGUMENT:
                throw new IllegalArgumentException(what + ": " + detail);
            case ABORTED:
                // Kafka's own manager signals a partition that is still loading this way; clients retry.
                throw new ReplicaNotAvailableException(what + ": " + detail);
            case UNAVAILABLE:
                channel.resetConnectBackoff();
                return new RemoteStorageException("tierlog agent at " + settings.socketPath + " is unreachable ("
                    + detail + ") during " + what + "; check the agent's log at " + settings.logFile, e);
            case DEADLINE_EXCEEDED:
                return new RemoteStorageException("tierlog agent at " + settings.socketPath
                    + " did not answer " + what + " within " + timeoutMs + " ms", e);
            default:
                return new RemoteStorageException("tierlog agent failed " + what + ": " + detail, e);
        }
    }

    private void configure(Deadline deadline) {
        ConfigureRequest request = ConfigureRequest.newBuilder()
            .setComponent(component).putAllConfig(settings.forwarded).build();
        AgentGrpc.newBlockingStub(channel).withDeadline(deadline).configure(request);
        afterConfigure.call(channel, deadline);
    }

    /** Whether the agent answers its health check; at once false when nothing listens on the socket. */
    private boolean healthy() {
        if (!listening(settings.socketPath)) {
            return false;
        }
        // A channel that failed to connect waits before trying again; the agent may be back already.
        channel.resetConnectBackoff();
        try {
            HealthResponse health = AgentGrpc.newBlockingStub(channel)
                .withDeadlineAfter(HEALTH_TIMEOUT_MS, TimeUnit.MILLISECONDS)
                .withWaitForReady()
                .health(Empty.getDefaultInstance());
            return health.getServing();
        } catch (StatusRuntimeException e) {
            return false;
        }
    }

    /**
     * Returns once an agent answers its health check, starting one if this adapter may; {@code restartReason}
     * says why it is down (null at the plugin's start).
     */
    private void ensureAgent(String restartReason) throws RemoteStorageException {
        if (healthy()) {
            return;
        }
        if (!settings.start) {
            throw new RemoteStorageException("no tierlog agent answers at " + settings.socketPath
                + "; start one (tierlog agent) or set " + AgentSettings.START + "=true");
        }
        underStartLock(() -> {
            if (healthy()) {
                return;
            }
            reserveStart();
            launch(restartReason);
        });
    }

    /**
     * Stops the hung agent this JVM started on the socket and starts another. False when there is none to
     * stop while something still listens there: an agent started by hand, which is not the broker's to kill.
     */
    private boolean replaceHung(String reason) throws RemoteStorageException {
        if (!settings.start) {
            return false;
        }
        boolean[] replaced = {false};
        underStartLock(() -> {
            if (healthy()) { // it recovered, or the other plugin replaced it already
                replaced[0] = true;
                return;
            }
            List<ProcessHandle> hung = startedAgents();
            if (hung.isEmpty() && listening(settings.socketPath)) {
                return;
            }
            reserveStart();
            for (ProcessHandle agent : hung) {
                stop(agent, reason);
            }
            launch("it was hung: " + reason);
            replaced[0] = true;
        });
        return replaced[0];
    }

    @FunctionalInterface
    private interface StartAction {
        void run() throws IOException, RemoteStorageException;
    }

    /** Runs {@code action} while no other plugin of this host starts an agent on the socket. */
    private void underStartLock(StartAction action) throws RemoteStorageException {
        // Both plugins may get here at once, possibly from different class loaders: an interned string
        // is one monitor per JVM, and the file lock covers other processes sharing the socket path.
        synchronized (("tierlog-agent-start:" + settings.socketPath).intern()) {
            Path lockPath = Path.of(settings.socketPath + ".lock");
            try (FileChannel lockChannel = FileChannel.open(lockPath, StandardOpenOption.CREATE,
                    StandardOpenOption.WRITE);
                 FileLock lock = lockChannel.lock()) {
                action.run();
            } catch (IOException e) {
                throw new RemoteStorageException("could not start the tierlog agent at " + settings.socketPath
                    + ": " + e, e);
            }
        }
    }

    /**
     * Takes the next start, or fails while the backoff since the last one runs: the wait doubles per restart
     * up to its max, and starts over once an agent outlived the max backoff (it was not crash-looping).
     */
    private void reserveStart() throws RemoteStorageException {
        long now = System.currentTimeMillis();
        long since = now - lastLaunchMs;
        if (lastLaunchMs != 0 && since < restartDelayMs) {
            throw new RemoteStorageException("the tierlog agent at " + settings.socketPath + " was started " + since
                + " ms ago; restarts back off, the next in " + (restartDelayMs - since) + " ms"
                + lastLaunchFailure + "; see " + settings.logFile);
        }
        restartDelayMs = lastLaunchMs == 0 || since >= restartDelayMs + settings.restartBackoffMaxMs
            ? settings.restartBackoffMs : Math.min(2 * restartDelayMs, settings.restartBackoffMaxMs);
        lastLaunchMs = now;
    }

    private long restartAllowedInMs() {
        return Math.max(0, lastLaunchMs + restartDelayMs - System.currentTimeMillis());
    }

    private List<ProcessHandle> startedAgents() {
        return startedAgents(settings.socketPath);
    }

    /** Live agent processes this JVM started (directly or through a wrapper) on {@code socket}. */
    static List<ProcessHandle> startedAgents(Path socket) {
        String path = socket.toString();
        return ProcessHandle.current().descendants().filter(p -> {
            List<String> args = commandLine(p);
            for (int i = 0; i + 1 < args.size(); i++) {
                if (args.get(i).equals("--socket") && args.get(i + 1).equals(path)) {
                    return p.isAlive();
                }
            }
            return false;
        }).toList();
    }

    /**
     * A process's arguments, read from /proc: ProcessHandle.Info drops them for a command line over 4 KiB
     * (a long class path or interpreter path). Empty once the process is gone.
     */
    private static List<String> commandLine(ProcessHandle process) {
        try {
            String raw = Files.readString(Path.of("/proc", String.valueOf(process.pid()), "cmdline"),
                StandardCharsets.UTF_8);
            return List.of(raw.split("\0"));
        } catch (IOException e) {
            return List.of();
        }
    }

    /** SIGTERM, then SIGKILL after a grace period; returns once the process is gone. */
    private void stop(ProcessHandle agent, String reason) throws RemoteStorageException {
        LOG.warn("Stopping the tierlog agent (pid {}) at {}: {}", agent.pid(), settings.socketPath, reason);
        agent.destroy();
        if (exited(agent, STOP_GRACE_MS)) {
            return;
        }
        agent.destroyForcibly();
        if (!exited(agent, STOP_GRACE_MS)) {
            throw new RemoteStorageException("the hung tierlog agent (pid " + agent.pid() + ") at " + settings.socketPath
                + " was still running " + STOP_GRACE_MS + " ms after SIGKILL; not starting another beside it");
        }
    }

    private static boolean exited(ProcessHandle process, long waitMs) throws RemoteStorageException {
        try {
            process.onExit().get(waitMs, TimeUnit.MILLISECONDS);
            return true;
        } catch (TimeoutException | ExecutionException e) {
            return !process.isAlive();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new RemoteStorageException("interrupted while stopping the tierlog agent", e);
        }
    }

    /** Whether a process accepts connections on the socket, whatever it answers (or not) over gRPC. */
    static boolean listening(Path socket) {
        if (!Files.exists(socket)) {
            return false;
        }
        try (SocketChannel probe = SocketChannel.open(StandardProtocolFamily.UNIX)) {
            probe.connect(UnixDomainSocketAddress.of(socket));
            return true;
        } catch (IOException e) {
            return false;
        }
    }

    /** As startProcess(), remembering a failure for the message of a start refused while backing off. */
    private void launch(String restartReason) throws IOException, RemoteStorageException {
        try {
            startProcess(restartReason);
            lastLaunchFailure = "";
        } catch (RemoteStorageException e) {
            lastLaunchFailure = " (" + e.getMessage() + ")";
            throw e;
        }
    }

    /**
     * Starts an agent, unless one is alive: a live agent that answers its health probe slowly is waited for,
     * never displaced (a second agent would fail on the first one's RocksDB lock). A stale socket is left
     * for the new agent, which removes it only after checking that nothing listens on it. Every exit of the
     * started process, but for the broker's shutdown, is a WARN and counted.
     */
    private void startProcess(String restartReason) throws IOException, RemoteStorageException {
        long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(settings.startupTimeoutMs);
        if (listening(settings.socketPath)) {
            while (System.nanoTime() < until) {
                if (healthy()) {
                    return;
                }
                if (!listening(settings.socketPath)) {
                    break;
                }
                pause();
            }
            if (listening(settings.socketPath)) {
                throw new RemoteStorageException("a process accepts connections on " + settings.socketPath
                    + " but did not answer the agent's health check within " + settings.startupTimeoutMs
                    + " ms; not starting a second agent beside it (see " + settings.logFile + ")");
            }
        }
        Path parent = settings.socketPath.toAbsolutePath().getParent();
        if (parent != null) {
            Files.createDirectories(parent);
        }
        List<String> command = new ArrayList<>(settings.command);
        command.add("--socket");
        command.add(settings.socketPath.toString());
        command.add("--parent-pid");
        command.add(String.valueOf(ProcessHandle.current().pid()));
        command.add("--exit-when-idle");
        command.add("--log-file");
        command.add(settings.logFile.toString());
        settings.metricsPort.ifPresent(port -> {
            command.add("--metrics-port");
            command.add(String.valueOf(port));
        });
        settings.metricsAddress.ifPresent(address -> {
            command.add("--metrics-address");
            command.add(address);
        });
        if (restartReason == null) {
            LOG.info("Starting the tierlog agent: {} (log: {})", command, settings.logFile);
        } else {
            metrics.agentRestarts.incrementAndGet();
            LOG.warn("Restarting the tierlog agent at {} because {}: {} (log: {})", settings.socketPath, restartReason,
                command, settings.logFile);
        }
        // The agent rotates its own log; its raw output (a crash before logging starts) goes beside it.
        ProcessBuilder builder = new ProcessBuilder(command)
            .redirectErrorStream(true)
            .redirectOutput(ProcessBuilder.Redirect.appendTo(settings.outputFile().toFile()));
        Process started;
        try {
            started = builder.start();
        } catch (IOException e) {
            throw new RemoteStorageException("could not run the tierlog agent (" + command + "): " + e.getMessage()
                + "; set " + AgentSettings.PYTHON + " or " + AgentSettings.COMMAND, e);
        }
        started.onExit().thenAccept(this::agentExited);
        while (System.nanoTime() < until) {
            if (!started.isAlive()) {
                throw new RemoteStorageException("the tierlog agent (" + command + ") exited with status "
                    + started.exitValue() + " at startup; see " + settings.logFile + " and " + settings.outputFile());
            }
            if (healthy()) {
                return;
            }
            pause();
        }
        started.destroy();
        throw new RemoteStorageException("the tierlog agent did not answer at " + settings.socketPath + " within "
            + settings.startupTimeoutMs + " ms; see " + settings.logFile);
    }

    private void agentExited(Process agent) {
        if (closed) {
            return; // the broker closed its plugins: the agent exits once idle
        }
        metrics.agentDeaths.incrementAndGet();
        LOG.warn("The tierlog agent (pid {}) at {} exited with status {}; see its log at {} and {}", agent.pid(),
            settings.socketPath, agent.exitValue(), settings.logFile, settings.outputFile());
    }

    private static void pause() throws RemoteStorageException {
        try {
            Thread.sleep(100);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new RemoteStorageException("interrupted while starting the tierlog agent", e);
        }
    }

    @Override
    public void close() {
        closed = true;
        supervisor.close();
        timers.shutdownNow();
        Thread watcher = creationWatcher;
        if (watcher != null) {
            watcher.interrupt();
        }
        try {
            AgentGrpc.newBlockingStub(channel).withDeadlineAfter(settings.callTimeoutMs, TimeUnit.MILLISECONDS)
                .close(CloseRequest.newBuilder().setComponent(component).build());
        } catch (StatusRuntimeException e) {
            LOG.warn("Closing {} in the tierlog agent at {} failed: {}", component, settings.socketPath,
                e.getStatus());
        }
        channel.shutdown();
        try {
            channel.awaitTermination(5, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        channel.shutdownNow();
        // A launched agent exits by itself once both components are closed (--exit-when-idle), or when
        // the broker's process is gone (--parent-pid), so nothing here waits for it.
        eventLoop.shutdownGracefully(0, 1, TimeUnit.SECONDS);
        metrics.close();
    }

    static ThreadFactory daemonThreads(String name) {
        AtomicInteger n = new AtomicInteger();
        return r -> {
            Thread t = new Thread(r, name + "-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        };
    }
}
