"""Each C extension's fuzz target (tests/native/fuzz_*.py) runs for a bounded time with atheris (libFuzzer) over the
extensions built with AddressSanitizer and UndefinedBehaviorSanitizer (sanitizer.py), and finds nothing: no
sanitizer report, no crash, no answer other than the Python fallback's, no misuse accepted.

The seven runs take TIERLOG_FUZZ_SECONDS each (default 10: with start-up, about a minute together). The sanitized
build is made once per change of the sources and kept under .dev/sanitized/; each target starts from random seed
inputs of a few hundred bytes to 2 KiB (a target draws a whole run of operations from one input, which libFuzzer's
growth from empty inputs would take long to reach) and from .dev/fuzz-corpus/<target>/, where libFuzzer keeps the
inputs that reached new coverage (the newest 400), so that later runs go on from what earlier ones found. A failing
input is saved in the test's temporary directory, named in the failure, and replays with the environment
sanitizer.sanitized_env gives: `python tests/native/run_fuzz.py <target> <input file>`.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sanitizer import REPO_ROOT, REPORT_MARKERS, sanitized_build, sanitized_env

TARGETS = ("segment_lookup", "avro_reader", "slots", "digest", "packed", "record_batches", "lean_fold")
SECONDS = int(os.environ.get("TIERLOG_FUZZ_SECONDS", "10"))
CORPUS = REPO_ROOT / ".dev" / "fuzz-corpus"
SEEDS = 32
# libFuzzer first runs every input of the corpus: beyond this many (the oldest go) that would eat the run's time.
CORPUS_LIMIT = 400
# Start-up (imports under ASan) and the last input's end come on top of -max_total_time.
GRACE_S = 120


@pytest.fixture(scope="module")
def environment() -> Iterator[dict[str, str]]:
    yield sanitized_env(sanitized_build())


def _seeds(directory: Path, target: str) -> Path:
    directory.mkdir()
    rng = random.Random(target)
    for number in range(SEEDS):
        (directory / f"seed-{number}").write_bytes(rng.randbytes(rng.randint(200, 2048)))
    return directory


@pytest.mark.parametrize("target", TARGETS)
def test_fuzzing_finds_nothing_under_the_sanitizers(target: str, environment: dict[str, str],
                                                    tmp_path: Path) -> None:
    corpus = CORPUS / target
    corpus.mkdir(parents=True, exist_ok=True)
    for old in sorted(corpus.iterdir(), key=lambda path: path.stat().st_mtime)[:-CORPUS_LIMIT]:
        old.unlink()
    failures = tmp_path / "failures"
    failures.mkdir()
    command = [sys.executable, str(Path(__file__).with_name("run_fuzz.py")), target, f"-max_total_time={SECONDS}",
               "-use_value_profile=1", "-max_len=4096", "-timeout=20", "-rss_limit_mb=4096", "-print_final_stats=1",
               f"-artifact_prefix={failures}/", str(corpus), str(_seeds(tmp_path / "seeds", target))]
    result = subprocess.run(command, env=environment, cwd=tmp_path, capture_output=True, text=True,
                            timeout=SECONDS + GRACE_S)
    output = result.stdout + result.stderr
    reports = [marker for marker in REPORT_MARKERS if marker in output]
    assert result.returncode == 0 and not reports, (
        f"fuzz_{target} failed (status {result.returncode}, {reports or 'no sanitizer report'}); input saved: "
        f"{sorted(map(str, failures.iterdir()))}\n{output[-6000:]}")
    runs = [line for line in output.splitlines() if line.startswith("stat::number_of_executed_units:")]
    assert runs and int(runs[0].split(":")[-1]) > SEEDS, output[-3000:]


def test_the_sanitized_interpreter_reports_memory_errors(environment: dict[str, str]) -> None:
    # A clean fuzz run means something only if a memory error in the process would have been reported.
    overflow = "import ctypes; buffer = ctypes.create_string_buffer(8); ctypes.memmove(buffer, b'x' * 64, 64)"
    result = subprocess.run([sys.executable, "-c", overflow], env=environment, capture_output=True, text=True,
                            timeout=GRACE_S)
    assert result.returncode != 0 and "ERROR: AddressSanitizer: " in result.stderr, result.stderr[-3000:]
