/*
 * The counters behind AgentMetricsMBean, registered in the platform MBean server under dev.tierlog:type=Agent.
 * Kafka 4.4 hands plugin metrics only to plugins on its own class path, not to those of remote.log.*.class.path.
 */
package dev.tierlog.kafka;

import java.lang.management.ManagementFactory;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicLong;

import javax.management.JMException;
import javax.management.MBeanServer;
import javax.management.MalformedObjectNameException;
import javax.management.ObjectName;
import javax.management.StandardMBean;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import dev.tierlog.kafka.proto.Component;

/** One per plugin instance; each plugin may live in a class loader of its own, so they share nothing. */
final class AgentMetrics implements AgentMetricsMBean, AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(AgentMetrics.class);

    final AtomicLong deadlineMisses = new AtomicLong();
    final AtomicLong agentDeaths = new AtomicLong();
    final AtomicLong agentRestarts = new AtomicLong();
    volatile boolean hung;
    private final ObjectName name;
    private final boolean registered;

    AgentMetrics(Component component, Path socket) {
        this.name = objectName(component, socket);
        this.registered = register();
    }

    static ObjectName objectName(Component component, Path socket) {
        try {
            return new ObjectName("dev.tierlog:type=Agent,component=" + component + ",socket="
                + ObjectName.quote(socket.toString()));
        } catch (MalformedObjectNameException e) {
            throw new IllegalArgumentException("no JMX name for the agent at " + socket, e);
        }
    }

    private boolean register() {
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();
        try {
            server.registerMBean(new StandardMBean(this, AgentMetricsMBean.class), name);
            return true;
        } catch (JMException e) {
            // Another plugin instance of this component on this socket holds the name: the counters still
            // work, JMX shows that instance's.
            LOG.warn("tierlog agent counters not registered in JMX as {}: {}", name, e.toString());
            return false;
        }
    }

    ObjectName name() {
        return name;
    }

    @Override
    public long getDeadlineMisses() {
        return deadlineMisses.get();
    }

    @Override
    public long getAgentDeaths() {
        return agentDeaths.get();
    }

    @Override
    public long getAgentRestarts() {
        return agentRestarts.get();
    }

    @Override
    public boolean isHung() {
        return hung;
    }

    @Override
    public void close() {
        if (!registered) {
            return;
        }
        try {
            ManagementFactory.getPlatformMBeanServer().unregisterMBean(name);
        } catch (JMException e) {
            LOG.debug("tierlog agent counters {} were already unregistered: {}", name, e.toString());
        }
    }
}
