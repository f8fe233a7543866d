"""Development services for tierlog: real Kafka and real S3 (SeaweedFS) on 127.0.0.1.

Importable by tests (`import dev.kafka`, `import dev.s3`); `dev/services` is the command-line front end.
"""
