"""The RSM's own value types: Kafka's IndexType and LogSegmentData, in snake_case.

Everything else (segment ids, segment metadata) is reused from rlmm.types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from rlmm.errors import InvalidArgumentError


class IndexType(enum.IntEnum):
    """Kafka's RemoteStorageManager.IndexType; the values are Kafka's ordinals."""

    OFFSET = 0
    TIMESTAMP = 1
    PRODUCER_SNAPSHOT = 2
    TRANSACTION = 3
    LEADER_EPOCH = 4


def _require_path(name: str, value: object) -> Path:
    if isinstance(value, str):
        value = Path(value)
    if not isinstance(value, Path):
        raise InvalidArgumentError(f"LogSegmentData.{name} must be a Path, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class LogSegmentData:
    """The files of one rolled segment, as the broker hands them to copy_log_segment_data.

    `leader_epoch_index` is the checkpoint text as bytes (`0\\n<n>\\n<epoch> <offset>\\n...`).
    """

    log_segment: Path
    offset_index: Path
    time_index: Path
    transaction_index: Path | None
    producer_snapshot_index: Path
    leader_epoch_index: bytes

    def __post_init__(self) -> None:
        # A broker (or the JVM adapter) may pass str paths; normalize so later code sees one type.
        for name in ("log_segment", "offset_index", "time_index", "producer_snapshot_index"):
            object.__setattr__(self, name, _require_path(name, getattr(self, name)))
        if self.transaction_index is not None:
            object.__setattr__(
                self, "transaction_index", _require_path("transaction_index", self.transaction_index)
            )
        if isinstance(self.leader_epoch_index, (bytearray, memoryview)):
            object.__setattr__(self, "leader_epoch_index", bytes(self.leader_epoch_index))
        if not isinstance(self.leader_epoch_index, bytes):
            raise InvalidArgumentError(
                "LogSegmentData.leader_epoch_index must be bytes, "
                f"got {type(self.leader_epoch_index).__name__}"
            )

    def files(self) -> tuple[Path, ...]:
        """Every file the copy reads (the leader-epoch checkpoint travels as bytes)."""
        optional = () if self.transaction_index is None else (self.transaction_index,)
        return (self.log_segment, self.offset_index, self.time_index, self.producer_snapshot_index, *optional)


__all__ = ["IndexType", "LogSegmentData"]
