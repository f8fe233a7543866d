"""The applier fixes glibc's mmap threshold (rlmm.applier._fix_mmap_threshold): after a backlog's large tables are
freed, a block of 1 MiB or more still gets a mapping of its own, returned to the OS when freed, instead of a stretch
of the heap that stays with the process. Each case runs in a process of its own, since the setting is per process."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Allocates and frees an 8 MiB block (glibc maps it, and on its free raises the threshold to 8 MiB unless fixed), then
# counts the anonymous mappings a new 4 MiB block adds.
PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
from rlmm import applier
if sys.argv[2] == "fix":
    applier._fix_mmap_threshold()

def mappings():
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if len(line.split()) == 5
                   and int(line.split()[0].split("-")[1], 16) - int(line.split()[0].split("-")[0], 16) >= 4 << 20)

big = bytearray(8 << 20)
del big
before = mappings()
block = bytearray(4 << 20)
print(mappings() - before)
"""

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")


def _new_mappings(mode: str, **env: str) -> int:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    result = subprocess.run([sys.executable, "-c", PROBE, str(ROOT), mode], capture_output=True, text=True,
                            timeout=60, env={**environment, **env}, check=True)
    return int(result.stdout.strip())


def test_glibc_left_alone_serves_a_large_block_from_the_heap_after_a_larger_one_was_freed() -> None:
    assert _new_mappings("leave") == 0


def test_with_the_threshold_fixed_a_large_block_gets_a_mapping_of_its_own() -> None:
    assert _new_mappings("fix") == 1


def test_a_threshold_the_process_was_started_with_is_kept() -> None:
    assert _new_mappings("fix", MALLOC_MMAP_THRESHOLD_=str(64 << 20)) == 0
