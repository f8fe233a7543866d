"""Building the SparkSession every pipeline job runs in: local[*] by default, a cluster under spark-submit.

Spark's own Avro reader and the s3a filesystem come either from a local directory of jars
(TIERLOG_SPARK_JARS_DIR: an air-gapped host copies them there once, see `local_jars`) or from Maven
Central through Ivy, cached per user in ~/.cache/tierlog/ivy (over a gigabyte with the AWS SDK bundle, so
every checkout shares one copy). A quiet session sends the JVM's output (Ivy's resolution report, log4j)
to ~/.cache/tierlog/spark.log instead of the terminal. pyspark (the `spark` extra) is imported only when a
session is built: the settings here serve the in-process jobs of an install without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# spark-avro is published per Spark release, but Maven Central can lag the PyPI wheel; a job may pin
# another build with TIERLOG_SPARK_AVRO_VERSION. 4.1.1 is the newest build found on Central that the
# bundled Spark loads.
DEFAULT_SPARK_AVRO_VERSION = "4.1.1"
DEFAULT_IVY_DIR = Path.home() / ".cache" / "tierlog" / "ivy"
DEFAULT_SPARK_LOG = Path.home() / ".cache" / "tierlog" / "spark.log"
JARS_DIR_ENV = "TIERLOG_SPARK_JARS_DIR"


@dataclass(frozen=True, slots=True)
class S3Settings:
    """Where an s3:// location lives and how to reach it (SeaweedFS in tests, AWS in production)."""

    endpoint: str | None
    access_key: str | None
    secret_key: str | None
    region: str = "us-east-1"

    @classmethod
    def from_env(cls) -> S3Settings:
        return cls(
            endpoint=os.environ.get("S3_ENDPOINT"),
            access_key=os.environ.get("S3_ACCESS_KEY"),
            secret_key=os.environ.get("S3_SECRET_KEY"),
            region=os.environ.get("S3_REGION", "us-east-1"),
        )


def hadoop_version() -> str:
    """The Hadoop version the pyspark wheel bundles: hadoop-aws must match it exactly."""
    from pyspark.find_spark_home import _find_spark_home

    jars = Path(_find_spark_home()) / "jars"
    for jar in sorted(jars.glob("hadoop-client-api-*.jar")):
        return jar.stem.removeprefix("hadoop-client-api-")
    raise RuntimeError(f"no hadoop-client-api jar under {jars}: is pyspark installed completely?")


def spark_packages(with_s3: bool) -> list[str]:
    avro_version = os.environ.get("TIERLOG_SPARK_AVRO_VERSION", DEFAULT_SPARK_AVRO_VERSION)
    packages = [f"org.apache.spark:spark-avro_2.13:{avro_version}"]
    if with_s3:
        packages.append(f"org.apache.hadoop:hadoop-aws:{hadoop_version()}")
    return packages


def get_spark(
    app_name: str = "tierlog",
    master: str | None = None,
    s3: S3Settings | None = None,
    ivy_dir: Path | None = None,
    quiet: bool = False,
) -> SparkSession:
    """The active session if one exists (spark-submit, tests), else a new one.

    Under spark-submit the master and packages come from the submit command; run directly, the job
    gets `local[*]` (or `master`) and its packages from TIERLOG_SPARK_JARS_DIR, else fetches them itself.
    `quiet` keeps the JVM's output out of the terminal (in DEFAULT_SPARK_LOG).
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    # spark-submit starts Python with a gateway already open; its --master and --packages then rule.
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master or not under_submit:
        builder = builder.master(master or os.environ.get("TIERLOG_SPARK_MASTER", "local[*]"))
    if not under_submit:
        # Under spark-submit the JVM is already running: packages must come from its --packages.
        jars_dir = os.environ.get(JARS_DIR_ENV)
        if jars_dir:
            builder = builder.config("spark.jars", ",".join(local_jars(Path(jars_dir), with_s3=s3 is not None)))
        else:
            ivy = ivy_dir or Path(os.environ.get("TIERLOG_IVY_DIR", DEFAULT_IVY_DIR))
            ivy.mkdir(parents=True, exist_ok=True)
            builder = builder.config(
                "spark.jars.packages", ",".join(spark_packages(with_s3=s3 is not None))
            ).config("spark.jars.ivy", str(ivy))
        # Spark's Python workers run `python3` from PATH unless told otherwise: outside an activated virtualenv
        # that is another interpreter, without tierlog's dependencies. Run them on this one. PySpark's context
        # reads PYSPARK_PYTHON from the environment (not the spark.pyspark.python setting) when it starts.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # Small jobs on a small box: the default 200 shuffle partitions cost more than they give.
        builder = builder.config(
            "spark.sql.shuffle.partitions", os.environ.get("TIERLOG_SHUFFLE_PARTITIONS", "8")
        )
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if s3 is not None:
        builder = _with_s3a(builder, s3)
    if not quiet:
        return builder.getOrCreate()
    with _jvm_output_to(DEFAULT_SPARK_LOG):
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def local_jars(directory: Path, with_s3: bool) -> list[str]:
    """Every jar in `directory`, which must hold spark-avro (and hadoop-aws for S3) with their dependencies:
    what Ivy put in `<ivy dir>/jars` on a connected host, copied once to the air-gapped one."""
    jars = sorted(str(p) for p in directory.glob("*.jar"))
    for package in spark_packages(with_s3):
        artifact = package.split(":")[1]
        if not any(artifact in Path(jar).name for jar in jars):
            raise FileNotFoundError(
                f"{JARS_DIR_ENV}={directory} holds no {artifact} jar: copy the jars of {package} and its "
                f"dependencies there (a connected host that ran a Spark job has them in {DEFAULT_IVY_DIR / 'jars'})"
            )
    return jars


@contextmanager
def _jvm_output_to(log: Path) -> Iterator[None]:
    """Spark's JVM inherits file descriptors 1 and 2 when it starts: point them at `log` for that moment,
    so the JVM writes there for its whole life while Python's stdout and stderr stay where they were."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with log.open("ab") as handle:
            for fd in saved:
                os.dup2(handle.fileno(), fd)
        yield
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def _with_s3a(builder: SparkSession.Builder, s3: S3Settings) -> SparkSession.Builder:
    prefix = "spark.hadoop.fs.s3a."
    builder = builder.config(prefix + "impl", "org.apache.hadoop.fs.s3a.S3AFileSystem")
    builder = builder.config(prefix + "endpoint.region", s3.region)
    if s3.endpoint:
        parsed = urlparse(s3.endpoint)
        builder = (
            builder.config(prefix + "endpoint", s3.endpoint)
            .config(prefix + "path.style.access", "true")
            .config(prefix + "connection.ssl.enabled", str(parsed.scheme == "https").lower())
        )
    if s3.access_key and s3.secret_key:
        builder = (
            builder.config(prefix + "access.key", s3.access_key)
            .config(prefix + "secret.key", s3.secret_key)
            .config(
                prefix + "aws.credentials.provider",
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            )
        )
    return builder


def spark_path(location: str) -> str:
    """A location as Spark's Hadoop filesystems spell it: s3:// becomes s3a://, a bare path absolute."""
    if location.startswith("s3://"):
        return "s3a://" + location.removeprefix("s3://")
    if "://" in location:
        return location
    return Path(location).resolve().as_uri()
