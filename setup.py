"""Wheel build steps pyproject.toml cannot express: the wheel carries the Avro schemas (as rlmm/schemas/),
the agent protocol's generated Python code, and the Kafka plugin jar (as tierlog/jars/), all taken from the
checkout's top-level schemas/ and jvm/ so each has one source for both languages. It also compiles the fetch
path's lookup (rlmm/_segment_lookup.c), a rebuild's Avro reader (rlmm/_avro_reader.c) and object builder
(rlmm/_slots.c), and the view digest's framing (rlmm/_digest.c) in C, all optional: without a C compiler the wheel is
pure Python and answers alike.

An editable install (`pip install -e .`) copies nothing: the packages then find schemas/ and jvm/target/
in the checkout itself.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SCHEMAS = ROOT / "schemas"
JVM = ROOT / "jvm"
JAR_NAME = "tierlog-kafka-plugin.jar"


def _plugin_jar() -> Path:
    """The shaded jar Maven builds, rebuilt when missing or older than its sources or the protocol."""
    built = sorted(p for p in (JVM / "target").glob("tierlog-kafka-plugin-*.jar") if not p.name.startswith("original-"))
    sources = [JVM / "pom.xml", *JVM.joinpath("src", "main").rglob("*"), *SCHEMAS.glob("*.proto")]
    newest = max(p.stat().st_mtime for p in sources if p.is_file())
    if not built or built[-1].stat().st_mtime < newest:
        if shutil.which("mvn") is None:
            raise SystemExit("building the tierlog wheel needs Maven (mvn) and Java 17+ to build the plugin jar")
        subprocess.run(["mvn", "-q", "-B", "-f", str(JVM / "pom.xml"), "package", "-DskipTests"], check=True)
        built = sorted(p for p in (JVM / "target").glob("tierlog-kafka-plugin-*.jar")
                       if not p.name.startswith("original-"))
    if not built:
        raise SystemExit(f"Maven built no tierlog-kafka-plugin-*.jar in {JVM / 'target'}")
    return built[-1]


def _generate_protocol(out_dir: Path) -> None:
    """The agent's gRPC modules, generated with the same import path as tierlog.agent.proto does in a checkout."""
    from grpc_tools import protoc

    include = Path(importlib.import_module("grpc_tools").__file__ or "").parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        status = protoc.main([
            "grpc_tools.protoc", f"-I{include}", f"-Itierlog/agent/proto={SCHEMAS}",
            f"--python_out={tmp}", f"--grpc_python_out={tmp}", "tierlog/agent/proto/agent.proto",
        ])
        if status != 0:
            raise SystemExit(f"grpc_tools.protoc failed ({status}) on {SCHEMAS / 'agent.proto'}")
        for generated in Path(tmp, "tierlog", "agent", "proto").glob("*.py"):
            shutil.copy2(generated, out_dir / generated.name)


class BuildWithArtifacts(build_py):
    """build_py plus the schemas, the generated protocol code and the plugin jar."""

    def run(self) -> None:
        lib = Path(self.build_lib)
        if not self.editable_mode:
            # An in-tree build/ keeps modules the checkout has since removed; the wheel must not carry them.
            shutil.rmtree(lib, ignore_errors=True)
        super().run()
        if self.editable_mode:
            return
        schemas = lib / "rlmm" / "schemas"
        schemas.mkdir(parents=True, exist_ok=True)
        for avsc in SCHEMAS.glob("*.avsc"):
            shutil.copy2(avsc, schemas / avsc.name)
        _generate_protocol(lib / "tierlog" / "agent" / "proto")
        jars = lib / "tierlog" / "jars"
        jars.mkdir(parents=True, exist_ok=True)
        shutil.copy2(_plugin_jar(), jars / JAR_NAME)


setup(
    cmdclass={"build_py": BuildWithArtifacts},
    # optional: a failed compile is a warning, and rlmm.manager then answers lookups in Python.
    ext_modules=[Extension(f"rlmm.{name}", [f"rlmm/{name}.c"], optional=True, extra_compile_args=["-O2"])
                 for name in ("_segment_lookup", "_avro_reader", "_slots", "_digest", "_record_batches",
                              "_lean_fold")],
)
