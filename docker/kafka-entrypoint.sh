#!/bin/sh
# Formats the single KRaft node's storage on first start, then runs the broker (which starts the tierlog agent).
set -eu
CONFIG=/etc/tierlog/server.properties
if [ ! -f /var/lib/kafka/data/meta.properties ]; then
    kafka-storage.sh format --cluster-id "${KAFKA_CLUSTER_ID:-tierlogdockerdemo00000}" --config "$CONFIG"
fi
exec kafka-server-start.sh "$CONFIG"
