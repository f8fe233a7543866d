"""Runs one fuzz target (tests/native/fuzz_<name>.py) with atheris (libFuzzer) over the extensions in
TIERLOG_SANITIZED_EXTENSIONS (see sanitizer.py), or over the checkout's build when that is unset.

    run_fuzz.py <name> [libFuzzer flags, e.g. -max_total_time=10 corpus_dir]

Each target module defines `one_input(data: bytes) -> None`, which raises (AssertionError) when the C extension
answers other than its Python fallback, or misuse is not refused with TypeError or ValueError. A sanitizer report,
a crash or an exception ends the run with a failure status and the input saved (libFuzzer's -artifact_prefix).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

EXTENSIONS = ("_segment_lookup", "_avro_reader", "_slots", "_digest", "_record_batches", "_lean_fold")
# Per target, the module holding the Python code its extension must agree with, and what the target imports.
FALLBACKS = {"segment_lookup": "rlmm.read_model", "avro_reader": "rlmm.codec", "slots": "rlmm.types",
             "digest": "rlmm.state", "packed": "rlmm.packed", "record_batches": "rlmm.raw_fetch",
             "lean_fold": "rlmm.lean_fold"}


def load_extensions(directory: Path) -> None:
    """Puts the extensions built in `directory` in sys.modules before rlmm is imported, which then uses them."""
    for name in EXTENSIONS:
        (path,) = directory.glob(f"{name}.*.so")
        spec = importlib.util.spec_from_file_location(f"rlmm.{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[f"rlmm.{name}"] = module


def main() -> None:
    target = sys.argv.pop(1)
    extensions = os.environ.get("TIERLOG_SANITIZED_EXTENSIONS")
    if extensions:
        load_extensions(Path(extensions))
    import atheris

    # Coverage guidance from the Python side: the target's own code, which shapes the inputs. The package is
    # imported first, outside atheris's import hook, which slows every import under the sanitizers.
    importlib.import_module(FALLBACKS[target])
    with atheris.instrument_imports(include=[f"fuzz_{target}"]):
        module = importlib.import_module(f"fuzz_{target}")
    from rlmm import codec, lean_fold, raw_fetch, state, types

    loaded = {name: str(importlib.import_module(f"rlmm.{name}").__file__) for name in EXTENSIONS}
    # The sanitized build, not the checkout's, in the modules that use them: else a clean run would prove nothing.
    assert (types._slots, codec._avro_reader, state._digest, raw_fetch._record_batches, lean_fold._lean_fold) == tuple(
        sys.modules[f"rlmm.{name}"] for name in ("_slots", "_avro_reader", "_digest", "_record_batches", "_lean_fold")
    ), loaded
    if extensions:
        assert all(Path(path).parent == Path(extensions) for path in loaded.values()), loaded
    print(f"fuzz_{target}: extensions {loaded}", file=sys.stderr)
    atheris.Setup(sys.argv, module.one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
