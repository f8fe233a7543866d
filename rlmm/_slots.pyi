"""Types of the optional C extension rlmm/_slots.c (builds slotted instances; rlmm.types.slot_maker uses it)."""

from collections.abc import Callable
from typing import Any

def maker(cls: type[Any], fields: tuple[str, ...]) -> Callable[..., Any]: ...
def unpacker(make_segment: Callable[..., Any], make_segment_id: Callable[..., Any], make_uuid: Callable[..., Any],
             make_epochs: Callable[..., Any], states: tuple[Any, ...], safety: Any,
             fallback: Callable[[bytes, Any], Any]) -> Callable[[bytes, Any], Any]: ...
