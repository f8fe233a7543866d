/*
 * Kafka's RemoteLogMetadataManager, served by the tierlog agent's event-sourced metadata store.
 * Every method is declared here (defaults included) so the broker never falls back to an interface default.
 */
package dev.tierlog.kafka;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;

import io.grpc.Deadline;
import io.grpc.ManagedChannel;
import io.grpc.StatusRuntimeException;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadataManager;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import dev.tierlog.kafka.proto.Component;
import dev.tierlog.kafka.proto.EpochQuery;
import dev.tierlog.kafka.proto.LeadershipChanges;
import dev.tierlog.kafka.proto.ListQuery;
import dev.tierlog.kafka.proto.OptionalOffset;
import dev.tierlog.kafka.proto.OptionalSegment;
import dev.tierlog.kafka.proto.RemoteLogMetadataGrpc;
import dev.tierlog.kafka.proto.SegmentList;
import dev.tierlog.kafka.proto.SegmentQuery;

/**
 * Configure it with {@code remote.log.metadata.manager.class.name=dev.tierlog.kafka.TierlogRemoteLogMetadataManager};
 * {@code rlmm.config.agent.*} keys configure the adapter, every other {@code rlmm.config.*} key goes to tierlog's
 * rlmm (the agent derives bootstrap.servers, broker.id and state.dir from what the broker adds).
 */
public class TierlogRemoteLogMetadataManager implements RemoteLogMetadataManager {
    private static final Logger LOG = LoggerFactory.getLogger(TierlogRemoteLogMetadataManager.class);

    // What the broker told us about leadership, replayed into an agent that restarted and forgot it.
    private final Map<TopicIdPartition, Boolean> isLeader = new ConcurrentHashMap<>();
    // ListRemoteLogSegmentsAtOnce, which an older agent lacks: then only streams.
    private final OptionalCall listAtOnce = new OptionalCall("list segments in one answer", "listings are streamed");
    private volatile AgentClient agent;
    private volatile PendingWrites writes;
    private volatile SegmentLookupCache lookups = new SegmentLookupCache(0, System::nanoTime);

