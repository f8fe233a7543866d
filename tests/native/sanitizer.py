"""The C extensions built with AddressSanitizer and UndefinedBehaviorSanitizer, and how to run Python over them.

The build goes through setup.py (the same extensions, the same flags, plus the sanitizers and comparison tracing)
into a directory of its own under .dev/sanitized/, keyed by the sources, setup.py, the flags, the compiler and the
interpreter: the checkout's rlmm/*.so are never touched, and later runs reuse it. Beside the extensions it links
atheris's libFuzzer (the archive its wheel ships) into a library of its own.

The interpreter itself is not instrumented, so it runs with libraries preloaded: that libFuzzer first (its coverage
hooks must win over the sanitizer runtime's empty ones, or atheris sees no coverage), then gcc's libasan (whose
malloc then replaces libc's everywhere; its check that it comes first is turned off) and the C++ runtime (ASan
intercepts the C++ exceptions atheris ends a failed input with only if it is there from the start). PYTHONMALLOC=malloc
sends every object to ASan's allocator (pymalloc's arenas would hide a freed object), and leak detection is off
(CPython keeps objects alive until exit by design).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = ("_segment_lookup", "_avro_reader", "_slots", "_digest", "_record_batches", "_lean_fold")
SANITIZE = "-fsanitize=address,undefined -fno-omit-frame-pointer"
# trace-cmp: the extensions' comparisons reach libFuzzer (with -use_value_profile=1), guiding it inside the C code.
CFLAGS = f"{SANITIZE} -fsanitize-coverage=trace-cmp -g"
BUILD_ROOT = REPO_ROOT / ".dev" / "sanitized"
BUILD_TIMEOUT_S = 300
LIBFUZZER = "libfuzzer.so"
# halt_on_error: a UBSan finding ends the run like an ASan one (gcc's UBSan checks otherwise recover and go on).
ASAN_OPTIONS = "detect_leaks=0:halt_on_error=1:abort_on_error=0:verify_asan_link_order=0:print_summary=1"
UBSAN_OPTIONS = "halt_on_error=1:print_stacktrace=1"
# What a sanitizer writes when it finds something (the process also ends with a failure status).
REPORT_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: UndefinedBehaviorSanitizer")


def _gcc(*args: str) -> str:
    if shutil.which("gcc") is None:
        raise RuntimeError("the sanitizer build needs gcc (with libasan and libubsan) on PATH")
    return subprocess.run(["gcc", *args], capture_output=True, text=True, check=True).stdout.strip()


def _gcc_library(name: str) -> Path:
    found = Path(_gcc(f"-print-file-name={name}"))
    if not found.is_absolute() or not found.exists():
        raise RuntimeError(f"gcc has no {name} ({found}): install gcc's sanitizer runtime (libasan8 on Debian)")
    return found.resolve()


def _libfuzzer_archive() -> Path:
    spec = importlib.util.find_spec("atheris")
    if spec is None or spec.origin is None:
        raise RuntimeError("the fuzz targets need atheris (the project's dev extra: pip install -e '.[dev]')")
    archive = Path(spec.origin).parent.parent / "libclang_rt.fuzzer_no_main.a"
    if not archive.is_file():
        raise RuntimeError(f"atheris ships no libFuzzer archive at {archive}")
    return archive


def _build_key() -> str:
    digest = hashlib.sha256()
    for source in [REPO_ROOT / "setup.py", *(REPO_ROOT / "rlmm" / f"{name}.c" for name in EXTENSIONS),
                   _libfuzzer_archive()]:
        digest.update(source.read_bytes())
    digest.update(f"{CFLAGS}|{_gcc('--version')}|{sys.version}".encode())
    return digest.hexdigest()[:16]


def _complete(build: Path) -> bool:
    return (build / LIBFUZZER).is_file() and all(any(build.glob(f"{name}.*.so")) for name in EXTENSIONS)


def _run(command: list[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed (status {result.returncode}):\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def sanitized_build() -> Path:
    """The directory holding the sanitized rlmm extensions and libFuzzer (built now, or earlier from the same
    sources)."""
    build = BUILD_ROOT / _build_key()
    if _complete(build):
        return build
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    with (BUILD_ROOT / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two workers of one test run build once
        if _complete(build):
            return build
        with tempfile.TemporaryDirectory(dir=BUILD_ROOT) as scratch:
            _run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", f"{scratch}/lib",
                  "--build-temp", f"{scratch}/tmp"], env={**os.environ, "CFLAGS": CFLAGS, "LDFLAGS": SANITIZE})
            made = Path(scratch, "lib", "rlmm")
            _run(["gcc", "-shared", "-o", str(made / LIBFUZZER), "-Wl,--whole-archive", str(_libfuzzer_archive()),
                  "-Wl,--no-whole-archive", "-lstdc++", "-lm", "-lpthread"])
            if not _complete(made):  # the extensions are optional in setup.py: a failed compile only warns
                raise RuntimeError(f"the sanitized build made only {sorted(p.name for p in made.iterdir())}")
            for stale in BUILD_ROOT.iterdir():  # builds of older sources
                if stale.is_dir() and stale.name != Path(scratch).name:
                    shutil.rmtree(stale, ignore_errors=True)
            made.rename(build)
    return build


def sanitized_env(build: Path) -> dict[str, str]:
    """The environment of a Python process that loads the sanitized extensions of `build` (tests/native/run_fuzz.py
    loads them from TIERLOG_SANITIZED_EXTENSIONS)."""
    preloads = [build / LIBFUZZER, _gcc_library("libasan.so"), _gcc_library("libstdc++.so.6")]
    return {
        **os.environ,
        "LD_PRELOAD": " ".join(map(str, preloads)),
        "ASAN_OPTIONS": ASAN_OPTIONS,
        "UBSAN_OPTIONS": UBSAN_OPTIONS,
        "PYTHONMALLOC": "malloc",
        "TIERLOG_SANITIZED_EXTENSIONS": str(build),
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(Path(__file__).parent)]),
    }
