"""Moving a cluster between Kafka's TopicBasedRemoteLogMetadataManager and tierlog: the translation of Kafka's
`__remote_log_metadata` records into tierlog writes, and the migration mode (`migration.mode=dual-write`: every event
ends up in both stores, in one order) a node runs during a roll, with its metrics.
"""
