/*
 * An agent call the adapter uses where the agent serves it and does without where it does not (an older agent answers
 * UNIMPLEMENTED): the first such answer is recorded, with one INFO line saying what the adapter does instead, and the
 * call is not made again.
 */
package dev.tierlog.kafka;

import java.util.concurrent.atomic.AtomicBoolean;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

final class OptionalCall {
    private static final Logger LOG = LoggerFactory.getLogger(OptionalCall.class);

    private final String description;
    private final String instead;
    private final AtomicBoolean unimplemented = new AtomicBoolean();

    /** `description`: what the agent does not do ("serve segment files"); `instead`: what the adapter then does. */
    OptionalCall(String description, String instead) {
        this.description = description;
        this.instead = instead;
    }

    boolean available() {
        return !unimplemented.get();
    }

    /** Rethrows `e` unless it says the agent at `socket` lacks the call, which is then recorded (and logged once). */
    void failed(StatusRuntimeException e, Object socket) {
        if (e.getStatus().getCode() != Status.Code.UNIMPLEMENTED) {
            throw e;
        }
        if (unimplemented.compareAndSet(false, true)) {
            LOG.info("The tierlog agent at {} does not {} (an older agent); {}", socket, description, instead);
        }
    }
}
