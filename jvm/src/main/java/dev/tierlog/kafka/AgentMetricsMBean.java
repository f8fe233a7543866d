/*
 * What the broker's JMX shows of one plugin's agent supervision (dev.tierlog:type=Agent,component=...,socket=...).
 * Public because JMX reads an MBean through its interface.
 */
package dev.tierlog.kafka;

/** Counters since the plugin was configured; a broker's total is the sum over its two components. */
public interface AgentMetricsMBean {
    /** Calls to the agent that missed their deadline. */
    long getDeadlineMisses();

    /** Exits of agent processes this plugin started, other than at the broker's shutdown. */
    long getAgentDeaths();

    /** Agents this plugin started in place of one that was down or hung. */
    long getAgentRestarts();

    /** Whether the agent counts as hung now (calls fail at once until it answers or is replaced). */
    boolean isHung();
}
