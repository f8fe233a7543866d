"""What blocks `tierlog migrate finalize`: a broker that never announced migration mode, one whose heartbeat stopped
(rolled back, or its agent down), one not in dual-write state, and a TBRLMM write after the last node came up."""

from __future__ import annotations

from tierlog.cli.migrate import finalize_blockers
from tierlog.migration.control import DUAL_WRITE, Announcement, ControlState

NOW = 1_800_000_000_000
MAX_AGE = 30_000


def _control(*nodes: Announcement) -> ControlState:
    return ControlState(nodes={a.broker_id: a for a in nodes})


def _fresh(broker: int, started: int = NOW - 60_000) -> Announcement:
    return Announcement(broker, DUAL_WRITE, started, NOW - 1000)


def test_every_broker_announced_and_fresh_blocks_nothing() -> None:
    assert finalize_blockers([0, 1, 2], _control(_fresh(0), _fresh(1), _fresh(2)), {1: NOW - 120_000}, NOW,
                             MAX_AGE) == []


def test_a_broker_that_never_announced_blocks() -> None:
    [blocker] = finalize_blockers([0, 1], _control(_fresh(0)), {}, NOW, MAX_AGE)
    assert blocker.startswith("broker 1 never announced migration mode")


def test_a_broker_whose_heartbeat_stopped_blocks() -> None:
    stale = Announcement(1, DUAL_WRITE, NOW - 600_000, NOW - 120_000)
    [blocker] = finalize_blockers([0, 1], _control(_fresh(0), stale), {}, NOW, MAX_AGE)
    assert "heartbeat is 120 s old" in blocker


def test_a_tbrlmm_write_after_the_last_node_started_blocks() -> None:
    [blocker] = finalize_blockers([0, 1], _control(_fresh(0), _fresh(1, started=NOW - 5000)), {7: NOW - 2000}, NOW,
                                  MAX_AGE)
    assert blocker.startswith("broker 7 wrote to the source topic as TopicBasedRemoteLogMetadataManager")
