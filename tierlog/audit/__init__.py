"""The audit archiver: copies every metadata record into Avro container files in the bucket."""
