"""Types of the optional C extension rlmm/_segment_lookup.c (the fetch path's segment lookup)."""

from collections.abc import Callable
from typing import Any

class SegmentLookup:
    """Called as the manager's remote_log_segment_metadata(tp, leader_epoch, offset): answers a served partition's
    lookup from the read model in C and hands every other call, unchanged, to `fallback`."""

    fallback: Callable[..., Any]

    def __init__(self, readable_now: dict[tuple[int, int], Any], halted: dict[int, Any], tp_type: type,
                 fallback: Callable[..., Any]) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
