/*
 * The broker must reach our code for every method of Kafka's plugin interfaces, default methods included:
 * an inherited default (isReady, nextSegmentWithTxnIndex) would silently answer for us.
 */
package dev.tierlog.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.apache.kafka.server.log.remote.metadata.storage.ClassLoaderAwareRemoteLogMetadataManager;
import org.apache.kafka.server.log.remote.storage.ClassLoaderAwareRemoteStorageManager;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadataManager;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;
import org.junit.jupiter.api.Test;

class InterfaceCoverageTest {

    /** Interface methods (defaults included, inherited Configurable/Closeable too) that {@code impl} does not declare. */
    private static List<String> undeclared(Class<?> iface, Class<?> impl) {
        List<String> missing = new ArrayList<>();
        for (Method m : iface.getMethods()) {
            if (Modifier.isStatic(m.getModifiers())) {
                continue;
            }
            try {
                Method declared = impl.getDeclaredMethod(m.getName(), m.getParameterTypes());
                if (declared.isBridge() || declared.isSynthetic()) {
                    missing.add(m.toString());
                }
            } catch (NoSuchMethodException e) {
                missing.add(m.getName() + Arrays.toString(m.getParameterTypes()));
            }
        }
        return missing;
    }

    @Test
    void metadataManagerDeclaresEveryInterfaceMethod() {
        assertEquals(List.of(), undeclared(RemoteLogMetadataManager.class, TierlogRemoteLogMetadataManager.class));
    }

    @Test
    void storageManagerDeclaresEveryInterfaceMethod() {
        assertEquals(List.of(), undeclared(RemoteStorageManager.class, TierlogRemoteStorageManager.class));
    }

    // The broker wraps a plugin loaded through remote.log.*.class.path in these classes; a method they
    // left to the interface default would never reach us, however complete our classes are.
    @Test
    void brokersClassLoaderAwareMetadataWrapperForwardsEveryMethod() {
        assertEquals(List.of(),
            undeclared(RemoteLogMetadataManager.class, ClassLoaderAwareRemoteLogMetadataManager.class));
    }

    @Test
    void brokersClassLoaderAwareStorageWrapperForwardsEveryMethod() {
        assertEquals(List.of(),
            undeclared(RemoteStorageManager.class, ClassLoaderAwareRemoteStorageManager.class));
    }
}