    @Override
    public void configure(Map<String, ?> configs) {
        AgentSettings settings = AgentSettings.parse(configs);
        writes = new PendingWrites("tierlog RLMM", 4);
        lookups = new SegmentLookupCache(settings.rlmmLookupCacheMs, System::nanoTime);
        agent = new AgentClient(settings, Component.REMOTE_LOG_METADATA_MANAGER, this::replayLeadership);
        try {
            agent.start();
        } catch (RemoteStorageException e) {
            throw new org.apache.kafka.common.KafkaException("tierlog RLMM could not reach its agent: "
                + e.getMessage(), e);
        }
        // Not "configured" yet: the agent creates the metadata manager in the background (it may wait for this
        // very broker), and the watcher reports in this log whether that worked and, if not, why.
        LOG.info("tierlog RLMM: the agent at {} accepted the configuration and is creating the metadata manager",
            settings.socketPath);
        TopicIdPartition probe = new TopicIdPartition(Uuid.randomUuid(), 0, "tierlog-startup-probe");
        agent.watchCreation((ch, dl) -> RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl).highestOffsetForEpoch(
            EpochQuery.newBuilder().setTopicIdPartition(ProtoMapping.toProto(probe)).setEpoch(0).build()));
    }

    private Void replayLeadership(io.grpc.ManagedChannel channel, io.grpc.Deadline deadline) {
        if (isLeader.isEmpty()) {
            return null;
        }
        LeadershipChanges.Builder changes = LeadershipChanges.newBuilder();
        isLeader.forEach((tp, leader) -> {
            if (leader) {
                changes.addLeaders(ProtoMapping.toProto(tp));
            } else {
                changes.addFollowers(ProtoMapping.toProto(tp));
            }
        });
        RemoteLogMetadataGrpc.newBlockingStub(channel).withDeadline(deadline)
            .onPartitionLeadershipChanges(changes.build());
        return null;
    }

    private AgentClient agent() {
        AgentClient a = agent;
        if (a == null) {
            throw new IllegalStateException("tierlog RLMM used before configure()");
        }
        return a;
    }

    private long timeout() {
        return agent().settings().callTimeoutMs;
    }

    /** The deadline of what the broker asks on its fetch path, where a stuck call stalls a consumer's fetch. */
    private long lookupTimeout() {
        return agent().settings().lookupTimeoutMs;
    }

    /**
     * Queues a metadata write for {@code tp}. Its kept lookup answers go now and again once the agent applied the
     * write (or failed to), so a lookup that raced with it is not kept either.
     */
    private CompletableFuture<Void> write(TopicIdPartition tp, String what, AgentClient.Rpc<?> rpc) {
        AgentClient a = agent();
        long timeoutMs = timeout();
        SegmentLookupCache kept = lookups;
        kept.invalidate(tp);
        CompletableFuture<Void> done = writes.submit(what, timeoutMs,
            deadline -> a.call(what, deadline, timeoutMs, rpc));
        done.whenComplete((ok, failure) -> kept.invalidate(tp));
        return done;
    }

    @Override
    public CompletableFuture<Void> addRemoteLogSegmentMetadata(RemoteLogSegmentMetadata metadata)
            throws RemoteStorageException {
        if (metadata.state() != RemoteLogSegmentState.COPY_SEGMENT_STARTED) {
            throw new IllegalArgumentException("addRemoteLogSegmentMetadata takes a segment in state "
                + RemoteLogSegmentState.COPY_SEGMENT_STARTED + ", got " + metadata.state() + " for "
                + metadata.remoteLogSegmentId());
        }
        return write(metadata.topicIdPartition(), "addRemoteLogSegmentMetadata(" + metadata.remoteLogSegmentId() + ")",
            (ch, dl) ->
            RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl)
                .addRemoteLogSegmentMetadata(ProtoMapping.toProto(metadata)));
    }

    @Override
    public CompletableFuture<Void> updateRemoteLogSegmentMetadata(RemoteLogSegmentMetadataUpdate update)
            throws RemoteStorageException {
        if (update.state() == RemoteLogSegmentState.COPY_SEGMENT_STARTED) {
            throw new IllegalArgumentException("updateRemoteLogSegmentMetadata does not take state "
                + RemoteLogSegmentState.COPY_SEGMENT_STARTED + " (segment " + update.remoteLogSegmentId() + ")");
        }
        return write(update.topicIdPartition(), "updateRemoteLogSegmentMetadata(" + update.remoteLogSegmentId() + ")",
            (ch, dl) ->
            RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl)
                .updateRemoteLogSegmentMetadata(ProtoMapping.toProto(update)));
    }

    @Override
    public CompletableFuture<Void> putRemotePartitionDeleteMetadata(RemotePartitionDeleteMetadata metadata)
            throws RemoteStorageException {
        return write(metadata.topicIdPartition(),
            "putRemotePartitionDeleteMetadata(" + metadata.topicIdPartition() + ")", (ch, dl) ->
            RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl)
                .putRemotePartitionDeleteMetadata(ProtoMapping.toProto(metadata)));
    }

    private static SegmentQuery segmentQuery(TopicIdPartition tp, int epoch, long offset) {
        return SegmentQuery.newBuilder().setTopicIdPartition(ProtoMapping.toProto(tp))
            .setEpoch(epoch).setOffset(offset).build();
    }

    private static Optional<RemoteLogSegmentMetadata> optional(OptionalSegment found) {
        return found.hasSegment() ? Optional.of(ProtoMapping.fromProto(found.getSegment())) : Optional.empty();
    }

    @Override
    public Optional<RemoteLogSegmentMetadata> remoteLogSegmentMetadata(TopicIdPartition tp, int epochForOffset,
                                                                       long offset) throws RemoteStorageException {
        SegmentLookupCache kept = lookups;
        if (kept.enabled()) {
            Optional<RemoteLogSegmentMetadata> answer = kept.get(tp, epochForOffset, offset);
            if (answer.isPresent()) {
                return answer;
            }
        }
        long stamp = kept.stamp();
        Optional<RemoteLogSegmentMetadata> answer = optional(agent().call("remoteLogSegmentMetadata(" + tp + ")",
            lookupTimeout(), (ch, dl) -> RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl)
                .getRemoteLogSegmentMetadata(segmentQuery(tp, epochForOffset, offset))));
        answer.ifPresent(segment -> kept.put(tp, epochForOffset, offset, segment, stamp));
        return answer;
    }

    @Override
    public Optional<Long> highestOffsetForEpoch(TopicIdPartition tp, int leaderEpoch) throws RemoteStorageException {
        OptionalOffset found = agent().call("highestOffsetForEpoch(" + tp + ")", lookupTimeout(), (ch, dl) ->
            RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl).highestOffsetForEpoch(
                EpochQuery.newBuilder().setTopicIdPartition(ProtoMapping.toProto(tp)).setEpoch(leaderEpoch).build()));
        return found.hasOffset() ? Optional.of(found.getOffset()) : Optional.empty();
    }

    private Iterator<RemoteLogSegmentMetadata> list(TopicIdPartition tp, ListQuery query)
            throws RemoteStorageException {
        return agent().call("listRemoteLogSegments(" + tp + ")", timeout(), (ch, dl) -> {
            List<RemoteLogSegmentMetadata> segments = new ArrayList<>();
            if (listAtOnce.available()) {
                SegmentList answer = listAtOnce(ch, dl, query);
                if (answer != null && !answer.getStreamInstead()) {
                    answer.getSegmentsList().forEach(m -> segments.add(ProtoMapping.fromProto(m)));
                    return segments.iterator();
                }
            }
            RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl).listRemoteLogSegments(query)
                .forEachRemaining(m -> segments.add(ProtoMapping.fromProto(m)));
            return segments.iterator();
        });
    }

    /** The listing in one answer; null from an agent without ListRemoteLogSegmentsAtOnce (then never asked again). */
    private SegmentList listAtOnce(ManagedChannel ch, Deadline dl, ListQuery query) {
        try {
            return RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl).listRemoteLogSegmentsAtOnce(query);
        } catch (StatusRuntimeException e) {
            listAtOnce.failed(e, agent().settings().socketPath);
            return null;
        }
    }

    @Override
    public Iterator<RemoteLogSegmentMetadata> listRemoteLogSegments(TopicIdPartition tp) throws RemoteStorageException {
        return list(tp, ListQuery.newBuilder().setTopicIdPartition(ProtoMapping.toProto(tp)).build());
    }

    @Override
    public Iterator<RemoteLogSegmentMetadata> listRemoteLogSegments(TopicIdPartition tp, int leaderEpoch)
            throws RemoteStorageException {
        return list(tp, ListQuery.newBuilder().setTopicIdPartition(ProtoMapping.toProto(tp))
            .setEpoch(leaderEpoch).build());
    }

    @Override
    public void onPartitionLeadershipChanges(Set<TopicIdPartition> leaderPartitions,
                                             Set<TopicIdPartition> followerPartitions) {
        leaderPartitions.forEach(tp -> isLeader.put(tp, true));
        followerPartitions.forEach(tp -> isLeader.put(tp, false));
        LeadershipChanges.Builder changes = LeadershipChanges.newBuilder();
        leaderPartitions.forEach(tp -> changes.addLeaders(ProtoMapping.toProto(tp)));
        followerPartitions.forEach(tp -> changes.addFollowers(ProtoMapping.toProto(tp)));
        try {
            agent().call("onPartitionLeadershipChanges", timeout(), (ch, dl) ->
                RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl).onPartitionLeadershipChanges(changes.build()));
        } catch (RemoteStorageException e) {
            // The interface cannot throw; the partitions are remembered and replayed when the agent is back.
            LOG.error("tierlog RLMM: leadership change not delivered to the agent yet: {}", e.getMessage());
        } finally {
            // After the call: a lookup answered while the agent applied the change is not kept either.
            leaderPartitions.forEach(lookups::invalidate);
            followerPartitions.forEach(lookups::invalidate);
        }
    }

    @Override
    public void onStopPartitions(Set<TopicIdPartition> partitions) {
        partitions.forEach(isLeader::remove);
        try {
            agent().call("onStopPartitions", timeout(), (ch, dl) ->
                RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl)
                    .onStopPartitions(ProtoMapping.toProto(partitions)));
        } catch (RemoteStorageException e) {
            LOG.error("tierlog RLMM: stop of {} not delivered to the agent: {}", partitions, e.getMessage());
        } finally {
            partitions.forEach(lookups::invalidate);
        }
    }

    @Override
    public long remoteLogSize(TopicIdPartition tp, int leaderEpoch) throws RemoteStorageException {
        return agent().call("remoteLogSize(" + tp + ")", timeout(), (ch, dl) ->
            RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl).remoteLogSize(
                EpochQuery.newBuilder().setTopicIdPartition(ProtoMapping.toProto(tp)).setEpoch(leaderEpoch).build()))
            .getBytes();
    }

    @Override
    public Optional<RemoteLogSegmentMetadata> nextSegmentWithTxnIndex(TopicIdPartition tp, int epoch, long offset)
            throws RemoteStorageException {
        return optional(agent().call("nextSegmentWithTxnIndex(" + tp + ")", lookupTimeout(), (ch, dl) ->
            RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl)
                .nextSegmentWithTxnIndex(segmentQuery(tp, epoch, offset))));
    }

    @Override
    public boolean isReady(TopicIdPartition tp) {
        try {
            return agent().call("isReady(" + tp + ")", timeout(), (ch, dl) ->
                RemoteLogMetadataGrpc.newBlockingStub(ch).withDeadline(dl).isReady(ProtoMapping.toProto(tp)))
                .getReady();
        } catch (RemoteStorageException e) {
            // Not ready is the safe answer: the broker retries later instead of acting on missing metadata.
            LOG.warn("tierlog RLMM: isReady({}) could not ask the agent: {}", tp, e.getMessage());
            return false;
        }
    }

    @Override
    public void close() throws IOException {
        lookups.invalidateAll();
        // Pending writes fail first, so no broker thread waits on a future while the channel goes away.
        PendingWrites w = writes;
        if (w != null) {
            w.close();
        }
        AgentClient a = agent;
        if (a != null) {
            a.close();
        }
    }
}
