"""Shared setup of the rlmm tests: puts `tests/` on sys.path so `support.*` imports.

Helpers shared by several test modules live in rlmm_testkit.py next to this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

# tests/support is shared by test packages that are not importable packages themselves.
_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)
