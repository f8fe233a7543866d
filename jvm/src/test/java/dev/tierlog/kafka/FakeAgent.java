/*
 * A stand-in for the Python agent, run as a process of its own by the supervision tests: it answers the RPCs
 * those tests make, and a test stops it (SIGSTOP) to produce the fault a real agent cannot on demand, a hang.
 * serve() runs one in the test's JVM with a storage (and metadata) service of the test's (the segment files and
 * RLMM lookup tests).
 */
package dev.tierlog.kafka;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;

import com.google.protobuf.ByteString;

import io.grpc.BindableService;
import io.grpc.Server;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.stub.StreamObserver;

import dev.tierlog.kafka.proto.AgentGrpc;
import dev.tierlog.kafka.proto.Chunk;
import dev.tierlog.kafka.proto.CloseRequest;
import dev.tierlog.kafka.proto.ConfigureRequest;
import dev.tierlog.kafka.proto.Empty;
import dev.tierlog.kafka.proto.EpochQuery;
import dev.tierlog.kafka.proto.FetchIndexRequest;
import dev.tierlog.kafka.proto.HealthResponse;
import dev.tierlog.kafka.proto.OptionalOffset;
import dev.tierlog.kafka.proto.OptionalSegment;
import dev.tierlog.kafka.proto.Ready;
import dev.tierlog.kafka.proto.RemoteLogMetadataGrpc;
import dev.tierlog.kafka.proto.RemoteStorageGrpc;
import dev.tierlog.kafka.proto.SegmentQuery;
import dev.tierlog.kafka.proto.TopicIdPartition;

/** {@code FakeAgent --socket PATH [--parent-pid PID] [adapter flags it ignores]}. */
public final class FakeAgent {
    /** The bytes every fetched index holds. */
    static final ByteString INDEX = ByteString.copyFromUtf8("fake index");
    static final long SLOW_FETCH_MS = 3_000;

    private FakeAgent() {
    }

    /** While this file exists beside the socket, fetchIndex answers only after SLOW_FETCH_MS: slow storage. */
    static Path slowMarker(Path socket) {
        return Path.of(socket + ".slow");
    }

    public static void main(String[] args) throws Exception {
        List<String> argv = List.of(args);
        Path socket = Path.of(argv.get(argv.indexOf("--socket") + 1));
        int parent = argv.indexOf("--parent-pid");
        if (parent >= 0) {
            // As the real agent does: never outlive the broker (here, the test JVM).
            ProcessHandle.of(Long.parseLong(argv.get(parent + 1)))
                .ifPresent(p -> p.onExit().thenRun(() -> Runtime.getRuntime().halt(0)));
        }
        serve(socket, new Storage(socket)).server().awaitTermination();
    }

    /** A fake agent serving on a socket; closing it stops the server and its event loop. */
    record Running(Server server, EpollEventLoopGroup loop) implements AutoCloseable {
        @Override
        public void close() throws InterruptedException {
            server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
            loop.shutdownGracefully(0, 1, TimeUnit.SECONDS);
        }
    }

    /** A started fake agent on {@code socket} whose RemoteStorage service is {@code storage}. */
    static Running serve(Path socket, BindableService storage) throws IOException {
        return serve(socket, new Metadata(), storage);
    }

    /** As above, with the RemoteLogMetadata service {@code metadata} (the RLMM tests). */
    static Running serve(Path socket, BindableService metadata, BindableService storage) throws IOException {
        Files.deleteIfExists(socket);
        EpollEventLoopGroup loop = new EpollEventLoopGroup(1);
        Server server = NettyServerBuilder.forAddress(new DomainSocketAddress(socket.toFile()))
            .bossEventLoopGroup(loop)
            .workerEventLoopGroup(loop)
            .channelType(EpollServerDomainSocketChannel.class)
            .addService(new Lifecycle())
            .addService(metadata)
            .addService(storage)
            .build()
            .start();
        return new Running(server, loop);
    }

    private static <T> void answer(StreamObserver<T> observer, T value) {
        observer.onNext(value);
        observer.onCompleted();
    }

    private static final class Lifecycle extends AgentGrpc.AgentImplBase {
        @Override
        public void configure(ConfigureRequest request, StreamObserver<Empty> observer) {
            answer(observer, Empty.getDefaultInstance());
        }

        @Override
        public void close(CloseRequest request, StreamObserver<Empty> observer) {
            answer(observer, Empty.getDefaultInstance());
        }

        @Override
        public void health(Empty request, StreamObserver<HealthResponse> observer) {
            answer(observer, HealthResponse.newBuilder().setServing(true).setPid(ProcessHandle.current().pid()).build());
        }
    }

    private static final class Metadata extends RemoteLogMetadataGrpc.RemoteLogMetadataImplBase {
        @Override
        public void highestOffsetForEpoch(EpochQuery request, StreamObserver<OptionalOffset> observer) {
            answer(observer, OptionalOffset.newBuilder().setOffset(41).build());
        }

        @Override
        public void getRemoteLogSegmentMetadata(SegmentQuery request, StreamObserver<OptionalSegment> observer) {
            answer(observer, OptionalSegment.getDefaultInstance());
        }

        @Override
        public void isReady(TopicIdPartition request, StreamObserver<Ready> observer) {
            answer(observer, Ready.newBuilder().setReady(true).build());
        }
    }

    private static final class Storage extends RemoteStorageGrpc.RemoteStorageImplBase {
        private final Path socket;

        Storage(Path socket) {
            this.socket = socket;
        }

        @Override
        public void fetchIndex(FetchIndexRequest request, StreamObserver<Chunk> observer) {
            if (Files.exists(slowMarker(socket))) {
                try {
                    TimeUnit.MILLISECONDS.sleep(SLOW_FETCH_MS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            answer(observer, Chunk.newBuilder().setData(INDEX).build());
        }
    }
}
