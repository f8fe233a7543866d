"""Moving a cluster between Kafka's TopicBasedRemoteLogMetadataManager and tierlog: the translation of Kafka's
`__remote_log_metadata` records into tierlog writes, and the dual-write migration mode a node runs during a roll.
"""
