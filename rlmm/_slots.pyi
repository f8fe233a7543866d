"""Types of the optional C extension rlmm/_slots.c (builds slotted instances; rlmm.types.slot_maker uses it)."""

from collections.abc import Callable
from typing import Any

def maker(cls: type[Any], fields: tuple[str, ...]) -> Callable[..., Any]: ...
