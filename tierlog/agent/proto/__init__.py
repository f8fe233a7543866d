"""The agent protocol's Python code, generated from schemas/agent.proto (never committed).

In a checkout it is generated on first import and regenerated whenever the .proto is newer than the generated
modules (concurrent importers are safe); a wheel carries the modules its build generated (setup.py).
"""

from __future__ import annotations

import fcntl
import importlib
import os
import tempfile
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).resolve().parent
_CHECKOUT = _HERE.parent.parent.parent
_SCHEMAS = _CHECKOUT / "schemas"
_PROTO = "agent.proto"
_OUTPUTS = ("agent_pb2.py", "agent_pb2_grpc.py")


def _stale() -> bool:
    schema = _SCHEMAS / _PROTO
    # Only a checkout regenerates: an installed copy uses what its wheel build generated, whatever
    # schemas/ directory may happen to sit beside site-packages.
    if not ((_CHECKOUT / "pyproject.toml").is_file() and schema.exists()):
        if all((_HERE / out).exists() for out in _OUTPUTS):
            return False
        raise ImportError(
            f"the agent protocol code is not generated and {schema} is missing; install tierlog from its "
            "wheel (make dist) or from a source checkout (pip install -e .)"
        )
    source = schema.stat().st_mtime
    return any(not (_HERE / out).exists() or (_HERE / out).stat().st_mtime < source for out in _OUTPUTS)


def generate() -> None:
    """Run grpc_tools.protoc into a temporary directory, then move the modules into place atomically."""
    from grpc_tools import protoc  # a build-time dependency only: imported just when generating

    include = Path(importlib.import_module("grpc_tools").__file__ or "").parent / "_proto"
    with tempfile.TemporaryDirectory(dir=_HERE) as tmp:
        # Mapping the schemas directory to the package path makes the generated imports absolute
        # (`from tierlog.agent.proto import agent_pb2`), so they work from any working directory.
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{include}",
                f"-Itierlog/agent/proto={_SCHEMAS}",
                f"--python_out={tmp}",
                f"--grpc_python_out={tmp}",
                f"tierlog/agent/proto/{_PROTO}",
            ]
        )
        if status != 0:
            raise RuntimeError(f"grpc_tools.protoc failed ({status}) on {_SCHEMAS / _PROTO}")
        for out in _OUTPUTS:
            os.replace(Path(tmp) / "tierlog" / "agent" / "proto" / out, _HERE / out)


def _ensure_generated() -> None:
    if not _stale():
        return
    # Locking this very file avoids leaving a lock file next to it.
    with open(__file__, "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stale():
            generate()


_ensure_generated()

agent_pb2: ModuleType = importlib.import_module("tierlog.agent.proto.agent_pb2")
agent_pb2_grpc: ModuleType = importlib.import_module("tierlog.agent.proto.agent_pb2_grpc")

__all__ = ["agent_pb2", "agent_pb2_grpc", "generate"]
